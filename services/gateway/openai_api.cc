// OpenAI JSON <-> cascade.v2; see openai_api.h. Every access to the body checks the JSON type
// first (nlohmann throws on a wrong type; a request must never reach a throw).
#include "services/gateway/openai_api.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"

namespace cascade::gateway::openai {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

// Reads an optional number field into `set`; a present field of another type is an error.
absl::Status Number(const json& body, const char* key,
                    const std::function<absl::Status(double)>& set) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(absl::StrCat(key, " must be a number"));
  const double v = it->get<double>();
  if (!std::isfinite(v)) return Bad(absl::StrCat(key, " must be finite"));
  return set(v);
}

absl::Status Integer(const json& body, const char* key,
                     const std::function<absl::Status(int64_t)>& set) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return Bad(absl::StrCat(key, " must be an integer"));
  return set(it->get<int64_t>());
}

absl::StatusOr<bool> Bool(const json& body, const char* key, bool fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Bad(absl::StrCat(key, " must be true or false"));
  return it->get<bool>();
}

absl::StatusOr<std::string> String(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Bad(absl::StrCat(key, " must be a string"));
  return it->get<std::string>();
}

// vLLM's chat_template_kwargs: Cascade renders Qwen3's chat template itself, so it takes the one
// variable that template reads from the request, enable_thinking (false: the generation prompt ends
// in an empty think block); any other key is refused by name rather than ignored.
absl::Status ChatTemplateKwargs(const json& body, cascade::v2::GenerateRequest* r) {
  auto it = body.find("chat_template_kwargs");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Bad("chat_template_kwargs must be an object");
  for (const auto& [key, value] : it->items()) {
    if (key != "enable_thinking") {
      return Bad(absl::StrCat("chat_template_kwargs.", common::Excerpt(key),
                              " is not supported (only enable_thinking)"));
    }
    if (!value.is_boolean())
      return Bad("chat_template_kwargs.enable_thinking must be true or false");
    r->set_enable_thinking(value.get<bool>());
  }
  return absl::OkStatus();
}

// Token ids from a JSON array of integers.
absl::Status TokenIds(const json& arr, const std::string& field, cascade::v2::TokenIds* out) {
  for (size_t i = 0; i < arr.size(); ++i) {
    if (!arr[i].is_number_integer())
      return Bad(absl::StrCat(field, "[", i, "] must be a token id"));
    const int64_t id = arr[i].get<int64_t>();
    if (id < 0 || id > INT32_MAX) return Bad(absl::StrCat(field, "[", i, "] is not a token id"));
    out->add_ids(static_cast<int32_t>(id));
  }
  if (out->ids().empty()) return Bad(field + " is empty");
  return absl::OkStatus();
}

absl::StatusOr<cascade::v2::ChunkKind> KindNamed(const std::string& name,
                                                 const std::string& field) {
  if (name == "system") return cascade::v2::CHUNK_KIND_SYSTEM;
  if (name == "context") return cascade::v2::CHUNK_KIND_CONTEXT;
  if (name == "query" || name == "user") return cascade::v2::CHUNK_KIND_QUERY;
  if (name == "raw") return cascade::v2::CHUNK_KIND_RAW;
  if (name == "assistant") return cascade::v2::CHUNK_KIND_ASSISTANT;
  return Bad(absl::StrCat(field, " must be system, context, query, raw or assistant, got '",
                          common::Excerpt(name), "'"));
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> ContentText(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Bad(field + " must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string pf = absl::StrCat(field, "[", i, "]");
    if (!part.is_object()) return Bad(pf + " must be an object");
    auto type = String(part, "type");
    if (!type.ok()) return type.status();
    if (*type != "text") {
      return Bad(absl::StrCat(pf, ".type '", common::Excerpt(*type),
                              "' is not supported; only text parts are"));
    }
    auto t = String(part, "text");
    if (!t.ok()) return t.status();
    text += *t;
  }
  return text;
}

// The vendor fields of a chunk-like object: "chunk_kind" and "cache_salt".
absl::Status VendorChunkFields(const json& obj, const std::string& field, cascade::v2::Chunk* c) {
  auto kind = String(obj, "chunk_kind");
  if (!kind.ok()) return kind.status();
  if (!kind->empty()) {
    auto k = KindNamed(*kind, field + ".chunk_kind");
    if (!k.ok()) return k.status();
    c->set_kind(*k);
  }
  auto salt = String(obj, "cache_salt");
  if (!salt.ok()) return salt.status();
  c->set_cache_salt(*salt);
  return absl::OkStatus();
}

absl::Status ChatMessages(const json& body, cascade::v2::GenerateRequest* r) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return Bad("messages must be a non-empty array");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(field + " must be an object");
    auto role = String(m, "role");
    if (!role.ok()) return role.status();
    auto* c = r->add_chunks();
    if (*role == "system" || *role == "developer") {
      c->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
    } else if (*role == "user") {
      c->set_kind(cascade::v2::CHUNK_KIND_QUERY);
    } else if (*role == "assistant") {
      c->set_kind(cascade::v2::CHUNK_KIND_ASSISTANT);
    } else {
      return Bad(absl::StrCat(field, ".role '", common::Excerpt(*role),
                              "' is not supported; use system, developer, user or assistant"));
    }
    if (m.contains("tool_calls") || m.contains("function_call")) {
      return Bad(field + ": tool calls are not supported");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) return Bad(field + ".content is required");
    auto text = ContentText(*content, field + ".content");
    if (!text.ok()) return text.status();
    c->set_text(*text);
    if (absl::Status s = VendorChunkFields(m, field, c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CompletionPrompt(const json& body, cascade::v2::GenerateRequest* r) {
  // Vendor extension: the prompt as Cascade chunks, each {"kind", "text" | "token_ids",
  // "cache_salt"}; the same chunks as a gRPC Generate.
  if (auto chunks = body.find("chunks"); chunks != body.end() && !chunks->is_null()) {
    if (body.contains("prompt")) return Bad("give prompt or chunks, not both");
    if (!chunks->is_array() || chunks->empty()) return Bad("chunks must be a non-empty array");
    for (size_t i = 0; i < chunks->size(); ++i) {
      const json& cj = (*chunks)[i];
      const std::string field = absl::StrCat("chunks[", i, "]");
      if (!cj.is_object()) return Bad(field + " must be an object");
      auto* c = r->add_chunks();
      auto kind = String(cj, "kind");
      if (!kind.ok()) return kind.status();
      auto k = KindNamed(kind->empty() ? "raw" : *kind, field + ".kind");
      if (!k.ok()) return k.status();
      c->set_kind(*k);
      if (auto ids = cj.find("token_ids"); ids != cj.end() && !ids->is_null()) {
        if (!ids->is_array()) return Bad(field + ".token_ids must be an array");
        if (absl::Status s = TokenIds(*ids, field + ".token_ids", c->mutable_token_ids());
            !s.ok()) {
          return s;
        }
      } else {
        auto text = String(cj, "text");
        if (!text.ok()) return text.status();
        c->set_text(*text);
      }
      auto salt = String(cj, "cache_salt");
      if (!salt.ok()) return salt.status();
      c->set_cache_salt(*salt);
    }
    return absl::OkStatus();
  }
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) return Bad("prompt is required (or the chunks extension)");
  // One prompt: a string or an array of token ids. A list: strings, or arrays of token ids.
  std::vector<const json*> prompts;
  const bool one = p->is_string() || (p->is_array() && !p->empty() && (*p)[0].is_number_integer());
  if (one) {
    prompts.push_back(&*p);
  } else if (p->is_array() && !p->empty()) {
    for (const json& e : *p) prompts.push_back(&e);
  } else {
    return Bad("prompt must be a string, an array of token ids, or a non-empty list of those");
  }
  if (prompts.size() > static_cast<size_t>(kMaxPrompts)) {
    return Bad(absl::StrCat("prompt lists at most ", kMaxPrompts, " prompts"));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json& e = *prompts[i];
    const std::string field = one ? "prompt" : absl::StrCat("prompt[", i, "]");
    auto* c = r->add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_RAW);
    if (e.is_string()) {
      c->set_text(e.get<std::string>());
    } else if (e.is_array() && !e.empty() && e[0].is_number_integer()) {
      if (absl::Status s = TokenIds(e, field, c->mutable_token_ids()); !s.ok()) return s;
    } else {
      return Bad(field + " must be a string or a non-empty array of token ids");
    }
  }
  return absl::OkStatus();
}

absl::Status Sampling(const json& body, Endpoint endpoint, cascade::v2::SamplingParams* s,
                      RequestMeta* meta) {
  using absl::OkStatus;
  absl::Status st;
  // Unsupported options are refused, not ignored: a client relying on one would get other output.
  if (auto n = body.find("n"); n != body.end() && !n->is_null()) {
    // (A float such as 2.0 is refused with the rest: OpenAI's n is an integer.)
    if (!n->is_number_integer() || n->get<int64_t>() < 1 || n->get<int64_t>() > kMaxChoices) {
      return Bad(absl::StrCat("n must be an integer from 1 to ", kMaxChoices));
    }
    meta->n = static_cast<int>(n->get<int64_t>());
  }
  if (auto b = body.find("best_of");
      b != body.end() && !b->is_null() && !(b->is_number_integer() && *b == 1)) {
    return Bad("best_of is not supported");
  }
  // vLLM's extras that would change the output where set: refused by name too.
  for (const auto& [key, fine] : {std::pair<const char*, json>{"skip_special_tokens", true},
                                  {"spaces_between_special_tokens", true}}) {
    if (auto v = body.find(key); v != body.end() && !v->is_null() && *v != fine) {
      return Bad(absl::StrCat(key, " other than ", fine.dump(), " is not supported"));
    }
  }
  for (const char* key :
       {"tools", "functions", "suffix", "response_format", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "truncate_prompt_tokens"}) {
    if (auto v = body.find(key); v != body.end() && !v->is_null() &&
                                 !(v->is_object() && v->empty()) &&
                                 !(v->is_array() && v->empty())) {
      return Bad(absl::StrCat(key, " is not supported"));
    }
  }
  // logit_bias: {"<token id>": bias in [-100, 100]} (the worker checks the ids against the
  // vocabulary, and the count).
  if (auto lb = body.find("logit_bias"); lb != body.end() && !lb->is_null()) {
    if (!lb->is_object()) return Bad("logit_bias must be an object of token ids to biases");
    auto* bias = s->mutable_logit_bias();
    for (const auto& [key, value] : lb->items()) {
      int32_t id = 0;
      if (key.empty() || key.size() > 10 ||
          key.find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(key, &id)) {
        return Bad(absl::StrCat("logit_bias: key \"", key.substr(0, 32),
                                "\" is not a token id (a non-negative integer)"));
      }
      if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
        return Bad(
            absl::StrCat("logit_bias: the bias of token ", id, " must be a number in [-100, 100]"));
      }
      (*bias)[id] = static_cast<float>(value.get<double>());
    }
  }
  if (!(st = Number(body, "temperature", [&](double v) {
          s->set_temperature(static_cast<float>(v));
          return OkStatus();
        })).ok())
    return st;
  if (!(st = Number(body, "top_p", [&](double v) {
          s->set_top_p(static_cast<float>(v));
          return OkStatus();
        })).ok())
    return st;
  if (!(st = Integer(body, "top_k", [&](int64_t v) {
          if (v < -1 || v > INT32_MAX) return Bad("top_k must be -1, 0 or positive");
          s->set_top_k(static_cast<int32_t>(v));
          return OkStatus();
        })).ok())
    return st;
  if (!(st = Number(body, "min_p", [&](double v) {
          s->set_min_p(static_cast<float>(v));
          return OkStatus();
        })).ok())
    return st;
  if (!(st = Number(body, "repetition_penalty", [&](double v) {
          s->set_repetition_penalty(static_cast<float>(v));
          return OkStatus();
        })).ok())
    return st;
  // OpenAI's penalties (the worker checks them as well).
  using Setter = void (cascade::v2::SamplingParams::*)(float);
  for (const auto& penalty :
       {std::pair<const char*, Setter>{"frequency_penalty",
                                       &cascade::v2::SamplingParams::set_frequency_penalty},
        std::pair<const char*, Setter>{"presence_penalty",
                                       &cascade::v2::SamplingParams::set_presence_penalty}}) {
    const char* key = penalty.first;  // (a lambda may not capture a structured binding in clang 14)
    const Setter set = penalty.second;
    if (!(st = Number(body, key, [&](double v) {
            if (!(v >= -2.0 && v <= 2.0)) return Bad(absl::StrCat(key, " must be in [-2, 2]"));
            (s->*set)(static_cast<float>(v));
            return OkStatus();
          })).ok())
      return st;
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!(st = Integer(body, key, [&](int64_t v) {
            // Past INT32_MAX is out of every model's context (and of the wire's int32); a value
            // past INT64_MAX arrives here wrapped, so the message does not echo it.
            if (v < 1 || v > INT32_MAX) {
              return Bad(absl::StrCat(key, " must be at least 1 and at most the context length"));
            }
            s->set_max_tokens(static_cast<int32_t>(v));
            return OkStatus();
          })).ok())
      return st;
  }
  // vLLM's min_tokens: stop ids and stop strings held off for the first min_tokens tokens (the
  // gateway's check against max_tokens names the field).
  if (!(st = Integer(body, "min_tokens", [&](int64_t v) {
          if (v < 0 || v > INT32_MAX)
            return Bad("min_tokens must be at least 0 and at most max_tokens");
          s->set_min_tokens(static_cast<int32_t>(v));
          return OkStatus();
        })).ok())
    return st;
  if (!(st = Integer(body, "seed", [&](int64_t v) {
          s->set_seed(static_cast<uint64_t>(v));
          return OkStatus();
        })).ok())
    return st;
  auto include_stop = Bool(body, "include_stop_str_in_output", false);
  if (!include_stop.ok()) return include_stop.status();
  s->set_include_stop_str_in_output(*include_stop);
  auto ignore_eos = Bool(body, "ignore_eos", false);
  if (!ignore_eos.ok()) return ignore_eos.status();
  s->set_ignore_eos(*ignore_eos);
  if (auto stop = body.find("stop"); stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      s->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return Bad(absl::StrCat("stop[", i, "] must be a string"));
        s->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return Bad("stop must be a string or an array of strings");
    }
  }
  if (auto ids = body.find("stop_token_ids"); ids != body.end() && !ids->is_null()) {
    if (!ids->is_array()) return Bad("stop_token_ids must be an array");
    cascade::v2::TokenIds t;
    if (!ids->empty()) {
      if (absl::Status e = TokenIds(*ids, "stop_token_ids", &t); !e.ok()) return e;
    }
    s->mutable_stop_token_ids()->Add(t.ids().begin(), t.ids().end());
    meta->stop_token_ids.assign(t.ids().begin(), t.ids().end());
  }
  // vLLM's prompt_logprobs: every prompt token's logprob from the second on, with its rank and
  // that many top tokens, in the whole response only (vLLM refuses it streamed).
  if (!(st = Integer(body, "prompt_logprobs", [&](int64_t v) {
          if (v < 0 || v > 20) {
            return Bad(absl::StrCat("prompt_logprobs must be in [0, 20], got ", v,
                                    " (-1, the whole vocabulary, is not supported)"));
          }
          if (meta->stream) return Bad("prompt_logprobs is not available with stream: true");
          s->set_prompt_logprobs(static_cast<int32_t>(v));
          meta->prompt_logprobs = static_cast<int>(v);
          return OkStatus();
        })).ok())
    return st;
  // Logprobs: completions take a count; chat takes a flag plus top_logprobs.
  if (endpoint == Endpoint::kCompletions) {
    if (!(st = Integer(body, "logprobs", [&](int64_t v) {
            if (v < 0 || v > 20) return Bad("logprobs must be in [0, 20]");
            s->set_logprobs(static_cast<int32_t>(v));
            meta->logprobs = true;
            return OkStatus();
          })).ok())
      return st;
  } else {
    auto want = Bool(body, "logprobs", false);
    if (!want.ok()) return want.status();
    meta->logprobs = *want;
    if (!(st = Integer(body, "top_logprobs", [&](int64_t v) {
            if (v < 0 || v > 20) return Bad("top_logprobs must be in [0, 20]");
            if (!*want) return Bad("top_logprobs needs logprobs: true");
            s->set_logprobs(static_cast<int32_t>(v));
            return OkStatus();
          })).ok())
      return st;
    // logprobs without top_logprobs: the sampled token's logprob only (our 0 asks for none).
    if (*want && s->logprobs() == 0) s->set_logprobs(1);
  }
  return OkStatus();
}

// A token's bytes: its text's UTF-8 bytes, or, for a token that is not UTF-8 alone, the bytes its
// text spells as "bytes:\xNN..." (Turn::LogprobText).
std::string TokenByteString(const std::string& text) {
  constexpr std::string_view kPrefix = "bytes:";
  if (text.size() > kPrefix.size() && text.compare(0, kPrefix.size(), kPrefix) == 0 &&
      (text.size() - kPrefix.size()) % 4 == 0) {
    std::string escaped;
    bool ok = true;
    for (size_t i = kPrefix.size(); ok && i < text.size(); i += 4) {
      const auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      };
      const int hi = hex(text[i + 2]), lo = hex(text[i + 3]);
      ok = text[i] == '\\' && text[i + 1] == 'x' && hi >= 0 && lo >= 0;
      if (ok) escaped.push_back(static_cast<char>(hi * 16 + lo));
    }
    if (ok) return escaped;
  }
  return text;
}

// Those bytes as OpenAI's chat logprobs `bytes` (an array of byte values).
json TokenBytes(const std::string& text) {
  json out = json::array();
  for (unsigned char c : TokenByteString(text)) out.push_back(static_cast<int>(c));
  return out;
}

// Characters (code points) in UTF-8 bytes: the bytes that do not continue a character. A
// character split over tokens counts once, at the token that holds its first byte.
int64_t Characters(std::string_view bytes) {
  int64_t n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
  return n;
}

// OpenAI's usage object.
json UsageJson(int64_t prompt, int64_t cached, int64_t completion) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace

absl::StatusOr<Translated> TranslateRequest(const json& body, Endpoint endpoint,
                                            const std::string& served_model,
                                            const Detokenize& detokenize) {
  if (!body.is_object()) return Bad("the request body must be a JSON object");
  Translated t;
  t.meta.endpoint = endpoint;
  auto model = String(body, "model");
  if (!model.ok()) return model.status();
  if (!model->empty() && *model != served_model) {
    return absl::NotFoundError(absl::StrCat("The model '", common::Excerpt(*model),
                                            "' does not exist; this server serves '", served_model,
                                            "'"));
  }
  t.request.set_model(served_model);
  auto stream = Bool(body, "stream", false);
  if (!stream.ok()) return stream.status();
  t.meta.stream = *stream;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) return Bad("stream_options must be an object");
    auto usage = Bool(*so, "include_usage", false);
    if (!usage.ok()) return usage.status();
    t.meta.include_usage = *usage;
  }
  auto salt = String(body, "cache_salt");
  if (!salt.ok()) return salt.status();
  t.request.set_cache_salt(*salt);
  auto id = String(body, "request_id");
  if (!id.ok()) return id.status();
  t.request.set_request_id(*id);
  if (endpoint == Endpoint::kChat) {
    if (absl::Status s = ChatMessages(body, &t.request); !s.ok()) return s;
    auto gen = Bool(body, "add_generation_prompt", true);
    if (!gen.ok()) return gen.status();
    t.request.set_add_generation_prompt(*gen);
    if (absl::Status s = ChatTemplateKwargs(body, &t.request); !s.ok()) return s;
  } else {
    if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
      return Bad("chat_template_kwargs applies to chat completions only");
    }
    if (absl::Status s = CompletionPrompt(body, &t.request); !s.ok()) return s;
    t.request.set_add_generation_prompt(false);
  }
  if (absl::Status s = Sampling(body, endpoint, t.request.mutable_sampling(), &t.meta); !s.ok()) {
    return s;
  }
  // A prompt list (CompletionPrompt made one chunk a prompt; the chunks extension is one
  // prompt): one request a prompt.
  if (endpoint == Endpoint::kCompletions && !body.contains("chunks") &&
      t.request.chunks_size() > 1) {
    google::protobuf::RepeatedPtrField<cascade::v2::Chunk> chunks;
    chunks.Swap(t.request.mutable_chunks());
    for (int i = 0; i < chunks.size(); ++i) {
      cascade::v2::GenerateRequest& r = i == 0 ? t.request : t.more_prompts.emplace_back(t.request);
      r.clear_chunks();
      *r.add_chunks() = chunks.Get(i);
    }
    t.meta.prompts = chunks.size();
    if (t.meta.prompts * t.meta.n > kMaxChoicesInAll) {
      return Bad(absl::StrCat("n (", t.meta.n, ") times the prompts (", t.meta.prompts,
                              ") is more than ", kMaxChoicesInAll, " choices"));
    }
  }
  auto echo = Bool(body, "echo", false);
  if (!echo.ok()) return echo.status();
  if (*echo) {
    if (endpoint == Endpoint::kChat) return Bad("echo is a /v1/completions option");
    if (t.meta.logprobs) {
      // The prompt's tokens get the logprobs the generated ones get (vLLM's echo).
      // (With prompt_logprobs too, the worker sends the larger count of top tokens; each list
      // takes its own.)
      t.meta.echo_logprobs = true;
      t.meta.echo_top = t.request.sampling().logprobs();
      const int32_t n = std::max(t.meta.echo_top, t.meta.prompt_logprobs);
      t.request.mutable_sampling()->set_prompt_logprobs(n);
      for (cascade::v2::GenerateRequest& r : t.more_prompts) {
        r.mutable_sampling()->set_prompt_logprobs(n);
      }
    }
    // Each prompt's text as given (raw chunks only: the chunks extension's other kinds are
    // wrapped in the chat template), a token-id prompt's as the tokenizer decodes it.
    auto texts = std::make_shared<std::vector<std::string>>();
    for (int i = 0; i < t.meta.prompts; ++i) {
      const cascade::v2::GenerateRequest& r = i == 0 ? t.request : t.more_prompts[i - 1];
      const std::string field = t.meta.prompts == 1 ? "prompt" : absl::StrCat("prompt[", i, "]");
      std::string text;
      for (const cascade::v2::Chunk& c : r.chunks()) {
        if (c.kind() != cascade::v2::CHUNK_KIND_RAW) {
          return Bad("echo needs raw chunks (a templated chunk's text is not the prompt's)");
        }
        if (!c.has_token_ids()) {
          text += c.text();
          continue;
        }
        if (detokenize == nullptr) {
          return Bad(absl::StrCat("echo of token ids (", field, ") is not available here"));
        }
        const auto& ids = c.token_ids().ids();
        absl::StatusOr<std::string> decoded =
            detokenize(std::span<const int32_t>(ids.data(), static_cast<size_t>(ids.size())));
        if (!decoded.ok()) {
          return Bad(
              absl::StrCat("echo: ", field, " does not decode (", decoded.status().message(), ")"));
        }
        text += *decoded;
      }
      texts->push_back(std::move(text));
    }
    t.meta.echo = std::move(texts);
  }
  return t;
}

std::string FinishReasonName(cascade::v2::FinishReason reason) {
  switch (reason) {
    case cascade::v2::FINISH_REASON_STOP:
    case cascade::v2::FINISH_REASON_STOP_STRING:
      return "stop";
    case cascade::v2::FINISH_REASON_LENGTH:
      return "length";
    case cascade::v2::FINISH_REASON_CANCELLED:
    case cascade::v2::FINISH_REASON_ERROR:
      return "abort";
    default:
      return "";
  }
}

cascade::v2::GenerateRequest ChoiceRequest(const Translated& t, int index) {
  const int n = std::max(1, t.meta.n), prompt = index / n;
  cascade::v2::GenerateRequest r =
      prompt == 0 ? t.request : t.more_prompts.at(static_cast<size_t>(prompt - 1));
  if (r.sampling().has_seed()) {  // (wraps past 2^64, as any seed arithmetic would)
    r.mutable_sampling()->set_seed(r.sampling().seed() + static_cast<uint64_t>(index % n));
  }
  return r;
}

ReasoningSplitter::Parts ReasoningSplitter::Add(std::string_view piece) {
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  Parts out;
  held_.append(piece);
  if (state_ == State::kStart) {
    if (held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return out;
    if (held_.compare(0, kOpen.size(), kOpen) == 0) {
      held_.erase(0, kOpen.size());
      state_ = State::kReasoning;
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      // Hold back the longest tail that could begin "</think>".
      size_t keep = std::min(held_.size(), kClose.size() - 1);
      while (keep > 0 && held_.compare(held_.size() - keep, keep, kClose, 0, keep) != 0) --keep;
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.reasoning = held_.substr(0, close);
    held_.erase(0, close + kClose.size());
    state_ = State::kContent;
  }
  out.content = std::move(held_);
  held_.clear();
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::Finish() {
  Parts out;
  (state_ == State::kReasoning ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

ResponseBuilder::ResponseBuilder(const RequestMeta& meta, std::string model, int64_t created_unix,
                                 int index, std::shared_ptr<std::string> shared_id)
    : meta_(meta),
      model_(std::move(model)),
      created_(created_unix),
      index_(index),
      id_(shared_id != nullptr ? std::move(shared_id) : std::make_shared<std::string>()) {
  if (meta_.endpoint == Endpoint::kChat) logprobs_ = json{{"content", json::array()}};
}

json ResponseBuilder::ChatDelta(const ReasoningSplitter::Parts& parts, bool force) {
  reasoning_ += parts.reasoning;
  content_ += parts.content;
  json delta = json::object();
  if (!parts.reasoning.empty()) delta["reasoning_content"] = parts.reasoning;
  if (!parts.content.empty() || (force && parts.reasoning.empty()))
    delta["content"] = parts.content;
  return delta.empty() ? json(nullptr) : delta;
}

json ResponseBuilder::Envelope(const char* object) const {
  return json{{"id", *id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseBuilder::Usage() const {
  return UsageJson(usage_.prompt_tokens(), usage_.cached_tokens(), usage_.completion_tokens());
}

json ResponseBuilder::LogprobsOf(const cascade::v2::TokenDelta& delta, int64_t text_offset) const {
  if (meta_.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const auto& e : delta.logprobs()) {
      json top = json::array();
      for (const auto& t : e.top()) {
        top.push_back(
            {{"token", t.text()}, {"logprob", t.logprob()}, {"bytes", TokenBytes(t.text())}});
      }
      content.push_back({{"token", e.sampled().text()},
                         {"logprob", e.sampled().logprob()},
                         {"bytes", TokenBytes(e.sampled().text())},
                         {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  return CompletionLogprobs(delta.logprobs(), &text_offset);
}

json ResponseBuilder::CompletionLogprobs(
    const google::protobuf::RepeatedPtrField<cascade::v2::LogprobEntry>& entries,
    int64_t* text_offset, int max_top) {
  // text_offset: where each token's text starts in the completion, in characters (OpenAI's
  // legacy field): the characters that start before the token (a token holding the later bytes
  // of a character split over tokens starts after that character).
  json tokens = json::array(), token_logprobs = json::array(), top = json::array();
  json offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(e.sampled().text());
    token_logprobs.push_back(e.sampled().logprob());
    offsets.push_back(*text_offset);
    *text_offset += Characters(TokenByteString(e.sampled().text()));
    json alts = json::object();
    for (int j = 0; j < e.top_size() && (max_top < 0 || j < max_top); ++j) {
      alts[e.top(j).text()] = e.top(j).logprob();
    }
    top.push_back(alts);
  }
  return json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

json ResponseBuilder::PromptLogprobEntry(const cascade::v2::LogprobEntry& e, int top) {
  // vLLM's form: {"<token id>": {"logprob", "rank", "decoded_token"}}, the prompt token first and
  // then the top ones, ranked 1, 2, ... (a top token that is the prompt token's own replaces it,
  // as vLLM's dict does).
  json entry = json::object();
  entry[std::to_string(e.sampled().token_id())] = {{"logprob", e.sampled().logprob()},
                                                   {"rank", e.rank()},
                                                   {"decoded_token", e.sampled().text()}};
  for (int j = 0; j < e.top_size() && j < top; ++j) {
    entry[std::to_string(e.top(j).token_id())] = {
        {"logprob", e.top(j).logprob()}, {"rank", j + 1}, {"decoded_token", e.top(j).text()}};
  }
  return entry;
}

void ResponseBuilder::AppendCompletionLogprobs(const json& from, json* into) {
  if (into->is_null())
    *into = json{{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const auto& e : from[k]) (*into)[k].push_back(e);
  }
}

const std::string& ResponseBuilder::EchoText() const {
  const size_t prompt = static_cast<size_t>(index_ / std::max(1, meta_.n));
  return meta_.echo->at(std::min(prompt, meta_.echo->size() - 1));
}

void ResponseBuilder::FlushPromptLogprobs(std::vector<json>* out) {
  if (!meta_.echo_logprobs || prompt_flushed_ || !started_) return;
  prompt_flushed_ = true;
  if (prompt_logprobs_.is_null()) return;
  if (!meta_.stream) {
    logprobs_ = prompt_logprobs_;  // the generated tokens' follow
    return;
  }
  json c = Envelope("text_completion");
  c["choices"] = json::array({{{"index", index_},
                               {"text", EchoText()},
                               {"logprobs", prompt_logprobs_},
                               {"finish_reason", nullptr}}});
  out->push_back(std::move(c));
}

std::vector<json> ResponseBuilder::OnEvent(const cascade::v2::GenerateResponse& ev) {
  std::vector<json> out;
  const bool chat = meta_.endpoint == Endpoint::kChat;
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  if (ev.has_start()) {
    started_ = true;
    if (id_->empty()) *id_ = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", ev.start().request_id());
    usage_.set_prompt_tokens(ev.start().prompt_tokens());
    usage_.set_cached_tokens(ev.start().cached_tokens());
    if (meta_.echo != nullptr && !chat) {  // the choice's text starts with its prompt's
      const std::string& p = EchoText();
      text_ = p + text_;
      text_characters_ += Characters(p);
      if (meta_.echo_logprobs) {
        // The prompt's first token (no logprob); the rest arrive as prompt_logprobs deltas. The
        // prompt's text goes out with them (FlushPromptLogprobs).
        const cascade::v2::TokenLogprob& first = ev.start().first_prompt_token();
        prompt_logprobs_ = json{{"tokens", json::array({first.text()})},
                                {"token_logprobs", json::array({nullptr})},
                                {"top_logprobs", json::array({nullptr})},
                                {"text_offset", json::array({0})}};
        prompt_characters_ = Characters(TokenByteString(first.text()));
      } else if (meta_.stream && !p.empty()) {
        json c = Envelope(object);
        c["choices"] = json::array(
            {{{"index", index_}, {"text", p}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
        out.push_back(std::move(c));
      }
    }
    if (chat && meta_.stream) {
      json c = Envelope(object);
      c["choices"] = json::array({{{"index", index_},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
      out.push_back(std::move(c));
    }
  }
  if (ev.has_delta() && ev.delta().prompt_logprobs_size() > 0 && !prompt_logprobs_.is_null()) {
    AppendCompletionLogprobs(
        CompletionLogprobs(ev.delta().prompt_logprobs(), &prompt_characters_, meta_.echo_top),
        &prompt_logprobs_);
  }
  if (ev.has_start() && meta_.prompt_logprobs >= 0) {
    vllm_prompt_logprobs_ = json::array({nullptr});  // the first prompt token has none
  }
  if (ev.has_delta() && meta_.prompt_logprobs >= 0) {
    for (const auto& e : ev.delta().prompt_logprobs()) {
      vllm_prompt_logprobs_.push_back(PromptLogprobEntry(e, meta_.prompt_logprobs));
    }
  }
  if (ev.has_delta() && (ev.delta().token_ids_size() > 0 || !ev.delta().text().empty())) {
    FlushPromptLogprobs(&out);
  }
  if (ev.has_delta()) {
    const auto& d = ev.delta();
    const int64_t text_offset = text_characters_;
    if (!chat) {  // (a chat's text goes to content_ and reasoning_ below)
      text_ += d.text();
      text_characters_ += Characters(d.text());
    }
    json lp = nullptr;
    if (meta_.logprobs && d.logprobs_size() > 0) {
      lp = LogprobsOf(d, text_offset);
      if (!meta_.stream) {
        if (chat) {
          for (auto& e : lp["content"]) logprobs_["content"].push_back(e);
        } else {
          AppendCompletionLogprobs(lp, &logprobs_);
        }
      }
    }
    // A chat delta: its text's content (and reasoning) parts; a held-back piece sends nothing
    // unless it carries logprobs.
    json delta = nullptr;
    if (chat) {
      delta = ChatDelta(
          meta_.reasoning ? splitter_.Add(d.text()) : ReasoningSplitter::Parts{"", d.text()},
          !lp.is_null());
    }
    const bool send = chat ? !delta.is_null() : !d.text().empty() || !lp.is_null();
    if (meta_.stream && send) {
      json c = Envelope(object);
      json choice = {{"index", index_}, {"logprobs", lp}, {"finish_reason", nullptr}};
      if (chat) {
        choice["delta"] = delta;
      } else {
        choice["text"] = d.text();
      }
      c["choices"] = json::array({choice});
      out.push_back(std::move(c));
    }
  }
  if (ev.has_finish()) {
    FlushPromptLogprobs(&out);
    if (chat && meta_.reasoning) {  // what the splitter held back
      json delta = ChatDelta(splitter_.Finish(), false);
      if (meta_.stream && !delta.is_null()) {
        json c = Envelope(object);
        c["choices"] = json::array({{{"index", index_},
                                     {"delta", delta},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
        out.push_back(std::move(c));
      }
    }
    finished_ = true;
    const cascade::v2::GenerateFinish& f = ev.finish();
    finish_reason_ = FinishReasonName(f.finish_reason());
    usage_ = f.usage();
    if (f.finish_reason() == cascade::v2::FINISH_REASON_STOP_STRING) {
      stop_reason_ = f.stop_reason();
    } else if (f.finish_reason() == cascade::v2::FINISH_REASON_STOP && f.has_stop_token_id() &&
               std::find(meta_.stop_token_ids.begin(), meta_.stop_token_ids.end(),
                         f.stop_token_id()) != meta_.stop_token_ids.end()) {
      stop_reason_ = f.stop_token_id();
    }
    if (meta_.stream) {
      json c = Envelope(object);
      json choice = {{"index", index_},
                     {"logprobs", nullptr},
                     {"finish_reason", finish_reason_},
                     {"stop_reason", stop_reason_}};
      if (chat) {
        choice["delta"] = json::object();
      } else {
        choice["text"] = "";
      }
      c["choices"] = json::array({choice});
      out.push_back(std::move(c));
    }
  }
  return out;
}

json ResponseBuilder::UsageChunk() const {
  json c =
      Envelope(meta_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  c["choices"] = json::array();
  c["usage"] = Usage();
  return c;
}

json ResponseBuilder::Final() const {
  const bool chat = meta_.endpoint == Endpoint::kChat;
  json r = Envelope(chat ? "chat.completion" : "text_completion");
  json choice = {{"index", index_},
                 {"logprobs", meta_.logprobs ? logprobs_ : json(nullptr)},
                 {"finish_reason", finish_reason_},
                 {"stop_reason", stop_reason_}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", content_}};
    if (meta_.reasoning) {
      choice["message"]["reasoning_content"] =
          reasoning_.empty() ? json(nullptr) : json(reasoning_);
    }
  } else {
    choice["text"] = text_;
  }
  // vLLM's prompt_logprobs: a completion choice's (its prompt's), a chat response's own.
  if (meta_.prompt_logprobs >= 0 && !chat) choice["prompt_logprobs"] = vllm_prompt_logprobs_;
  if (meta_.prompt_logprobs >= 0 && chat) r["prompt_logprobs"] = vllm_prompt_logprobs_;
  r["choices"] = json::array({choice});
  r["usage"] = Usage();
  return r;
}

namespace {

json CombinedUsage(const std::vector<const ResponseBuilder*>& choices, int n) {
  int64_t prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const cascade::v2::Usage& u = choices[i]->usage();
    if (i % static_cast<size_t>(std::max(1, n)) == 0) {  // a prompt's first choice
      prompt += u.prompt_tokens();
      cached += u.cached_tokens();
    }
    completion += u.completion_tokens();
  }
  return UsageJson(prompt, cached, completion);
}

}  // namespace

json CombinedFinal(const std::vector<const ResponseBuilder*>& choices, int n) {
  json r = choices.front()->Final();
  for (size_t i = 1; i < choices.size(); ++i) {
    r["choices"].push_back(choices[i]->Final()["choices"][0]);
  }
  r["usage"] = CombinedUsage(choices, n);
  return r;
}

json CombinedUsageChunk(const std::vector<const ResponseBuilder*>& choices, int n) {
  json c = choices.front()->UsageChunk();
  c["usage"] = CombinedUsage(choices, n);
  return c;
}

int HttpStatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

json ErrorBody(const absl::Status& s) {
  const int http = HttpStatusFor(s);
  std::string type = "server_error";
  json code = nullptr;
  if (http == 400) type = "invalid_request_error";
  if (http == 401) type = "authentication_error";
  if (http == 403) type = "permission_error";
  if (http == 404) {
    type = "invalid_request_error";
    code = "model_not_found";
  }
  if (http == 429) {
    type = "rate_limit_error";
    code = "rate_limit_exceeded";
  }
  return json{{"error",
               {{"message", common::CapStatusMessage(s.message())},
                {"type", type},
                {"param", nullptr},
                {"code", code}}}};
}

}  // namespace cascade::gateway::openai
