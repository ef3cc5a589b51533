// libFuzzer target: an OpenAI API request body through the HTTP front's pure half (openai_api.h)
// the way openai_http.cc calls it. Byte 0 picks the route (/v1/completions or
// /v1/chat/completions), the rest is the body, parsed as the front parses it (nlohmann, no
// exceptions). An accepted body's choices then go through the gateway's prompt building
// (BuildPrompt with the real Qwen3 tokenizer, as the in-process Generate does), and responses are
// built from a scripted Generate stream for the body's meta (deltas of assorted UTF-8 text,
// logprobs in the gateway's forms, a finish) and serialized as the front sends them.
// Properties: no crash, sanitizer report or exception (an exception on the front's loop thread
// would end the gateway); a refusal is a bounded message whose OpenAI error body serializes; an
// accepted body asks for 1 to kMaxChoices choices of 1 to kMaxPrompts prompts (kMaxChoicesInAll
// at most), each choice's request is its prompt's with the seed moved by its index in the prompt;
// every response object serializes, holds the choices in order and counts each prompt once.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cascade/v2/gateway.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "services/gateway/openai_api.h"
#include "services/gateway/prompt.h"
#include "tests/fuzz/fuzz_util.h"

namespace cascade::fuzz {
namespace {

namespace v2 = ::cascade::v2;
namespace openai = ::cascade::gateway::openai;
using nlohmann::json;

constexpr char kModel[] = "qwen3";

gateway::PromptLimits Limits() {
  gateway::PromptLimits l;
  l.model_name = kModel;
  l.max_context = 4096;
  l.max_prompt_bytes = 64 << 10;
  return l;
}

// A refusal: bounded, and its OpenAI error body serializes (the front sends it as is).
void CheckRefusal(const absl::Status& s) {
  FUZZ_CHECK(s.message().size() <= kMaxMessageBytes, "error message of %zu bytes: %.200s",
             s.message().size(), std::string(s.message()).c_str());
  const std::string body = openai::ErrorBody(s).dump();
  FUZZ_CHECK(!body.empty(), "empty error body");
  const int http = openai::HttpStatusFor(s);
  FUZZ_CHECK(http >= 400 && http < 600, "error status %d", http);
}

// The Generate stream a worker could send back through the gateway: texts are valid UTF-8 (the
// gateway's text stream holds back split characters, and proto strings must be UTF-8), token
// texts in logprobs may be the "bytes:\xNN" form of a token that is not UTF-8 alone.
std::vector<v2::GenerateResponse> Script(int choice) {
  std::vector<v2::GenerateResponse> events(5);
  auto* start = events[0].mutable_start();
  start->set_request_id("req-" + std::to_string(choice));
  start->set_prompt_tokens(9);
  start->set_cached_tokens(choice == 0 ? 0 : 8);
  const char* texts[] = {"Hel", "lo \xc3\xa9\xe4\xb8\x80", ""};
  for (int d = 0; d < 3; ++d) {
    auto* delta = events[1 + d].mutable_delta();
    delta->set_text(texts[d]);
    delta->add_token_ids(7 + d);
    auto* e = delta->add_logprobs();
    e->mutable_sampled()->set_text(d == 2 ? "bytes:\\xe4\\xb8" : texts[d]);
    e->mutable_sampled()->set_logprob(-0.5f);
    auto* top = e->add_top();
    top->set_text("bytes:\\xZZ");
    top->set_logprob(-2.f);
  }
  auto* finish = events[4].mutable_finish();
  finish->set_finish_reason(choice % 2 == 0 ? v2::FINISH_REASON_LENGTH : v2::FINISH_REASON_STOP);
  finish->mutable_usage()->set_prompt_tokens(9);
  finish->mutable_usage()->set_completion_tokens(3);
  return events;
}

void CheckResponses(const openai::RequestMeta& meta) {
  auto id = std::make_shared<std::string>();
  std::vector<std::unique_ptr<openai::ResponseBuilder>> builders;
  std::vector<const openai::ResponseBuilder*> done;
  const int choices = meta.n * meta.prompts;
  for (int i = 0; i < choices; ++i) {
    builders.push_back(std::make_unique<openai::ResponseBuilder>(meta, kModel, 1700000000, i, id));
    for (const v2::GenerateResponse& e : Script(i)) {
      for (const json& chunk : builders.back()->OnEvent(e)) {
        FUZZ_CHECK(meta.stream, "a chunk for a request that is not streamed");
        FUZZ_CHECK(chunk["choices"].size() == 1 && chunk["choices"][0]["index"] == i,
                   "a chunk of choice %d names another", i);
        FUZZ_CHECK(!chunk.dump().empty(), "a chunk does not serialize");
      }
    }
    FUZZ_CHECK(builders.back()->finished(), "choice %d did not finish", i);
    done.push_back(builders.back().get());
  }
  const json whole = openai::CombinedFinal(done, meta.n);
  FUZZ_CHECK(whole["choices"].size() == static_cast<size_t>(choices), "%zu choices of %d",
             whole["choices"].size(), choices);
  for (int i = 0; i < choices; ++i) {
    FUZZ_CHECK(whole["choices"][static_cast<size_t>(i)]["index"] == i, "choice %d out of order", i);
  }
  FUZZ_CHECK(whole["usage"]["completion_tokens"] == 3 * choices, "usage miscounts the choices");
  FUZZ_CHECK(whole["usage"]["prompt_tokens"] == 9 * meta.prompts, "usage miscounts the prompts");
  FUZZ_CHECK(!whole.dump().empty() && !openai::CombinedUsageChunk(done, meta.n).dump().empty(),
             "a response does not serialize");
}

void OneInput(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const openai::Endpoint endpoint =
      data[0] % 2 == 0 ? openai::Endpoint::kCompletions : openai::Endpoint::kChat;
  const json body = json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return;  // the front answers "not valid JSON"
  absl::StatusOr<openai::Translated> t = openai::TranslateRequest(body, endpoint, kModel);
  if (!t.ok()) return CheckRefusal(t.status());
  const openai::RequestMeta& meta = t->meta;
  FUZZ_CHECK(meta.n >= 1 && meta.n <= openai::kMaxChoices, "n = %d accepted", meta.n);
  FUZZ_CHECK(meta.prompts >= 1 && meta.prompts <= openai::kMaxPrompts &&
                 meta.prompts * meta.n <= openai::kMaxChoicesInAll &&
                 t->more_prompts.size() == static_cast<size_t>(meta.prompts - 1),
             "%d prompts (%zu more) of %d choices accepted", meta.prompts, t->more_prompts.size(),
             meta.n);
  FUZZ_CHECK(t->request.chunks_size() > 0, "an accepted body has no prompt");
  for (int i : {0, meta.n - 1, meta.n * meta.prompts - 1}) {
    const v2::GenerateRequest r = openai::ChoiceRequest(*t, i);
    const v2::GenerateRequest& base =
        i / meta.n == 0 ? t->request : t->more_prompts[static_cast<size_t>(i / meta.n - 1)];
    FUZZ_CHECK(r.chunks_size() == base.chunks_size(), "choice %d lost prompt chunks", i);
    FUZZ_CHECK(
        r.sampling().has_seed() == base.sampling().has_seed() &&
            (!r.sampling().has_seed() ||
             r.sampling().seed() == base.sampling().seed() + static_cast<uint64_t>(i % meta.n)),
        "choice %d's seed is not its prompt's plus %d", i, i % meta.n);
  }
  // What the in-process Generate does with it (a refusal there is the gateway's 400).
  const bool gp = !t->request.has_add_generation_prompt() || t->request.add_generation_prompt();
  absl::StatusOr<gateway::Prompt> p = gateway::BuildPrompt(
      t->request.chunks(), t->request.sampling(), t->request.cache_salt(), gp, Qwen3(), Limits());
  if (!p.ok()) {
    CheckRefusal(p.status());
    return;
  }
  CheckResponses(meta);
}

}  // namespace
}  // namespace cascade::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // protobuf's parse warnings are expected input
  (void)cascade::fuzz::Qwen3();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cascade::fuzz::OneInput(data, size);
  return 0;
}
