// Deterministic prompt texts for the miss and hit workloads; see workload.h.
#include "bench/service/workload.h"

#include <array>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace cascade::bench {
namespace {

// Plain English words: each is one or two tokens, so a word count predicts the token count.
constexpr std::array<std::string_view, 48> kWords = {
    "the",    "cache",   "server",  "request", "answer",  "system",  "model",   "token",
    "prefix", "worker",  "gateway", "stream",  "latency", "memory",  "block",   "chunk",
    "reuse",  "compute", "shared",  "context", "prompt",  "query",   "engine",  "batch",
    "decode", "prefill", "graph",   "kernel",  "route",   "policy",  "tenant",  "salt",
    "length", "window",  "signal",  "health",  "metric",  "sample",  "result",  "reply",
    "user",   "assist",  "format",  "careful", "brief",   "precise", "helpful", "clear"};

// splitmix64: a small, good 64-bit mixer; enough to pick words.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kSharedStream = ~0ull;  // the hit workload's system text
// Word streams of the customers workload's texts, apart from the per-request streams 2i, 2i+1.
constexpr uint64_t kCustomerSystemStream = 1ull << 62;
constexpr uint64_t kCustomerContextStream = (1ull << 62) + (1ull << 40);

}  // namespace

const char* WorkloadName(Workload w) {
  switch (w) {
    case Workload::kMiss:
      return "miss";
    case Workload::kHit:
      return "hit";
    case Workload::kCustomers:
      return "customers";
  }
  return "unknown";
}

int PromptSource::CustomerOf(int64_t index) const {
  const int n = options_.customers > 0 ? options_.customers : 1;
  return static_cast<int>(Mix(options_.seed * 31 + static_cast<uint64_t>(index)) % n);
}

PromptSource::PromptSource(WorkloadOptions options) : options_(std::move(options)) {}

std::string PromptSource::Words(uint64_t stream, int count) const {
  std::string out;
  out.reserve(static_cast<size_t>(count) * 8);
  uint64_t state = Mix(options_.seed ^ Mix(stream));
  for (int i = 0; i < count; ++i) {
    state = Mix(state);
    if (i > 0) out += (i % 16 == 15) ? ". " : " ";
    out += kWords[state % kWords.size()];
  }
  out += ".";
  return out;
}

std::string PromptSource::SharedSystemText() const {
  return absl::StrCat("Run ", options_.run_tag, " shared. You are a ",
                      Words(kSharedStream, options_.system_words));
}

v2::GenerateRequest PromptSource::Make(Workload workload, int64_t index) const {
  v2::GenerateRequest req;
  req.set_request_id(
      absl::StrCat("loadgen-", options_.run_tag, "-", WorkloadName(workload), "-", index));
  v2::Chunk* system = req.add_chunks();
  system->set_kind(v2::CHUNK_KIND_SYSTEM);
  if (workload == Workload::kCustomers) {
    const auto c = static_cast<uint64_t>(CustomerOf(index));
    system->set_text(absl::StrCat("Run ", options_.run_tag, ", customer ", c, ". You are a ",
                                  Words(kCustomerSystemStream + c, options_.system_words)));
    if (options_.context_words > 0) {
      v2::Chunk* context = req.add_chunks();
      context->set_kind(v2::CHUNK_KIND_CONTEXT);
      context->set_text(absl::StrCat("Customer ", c, " documents: ",
                                     Words(kCustomerContextStream + c, options_.context_words)));
    }
  } else if (workload == Workload::kHit) {
    system->set_text(SharedSystemText());
  } else {
    // The distinct tag comes first so the chunk differs from its first KV block on.
    system->set_text(absl::StrCat("#", index, " run ", options_.run_tag, ". You are a ",
                                  Words(2 * static_cast<uint64_t>(index), options_.system_words)));
  }
  v2::Chunk* query = req.add_chunks();
  query->set_kind(v2::CHUNK_KIND_QUERY);
  query->set_text(absl::StrCat("Question ", index, ": ",
                               Words(2 * static_cast<uint64_t>(index) + 1, options_.query_words)));
  v2::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(0);
  s->set_max_tokens(options_.max_tokens);
  s->set_ignore_eos(true);
  return req;
}

v2::RegisterChunkRequest PromptSource::WarmRequest(int64_t pin_ttl_seconds) const {
  v2::RegisterChunkRequest req;
  v2::Chunk* system = req.add_chunks();
  system->set_kind(v2::CHUNK_KIND_SYSTEM);
  system->set_text(SharedSystemText());
  req.set_pin_ttl_seconds(pin_ttl_seconds);
  return req;
}

}  // namespace cascade::bench
