// The worker's Prometheus metrics under the names a vLLM user looks for (cascade: prefix),
// labelled by worker id, refreshed from the engine's counters after each step.
#pragma once

#include <string>

#include "common/metrics.h"
#include "gpu_worker/engine/types.h"
#include "gpu_worker/service/kv_transfer.h"

namespace cascade::worker {

class WorkerMetrics {
 public:
  WorkerMetrics(common::MetricsRegistry& r, const std::string& worker_id);
  // Publishes `s`; counters advance by the difference from the last call. Engine-thread only.
  void Update(const engine::EngineStats& s);
  // A peer fetch ended with `result` after bringing `bytes` (verified or not). Thread-safe.
  void CountFetch(FetchResult result, int64_t bytes);

 private:
  common::Gauge* running_;
  common::Gauge* waiting_;
  common::Gauge* kv_usage_;
  common::Gauge* kv_cached_;
  common::Counter* prefix_queries_;
  common::Counter* prefix_hits_;
  common::Counter* preemptions_;
  common::Gauge* pinned_blocks_;
  common::Counter* pins_refused_;
  common::Gauge* held_chunks_;
  common::Counter* held_chunks_displaced_;
  common::Counter* prompt_tokens_;
  common::Counter* generation_tokens_;
  common::Counter* gpu_hits_;  // prefix-cache hit tokens by tier
  common::Counter* host_hits_;
  common::Gauge* host_usage_;
  common::Counter* host_offloaded_;
  common::Counter* host_offloaded_ahead_;
  common::Counter* host_offload_waits_;
  common::Counter* host_offload_skipped_;
  common::Counter* host_restored_;
  common::Counter* fetches_[std::size(kAllFetchResults)];  // by FetchResult
  common::Counter* fetch_bytes_;
  common::Counter* peer_imported_;
  common::Counter* peer_exported_;
  common::Counter* steps_;  // engine steps: all, overlapped, speculated; rows dropped
  common::Counter* overlapped_steps_;
  common::Counter* speculated_steps_;
  common::Counter* speculated_rows_dropped_;
  engine::EngineStats last_;
};

}  // namespace cascade::worker
