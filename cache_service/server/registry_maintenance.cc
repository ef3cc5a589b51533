// Sweeper and metrics publisher; see registry_maintenance.h.
#include "cache_service/server/registry_maintenance.h"

#include <algorithm>
#include <chrono>

namespace cascade::registry {

RegistryMaintenance::RegistryMaintenance(Registry* registry, common::MetricsRegistry* metrics,
                                         int64_t interval_ms, int64_t departed_series_ms)
    : registry_(registry),
      metrics_(metrics != nullptr ? *metrics : common::MetricsRegistry::Default()),
      interval_ms_(interval_ms > 0 ? interval_ms
                                   : std::max<int64_t>(10, registry->options().lease_ms / 4)),
      departed_series_ms_(std::max<int64_t>(0, departed_series_ms)) {}

RegistryMaintenance::~RegistryMaintenance() { Stop(); }

void RegistryMaintenance::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RegistryMaintenance::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void RegistryMaintenance::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (cv_.WaitFor(&mu_, std::chrono::milliseconds(interval_ms_),
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; })) {
        return;
      }
    }
    RunOnce();
  }
}

void RegistryMaintenance::RunOnce() {
  registry_->Sweep();
  RegistryStats s = registry_->GetStats();
  std::vector<WorkerRecord> workers = registry_->ListWorkers();
  MutexLock lock(&mu_);
  // Counters only go up: publish the growth since the last round.
  auto bump = [&](const char* name, const char* help, int64_t now, int64_t before) {
    metrics_.GetCounter(name, help)
        ->Increment(static_cast<double>(std::max<int64_t>(0, now - before)));
  };
  bump("cascade_registry_resolves_total", "Resolve calls answered.", s.resolves,
       published_.resolves);
  bump("cascade_registry_resolve_hits_total",
       "Resolves where some live worker held a leading part of the prompt.", s.resolve_hits,
       published_.resolve_hits);
  bump("cascade_registry_chunks_forgotten_total", "Chunks forgotten by the --max_chunks LRU cap.",
       s.chunks_forgotten, published_.chunks_forgotten);
  bump("cascade_registry_resyncs_requested_total", "Resyncs requested after event gaps.",
       s.resyncs_requested, published_.resyncs_requested);
  bump("cascade_registry_leases_expired_total", "Workers dropped at lease expiry.",
       s.leases_expired, published_.leases_expired);
  published_ = s;
  metrics_.GetGauge("cascade_registry_chunks", "Chunks known.")->Set(static_cast<double>(s.chunks));
  metrics_.GetGauge("cascade_registry_workers", "Live workers.")->Set(s.workers);
  metrics_.GetGauge("cascade_registry_pinned_chunks", "Chunks pinned now.")
      ->Set(static_cast<double>(s.pinned_chunks));
  metrics_.GetGauge("cascade_registry_resolve_hit_ratio", "resolve_hits / resolves since start.")
      ->Set(s.resolves > 0 ? static_cast<double>(s.resolve_hits) / s.resolves : 0.0);

  // Per-worker load. A departed worker's series read up=0 and zeros for departed_series_ms_ (so
  // a dashboard or alert sees it go), then are removed.
  absl::flat_hash_set<std::string> live;
  for (const WorkerRecord& w : workers) {
    common::Labels l = {{"worker", w.info.worker_id}, {"model", w.info.model}};
    metrics_.GetGauge("cascade_registry_worker_up", "1 while the worker holds a lease.", l)->Set(1);
    metrics_.GetGauge("cascade_registry_worker_running", "Running sequences.", l)
        ->Set(w.load.running);
    metrics_.GetGauge("cascade_registry_worker_waiting", "Waiting sequences.", l)
        ->Set(w.load.waiting);
    metrics_.GetGauge("cascade_registry_worker_free_kv_blocks", "Free KV blocks.", l)
        ->Set(static_cast<double>(w.load.free_kv_blocks));
    metrics_.GetGauge("cascade_registry_worker_chunks", "Chunks the worker reports holding.", l)
        ->Set(static_cast<double>(w.chunks));
    live.insert(w.info.worker_id + "\n" + w.info.model);
  }
  const Clock* clock =
      registry_->options().clock != nullptr ? registry_->options().clock : RealClock();
  const int64_t now = clock->NowMs();
  for (auto it = seen_workers_.begin(); it != seen_workers_.end();) {
    const std::string& key = it->first;
    if (live.contains(key)) {
      it->second = -1;
      ++it;
      continue;
    }
    if (it->second < 0) it->second = now;  // gone since this round
    const bool drop = now - it->second >= departed_series_ms_;
    size_t nl = key.find('\n');
    common::Labels l = {{"worker", key.substr(0, nl)}, {"model", key.substr(nl + 1)}};
    for (const char* name :
         {"cascade_registry_worker_up", "cascade_registry_worker_running",
          "cascade_registry_worker_waiting", "cascade_registry_worker_free_kv_blocks",
          "cascade_registry_worker_chunks"}) {
      if (drop) {
        metrics_.RemoveGauge(name, l);
      } else {
        metrics_.GetGauge(name, "", l)->Set(0);
      }
    }
    if (drop) {
      seen_workers_.erase(it++);
    } else {
      ++it;
    }
  }
  for (const std::string& key : live) seen_workers_.try_emplace(key, -1);
}

}  // namespace cascade::registry
