// libFuzzer target: a public request's bytes, as they arrive raw from gRPC, through the gateway's
// parsing (ParseRawRequest: wire-format UTF-8 check, then protobuf) and validation and prompt
// building (CheckModel, CheckIdField, BuildPrompt with the real Qwen3 tokenizer,
// ToWorkerRequest), the way reactors.cc and gateway_service.cc call them. Byte 0 picks the RPC:
// Generate, Chat, Tokenize, RegisterChunk. Properties: no crash or sanitizer report; an accepted
// prompt's token count is the sum of its chunks, every id is inside the vocabulary, the generation
// prompt is last when asked for, the worker request carries every token, and every refusal's
// message is bounded.
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cascade/v2/gateway.pb.h"
#include "common/bounded_text.h"
#include "google/protobuf/stubs/logging.h"
#include "services/gateway/prompt.h"
#include "services/gateway/raw_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace cascade::fuzz {
namespace {

namespace v2 = ::cascade::v2;
using gateway::BuildPrompt;
using gateway::CheckModel;
using gateway::ParseRawRequest;
using gateway::Prompt;
using gateway::PromptLimits;

PromptLimits Limits() {
  PromptLimits l;
  l.model_name = "qwen3";
  l.max_context = 4096;
  l.max_prompt_bytes = 64 << 10;
  return l;
}

void CheckPrompt(const Prompt& p, bool generation_prompt, const tokenizer::Tokenizer& tok) {
  int64_t n = 0;
  for (const gateway::PromptChunk& c : p.chunks) {
    n += static_cast<int64_t>(c.tokens.size());
    for (int32_t id : c.tokens) {
      FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "token id %d outside the vocabulary", id);
    }
  }
  FUZZ_CHECK(n == p.num_tokens, "num_tokens %lld != sum of chunks %lld",
             static_cast<long long>(p.num_tokens), static_cast<long long>(n));
  FUZZ_CHECK(!p.chunks.empty(), "an accepted prompt has no chunks");
  FUZZ_CHECK(!generation_prompt || p.chunks.back().kind == v2::CHUNK_KIND_GENERATION_PROMPT,
             "the generation prompt is not last");
  FUZZ_CHECK(p.num_tokens + p.sampling.max_tokens() <= Limits().max_context,
             "an accepted prompt exceeds the context");
  v2::WorkerServiceGenerateRequest w = gateway::ToWorkerRequest(p, "fuzz-request", "qwen3");
  FUZZ_CHECK(w.chunks_size() == static_cast<int>(p.chunks.size()), "worker request lost chunks");
  int64_t m = 0;
  for (const v2::WorkerChunk& c : w.chunks()) m += c.token_ids_size();
  FUZZ_CHECK(m == p.num_tokens, "worker request carries %lld of %lld tokens",
             static_cast<long long>(m), static_cast<long long>(p.num_tokens));
}

template <typename Msg>
absl::StatusOr<Msg> Parse(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  grpc::ByteBuffer raw(&slice, 1);
  return ParseRawRequest<Msg>(raw, gateway::MaxRequestBytes(Limits()));
}

// Every refusal names the problem in a bounded message (inputs are echoed as excerpts), and
// returns false so the caller stops there, as the service does.
bool Accepted(const absl::Status& s) {
  FUZZ_CHECK(s.message().size() <= kMaxMessageBytes, "error message of %zu bytes: %.200s",
             s.message().size(), std::string(s.message()).c_str());
  return s.ok();
}

void OneInput(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const tokenizer::Tokenizer& tok = Qwen3();
  const PromptLimits limits = Limits();
  const uint8_t rpc = data[0] % 4;
  ++data;
  --size;
  switch (rpc) {
    case 0: {  // Generate
      absl::StatusOr<v2::GenerateRequest> req = Parse<v2::GenerateRequest>(data, size);
      if (!Accepted(req.status()) || !Accepted(CheckModel(req->model(), limits)) ||
          !Accepted(common::CheckIdField("request_id", req->request_id()))) {
        return;
      }
      const bool gp = !req->has_add_generation_prompt() || req->add_generation_prompt();
      absl::StatusOr<Prompt> p =
          BuildPrompt(req->chunks(), req->sampling(), req->cache_salt(), gp, tok, limits);
      if (Accepted(p.status())) CheckPrompt(*p, gp, tok);
      return;
    }
    case 1: {  // Chat: one turn
      absl::StatusOr<v2::ChatRequest> req = Parse<v2::ChatRequest>(data, size);
      if (!Accepted(req.status()) || !Accepted(CheckModel(req->model(), limits)) ||
          !Accepted(common::CheckIdField("session_id", req->session_id()))) {
        return;
      }
      absl::StatusOr<Prompt> p =
          BuildPrompt(req->chunks(), req->sampling(), req->cache_salt(), true, tok, limits);
      if (Accepted(p.status())) CheckPrompt(*p, true, tok);
      return;
    }
    case 2: {  // Tokenize
      absl::StatusOr<v2::TokenizeRequest> req = Parse<v2::TokenizeRequest>(data, size);
      if (!Accepted(req.status()) || !Accepted(CheckModel(req->model(), limits))) return;
      if (req->chunks_size() == 0) {
        absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(req->text());
        if (Accepted(ids.status())) {
          for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "bad id %d", id);
        }
        return;
      }
      v2::SamplingParams none;
      none.set_max_tokens(1);
      const bool gp = !req->has_add_generation_prompt() || req->add_generation_prompt();
      absl::StatusOr<Prompt> p = BuildPrompt(req->chunks(), none, "", gp, tok, limits);
      if (Accepted(p.status())) CheckPrompt(*p, gp, tok);
      return;
    }
    default: {  // RegisterChunk
      absl::StatusOr<v2::RegisterChunkRequest> req = Parse<v2::RegisterChunkRequest>(data, size);
      if (!Accepted(req.status()) || !Accepted(CheckModel(req->model(), limits))) return;
      v2::SamplingParams none;
      none.set_max_tokens(1);
      absl::StatusOr<Prompt> p =
          BuildPrompt(req->chunks(), none, req->cache_salt(), false, tok, limits);
      if (Accepted(p.status())) CheckPrompt(*p, false, tok);
      return;
    }
  }
}

}  // namespace
}  // namespace cascade::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // parse failures are expected; keep the log quiet
  cascade::fuzz::Qwen3();                    // load once, before the first input is timed
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cascade::fuzz::OneInput(data, size);
  return 0;
}
