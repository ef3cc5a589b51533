// Request validation and templating; see prompt.h.
#include "services/gateway/prompt.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"

namespace cascade::gateway {
namespace {

// Chunk kinds are cast between the wire and the tokenizer's template kinds.
#define CASCADE_SAME_KIND(tok, proto)                                                      \
  static_assert(                                                                           \
      static_cast<int>(tokenizer::ChunkKind::tok) == static_cast<int>(cascade::v2::proto), \
      "tokenizer::ChunkKind::" #tok " must equal cascade.v2." #proto)
CASCADE_SAME_KIND(kUnspecified, CHUNK_KIND_UNSPECIFIED);
CASCADE_SAME_KIND(kSystem, CHUNK_KIND_SYSTEM);
CASCADE_SAME_KIND(kContext, CHUNK_KIND_CONTEXT);
CASCADE_SAME_KIND(kQuery, CHUNK_KIND_QUERY);
CASCADE_SAME_KIND(kRaw, CHUNK_KIND_RAW);
CASCADE_SAME_KIND(kGenerationPrompt, CHUNK_KIND_GENERATION_PROMPT);
CASCADE_SAME_KIND(kAssistant, CHUNK_KIND_ASSISTANT);
#undef CASCADE_SAME_KIND

int64_t VocabSize(const tokenizer::Tokenizer& tok, const PromptLimits& limits) {
  return std::max<int64_t>(limits.vocab_size, tok.vocab_size());
}

}  // namespace

absl::Status CheckModel(const std::string& model, const PromptLimits& limits) {
  if (model.empty() || model == limits.model_name) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model: '", common::Excerpt(model),
                                                 "' is not served here; this gateway serves '",
                                                 limits.model_name, "'"));
}

size_t MaxRequestBytes(const PromptLimits& limits) {
  const int64_t stops = int64_t{limits.max_stop_strings} * (limits.max_stop_string_bytes + 8);
  const int64_t per_chunk = int64_t{limits.max_chunks} * 32;  // tags, lengths, kind
  return static_cast<size_t>(limits.max_prompt_bytes / 4 * 5 + stops + per_chunk + (64 << 10));
}

absl::StatusOr<Prompt> BuildPrompt(
    const google::protobuf::RepeatedPtrField<cascade::v2::Chunk>& chunks,
    const cascade::v2::SamplingParams& sampling, const std::string& cache_salt,
    bool add_generation_prompt, const tokenizer::Tokenizer& tok, const PromptLimits& limits,
    bool enable_thinking) {
  if (chunks.empty()) return absl::InvalidArgumentError("chunks: at least one chunk is required");
  if (chunks.size() > limits.max_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunks: ", chunks.size(), " chunks, at most ", limits.max_chunks));
  }
  // Sizes first, before anything is copied or tokenized: token ids count 4 bytes each (what
  // they take in memory), salts count too.
  int64_t bytes = 0, ids = 0;
  for (const auto& c : chunks) {
    bytes += static_cast<int64_t>(c.text().size() + c.cache_salt().size());
    ids += c.has_token_ids() ? c.token_ids().ids_size() : 0;
  }
  bytes += 4 * ids;
  if (bytes > limits.max_prompt_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("chunks: ", bytes, " bytes of text and token ids (4 bytes per id), at most ",
                     limits.max_prompt_bytes, " per request (--max_prompt_bytes)"));
  }
  if (ids > limits.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("chunks: ", ids,
                                                   " token ids, more than the "
                                                   "model's context length (",
                                                   limits.max_context, " tokens)"));
  }
  Prompt p;
  p.cache_salt = cache_salt;
  for (int i = 0; i < chunks.size(); ++i) {
    const cascade::v2::Chunk& c = chunks[i];
    const std::string field = absl::StrCat("chunks[", i, "]");
    if (c.kind() == cascade::v2::CHUNK_KIND_UNSPECIFIED ||
        !cascade::v2::ChunkKind_IsValid(c.kind())) {
      return absl::InvalidArgumentError(field +
                                        ".kind must be SYSTEM, CONTEXT, QUERY, RAW or ASSISTANT");
    }
    if (c.kind() == cascade::v2::CHUNK_KIND_GENERATION_PROMPT) {
      return absl::InvalidArgumentError(
          field + ".kind: GENERATION_PROMPT is added by the gateway (add_generation_prompt)");
    }
    PromptChunk pc;
    pc.kind = c.kind();
    pc.cache_salt = c.cache_salt();
    if (c.has_token_ids()) {
      if (c.token_ids().ids().empty())
        return absl::InvalidArgumentError(field + ".token_ids is empty");
      const int64_t vocab = VocabSize(tok, limits);
      for (int j = 0; j < c.token_ids().ids_size(); ++j) {
        const int32_t id = c.token_ids().ids(j);
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".token_ids[", j, "] = ", id, " is outside the vocabulary [0, ", vocab, ")"));
        }
      }
      pc.tokens.assign(c.token_ids().ids().begin(), c.token_ids().ids().end());
    } else {
      if (c.text().empty()) return absl::InvalidArgumentError(field + ".text is empty");
      if (!tokenizer::IsValidUtf8(c.text())) {
        return absl::InvalidArgumentError(field + ".text is not valid UTF-8");
      }
      tokenizer::Chunk tc{static_cast<tokenizer::ChunkKind>(c.kind()), c.text()};
      auto ids = tokenizer::EncodeChunks(tok, std::span(&tc, 1));
      if (!ids.ok())
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", ids.status().message()));
      pc.tokens = std::move((*ids)[0]);
    }
    p.num_tokens += static_cast<int64_t>(pc.tokens.size());
    p.chunks.push_back(std::move(pc));
  }
  if (add_generation_prompt) {
    tokenizer::Chunk gp{tokenizer::ChunkKind::kGenerationPrompt, "", enable_thinking};
    auto ids = tokenizer::EncodeChunks(tok, std::span(&gp, 1));
    if (!ids.ok()) return ids.status();
    p.chunks.push_back(
        PromptChunk{cascade::v2::CHUNK_KIND_GENERATION_PROMPT, std::move((*ids)[0]), ""});
    p.num_tokens += static_cast<int64_t>(p.chunks.back().tokens.size());
  }

  absl::StatusOr<engine::SamplingParams> parsed =
      worker::ParseSampling(sampling, static_cast<int32_t>(VocabSize(tok, limits)),
                            static_cast<int32_t>(limits.max_context), limits.default_max_tokens);
  if (!parsed.ok()) return parsed.status();
  p.sampling = sampling;
  // Explicit, so the worker never applies another default and a resume can subtract from it.
  p.sampling.set_max_tokens(parsed->max_tokens);
  if (!p.sampling.has_seed()) {
    // The gateway picks the seed, so a stream resumed on another worker after a failure
    // continues with the same random stream (the sampler draws per position).
    static thread_local std::mt19937_64 rng(std::random_device{}());
    p.sampling.set_seed(rng());
  }
  p.sampling.clear_stop();  // the gateway matches stop strings; workers never see them
  if (p.num_tokens + parsed->max_tokens > limits.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt (", p.num_tokens, " tokens) plus sampling.max_tokens (", parsed->max_tokens,
        ") exceeds the model's context length (", limits.max_context, " tokens)"));
  }
  if (sampling.stop_size() > limits.max_stop_strings) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop: at most ", limits.max_stop_strings, " stop strings"));
  }
  for (int i = 0; i < sampling.stop_size(); ++i) {
    const std::string& s = sampling.stop(i);
    if (s.empty())
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop[", i, "] is empty"));
    if (static_cast<int>(s.size()) > limits.max_stop_string_bytes || !tokenizer::IsValidUtf8(s)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop[", i,
                                                     "] must be valid UTF-8 of at most ",
                                                     limits.max_stop_string_bytes, " bytes"));
    }
    p.stop.push_back(s);
  }
  return p;
}

cascade::v2::WorkerServiceGenerateRequest ToWorkerRequest(const Prompt& p,
                                                          const std::string& request_id,
                                                          const std::string& model) {
  cascade::v2::WorkerServiceGenerateRequest r;
  r.set_request_id(request_id);
  r.set_model(model);
  r.set_cache_salt(p.cache_salt);
  for (const PromptChunk& c : p.chunks) {
    auto* wc = r.add_chunks();
    wc->set_kind(static_cast<cascade::v2::ChunkKind>(c.kind));
    wc->mutable_token_ids()->Assign(c.tokens.begin(), c.tokens.end());
    wc->set_cache_salt(c.cache_salt);
  }
  *r.mutable_sampling() = p.sampling;
  return r;
}

}  // namespace cascade::gateway
