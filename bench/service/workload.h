// The load generator's prompts. Both workloads send a SYSTEM chunk of about the same length plus a
// short distinct QUERY, so they differ only in what the cache can reuse:
//   miss: every request's system chunk is distinct (a unique tag at its very start, so not even
//         its first KV block is shared);
//   hit:  every request shares one long system chunk; only the query is new.
// The cluster workload (llm-d's shape) is different: `customers` each own a system chunk and a
// long context chunk; a request picks a customer and adds a fresh query, so requests of one
// customer share its prefix and requests of different customers share nothing.
// Texts are deterministic in (seed, run tag, request index).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "cascade/v2/gateway.pb.h"

namespace cascade::bench {

enum class Workload { kMiss, kHit, kCustomers };

// "miss" / "hit" / "customers".
const char* WorkloadName(Workload w);

struct WorkloadOptions {
  int system_words = 600;  // words of the system chunk (about 1.5 tokens each with Qwen3's BPE)
  int query_words = 12;    // words of the query
  int max_tokens = 16;     // completion length (ignore_eos, so every request generates this many)
  uint64_t seed = 1;
  int customers = 16;     // the customers workload: how many
  int context_words = 0;  // the customers workload: words of each customer's context chunk
  // Distinguishes this run's prompts from an earlier run's against the same (warm) deployment.
  std::string run_tag;
};

// Makes requests. Thread-safe: the counter is atomic and everything else is read-only.
class PromptSource {
 public:
  explicit PromptSource(WorkloadOptions options);

  // A fresh request index, unique over the whole run (all phases).
  int64_t NextIndex() { return next_index_.fetch_add(1, std::memory_order_relaxed); }
  // The request with this index under `workload`: greedy, ignore_eos, max_tokens set.
  v2::GenerateRequest Make(Workload workload, int64_t index) const;
  // The customers workload's customer for request `index` (uniform, deterministic in the seed).
  int CustomerOf(int64_t index) const;
  // Pre-warms the hit workload's shared system chunk (pinned for `pin_ttl_seconds`).
  v2::RegisterChunkRequest WarmRequest(int64_t pin_ttl_seconds) const;

  const WorkloadOptions& options() const { return options_; }

 private:
  std::string SharedSystemText() const;
  std::string Words(uint64_t stream, int count) const;

  WorkloadOptions options_;
  std::atomic<int64_t> next_index_{0};
};

}  // namespace cascade::bench
