// Pieces of Registry shared by its .cc files: the per-worker state and request validation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cache_service/registry/registry.h"
#include "common/mutex.h"

namespace cascade::registry {

struct Registry::Worker {
  // Set at registration.
  WorkerInfo info;
  uint64_t incarnation = 0;

  // Guarded by Registry::workers_mu_ (read on every resolve, written by heartbeats).
  WorkerLoad load;
  int64_t lease_expires_ms = 0;
  std::vector<Hash128> pending_evict;  // admin evictions not yet sent in a heartbeat

  // Serializes this worker's batches, so sequence numbers apply in order.
  Mutex mu;
  uint64_t applied_seq ABSL_GUARDED_BY(mu) = 0;
  bool resync_pending ABSL_GUARDED_BY(mu) = false;
  bool dropped ABSL_GUARDED_BY(mu) = false;  // no more residency may be added
  // What it holds lives in the chunk table (ChunkTable::RemoveWorker, HeldCount), keyed by
  // `incarnation`: one copy, trimmed by the same LRU step that forgets a chunk, so a worker's
  // residency can never outgrow the table's cap.
};

namespace internal {

// This abseil build has its own string_view type; bridge std::string_view explicitly.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

inline constexpr size_t kMaxWorkerIdBytes = 128;
inline constexpr size_t kMaxModelBytes = 256;
inline constexpr size_t kMaxKvNumericsBytes = 128;
inline constexpr size_t kMaxSaltBytes = 1024;
inline constexpr int64_t kMaxPosition = int64_t{1} << 40;

absl::Status ValidateWorkerId(std::string_view id);
// `field` names the message in errors, e.g. "events[3].chunk".
absl::Status ValidateHeldChunk(const HeldChunk& c, std::string_view field);
absl::Status ValidateLoad(const WorkerLoad& load);
absl::Status ValidateWorkerInfo(const WorkerInfo& info);

}  // namespace internal
}  // namespace cascade::registry
