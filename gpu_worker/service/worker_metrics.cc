// Worker metrics; see worker_metrics.h.
#include "gpu_worker/service/worker_metrics.h"

namespace cascade::worker {

WorkerMetrics::WorkerMetrics(common::MetricsRegistry& r, const std::string& id) {
  const common::Labels l = {{"worker", id}};
  running_ = r.GetGauge("cascade:num_requests_running", "Sequences in the running batch.", l);
  waiting_ = r.GetGauge("cascade:num_requests_waiting", "Sequences waiting for admission.", l);
  kv_usage_ = r.GetGauge("cascade:kv_cache_usage_perc",
                         "Fraction of KV blocks referenced by live sequences or pins (0-1).", l);
  kv_cached_ =
      r.GetGauge("cascade:kv_cache_cached_blocks", "KV blocks holding a prefix-cache key.", l);
  prefix_queries_ = r.GetCounter("cascade:prefix_cache_queries_total",
                                 "Prompt tokens looked up in the prefix cache.", l);
  prefix_hits_ = r.GetCounter("cascade:prefix_cache_hits_total",
                              "Prompt tokens found in the prefix cache.", l);
  preemptions_ = r.GetCounter("cascade:num_preemptions_total",
                              "Sequences preempted (freed and recomputed) for lack of KV.", l);
  pinned_blocks_ =
      r.GetGauge("cascade:kv_cache_pinned_blocks",
                 "KV blocks held by pinned chunks (at most --max_pinned_kv_fraction).", l);
  pins_refused_ = r.GetCounter(
      "cascade:pins_refused_total",
      "Chunk pins not taken because pinned blocks would pass --max_pinned_kv_fraction (a registry "
      "pin once, however often its renewals are refused).",
      l);
  held_chunks_ = r.GetGauge("cascade:held_chunks",
                            "Prompt chunks this worker reports to the registry as held.", l);
  held_chunks_displaced_ = r.GetCounter(
      "cascade:held_chunks_displaced_total",
      "Chunk records dropped (and withdrawn from the registry) because more chunks than the cap "
      "were held through one KV block: the same tokens under other chunk boundaries or kinds.",
      l);
  prompt_tokens_ =
      r.GetCounter("cascade:prompt_tokens_total", "Prompt tokens computed (prefill).", l);
  generation_tokens_ = r.GetCounter("cascade:generation_tokens_total", "Tokens generated.", l);
  const char* tier_help = "Prompt tokens found in the prefix cache, by the KV tier they came from.";
  gpu_hits_ = r.GetCounter("cascade:prefix_cache_tier_hits_total", tier_help,
                           {{"worker", id}, {"tier", "gpu"}});
  host_hits_ = r.GetCounter("cascade:prefix_cache_tier_hits_total", tier_help,
                            {{"worker", id}, {"tier", "host"}});
  host_usage_ = r.GetGauge("cascade:host_kv_cache_usage_perc",
                           "Fraction of the host KV tier's blocks holding a copy (0-1).", l);
  host_offloaded_ = r.GetCounter("cascade:host_kv_offloaded_blocks_total",
                                 "KV blocks copied GPU -> host as the GPU tier evicted them.", l);
  host_offloaded_ahead_ = r.GetCounter(
      "cascade:host_kv_offloaded_ahead_blocks_total",
      "Of the offloaded KV blocks, those copied ahead of their eviction (--host_kv_offload_ahead).",
      l);
  host_offload_waits_ = r.GetCounter(
      "cascade:host_kv_offload_waits_total",
      "Engine steps that waited on the GPU for KV blocks being copied to the host (evicted by "
      "their own schedule, or reused while an ahead copy still read them).",
      l);
  host_offload_skipped_ = r.GetCounter(
      "cascade:host_kv_offload_skipped_blocks_total",
      "KV blocks the GPU tier evicted without a host copy: not taken again while cached "
      "(--host_kv_offload_min_uses).",
      l);
  host_restored_ = r.GetCounter("cascade:host_kv_restored_blocks_total",
                                "KV blocks copied host -> GPU for prefix hits.", l);
  for (FetchResult f : kAllFetchResults) {
    fetches_[static_cast<size_t>(f)] = r.GetCounter(
        "cascade:peer_fetches_total",
        "Peer KV fetches by result: ok (used), or why the prompt was prefilled instead.",
        {{"worker", id}, {"result", std::string(FetchResultName(f))}});
  }
  fetch_bytes_ = r.GetCounter("cascade:peer_fetch_bytes_total",
                              "KV block bytes received from peers (verified or not).", l);
  peer_imported_ = r.GetCounter("cascade:peer_fetched_blocks_total",
                                "KV blocks fetched from peers and written into the host tier.", l);
  peer_exported_ =
      r.GetCounter("cascade:peer_served_blocks_total", "KV blocks sent to peers (FetchKv).", l);
  steps_ = r.GetCounter("cascade:engine_steps_total", "Engine steps (forward passes).", l);
  overlapped_steps_ =
      r.GetCounter("cascade:engine_overlapped_steps_total",
                   "Steps scheduled while the previous one ran (--overlap_schedule).", l);
  speculated_steps_ = r.GetCounter(
      "cascade:engine_speculated_steps_total",
      "Decode steps the GPU started behind the previous one before the host collected it "
      "(--speculative_launch).",
      l);
  speculated_rows_dropped_ = r.GetCounter(
      "cascade:engine_speculated_rows_dropped_total",
      "Rows of speculated steps whose sequence had ended meanwhile (computed, not used).", l);
}

void WorkerMetrics::CountFetch(FetchResult result, int64_t bytes) {
  fetches_[static_cast<size_t>(result)]->Increment();
  fetch_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::Update(const engine::EngineStats& s) {
  running_->Set(s.running);
  waiting_->Set(s.waiting);
  kv_usage_->Set(s.total_blocks > 0 ? static_cast<double>(s.used_blocks) / s.total_blocks : 0.0);
  kv_cached_->Set(static_cast<double>(s.cached_blocks));
  prefix_queries_->Increment(
      static_cast<double>(s.prefix_cache_queries - last_.prefix_cache_queries));
  prefix_hits_->Increment(static_cast<double>(s.prefix_cache_hits - last_.prefix_cache_hits));
  preemptions_->Increment(static_cast<double>(s.preemptions - last_.preemptions));
  pinned_blocks_->Set(static_cast<double>(s.pinned_blocks));
  pins_refused_->Increment(static_cast<double>(s.pins_refused - last_.pins_refused));
  held_chunks_->Set(static_cast<double>(s.held_chunks));
  held_chunks_displaced_->Increment(
      static_cast<double>(s.held_chunks_displaced - last_.held_chunks_displaced));
  prompt_tokens_->Increment(
      static_cast<double>(s.prompt_tokens_computed - last_.prompt_tokens_computed));
  generation_tokens_->Increment(static_cast<double>(s.generation_tokens - last_.generation_tokens));
  const int64_t host_hits = s.prefix_cache_hits_host - last_.prefix_cache_hits_host;
  host_hits_->Increment(static_cast<double>(host_hits));
  gpu_hits_->Increment(
      static_cast<double>(s.prefix_cache_hits - last_.prefix_cache_hits - host_hits));
  host_usage_->Set(s.host_total_blocks > 0
                       ? static_cast<double>(s.host_used_blocks) / s.host_total_blocks
                       : 0.0);
  host_offloaded_->Increment(
      static_cast<double>(s.host_offloaded_blocks - last_.host_offloaded_blocks));
  host_offloaded_ahead_->Increment(
      static_cast<double>(s.host_offloaded_ahead_blocks - last_.host_offloaded_ahead_blocks));
  host_offload_waits_->Increment(
      static_cast<double>(s.host_offload_waits - last_.host_offload_waits));
  host_offload_skipped_->Increment(
      static_cast<double>(s.host_offload_skipped_blocks - last_.host_offload_skipped_blocks));
  host_restored_->Increment(
      static_cast<double>(s.host_restored_blocks - last_.host_restored_blocks));
  peer_imported_->Increment(
      static_cast<double>(s.peer_imported_blocks - last_.peer_imported_blocks));
  peer_exported_->Increment(
      static_cast<double>(s.peer_exported_blocks - last_.peer_exported_blocks));
  steps_->Increment(static_cast<double>(s.steps - last_.steps));
  overlapped_steps_->Increment(static_cast<double>(s.overlapped_steps - last_.overlapped_steps));
  speculated_steps_->Increment(static_cast<double>(s.speculated_steps - last_.speculated_steps));
  speculated_rows_dropped_->Increment(
      static_cast<double>(s.speculated_rows_dropped - last_.speculated_rows_dropped));
  last_ = s;
}

}  // namespace cascade::worker
