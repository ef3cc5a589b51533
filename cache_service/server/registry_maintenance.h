// Background upkeep of a registry server: sweeps expired leases and pins a few times per lease,
// and publishes the registry's counters and per-worker load as Prometheus metrics.
#pragma once

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "cache_service/registry/registry.h"
#include "common/metrics.h"
#include "common/mutex.h"

namespace cascade::registry {

class RegistryMaintenance {
 public:
  // `registry` and `metrics` are not owned and must outlive this; `metrics` may be null
  // (MetricsRegistry::Default()). `interval_ms` <= 0 means a quarter of the lease. A departed
  // worker's per-worker series read 0 (up 0) for `departed_series_ms` on the registry's clock,
  // then leave the exposition: worker ids that churn (a pod's name per restart) would otherwise
  // grow it, and every scrape, without bound.
  RegistryMaintenance(Registry* registry, common::MetricsRegistry* metrics, int64_t interval_ms,
                      int64_t departed_series_ms = kDefaultDepartedSeriesMs);
  static constexpr int64_t kDefaultDepartedSeriesMs = 10 * 60 * 1000;
  // Stops the thread.
  ~RegistryMaintenance();
  RegistryMaintenance(const RegistryMaintenance&) = delete;
  RegistryMaintenance& operator=(const RegistryMaintenance&) = delete;

  // Starts the thread; REQUIRES: called at most once.
  void Start();
  // One sweep + publish now (the thread calls this; tests may too). Thread-safe.
  void RunOnce();
  void Stop();

 private:
  void Loop();

  // Set at construction.
  Registry* const registry_;
  common::MetricsRegistry& metrics_;
  const int64_t interval_ms_;
  const int64_t departed_series_ms_;
  std::thread thread_;

  Mutex mu_;
  CondVar cv_;  // signalled by Stop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RegistryStats published_ ABSL_GUARDED_BY(mu_);  // counters as last published, for deltas
  // "worker\nmodel" of every worker with series: -1 while it is live, else when it was first
  // seen gone (registry clock, ms).
  absl::flat_hash_map<std::string, int64_t> seen_workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cascade::registry
