// The chunk registry core: chained chunk hashes and positions for a prompt, worker membership
// with leases, per-worker residency fed by numbered event batches, pins and admin views.
//
// Soft state by design: everything here is rebuilt from the workers within one lease after a
// restart (they re-register, see a new epoch, and Resync what they hold), and a stale answer is
// only a routing hint (the worker's own prefix cache decides what is reused), so nothing is
// written to disk and no restart can serve wrong KV.
//
// Thread safety: every method may be called from any number of threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_service/registry/chunk_table.h"
#include "cache_service/registry/clock.h"
#include "cache_service/registry/types.h"
#include "common/mutex.h"

namespace cascade::registry {

// Event batches are numbered 1..kMaxEventSeq. Capped so that every accepted sequence number has a
// successor: a Resync(seq = 2^64 - 1) used to leave a worker whose every later batch read as a
// repeat (dropped, answered OK). A worker sends one batch per heartbeat at most, so it never
// comes near 2^63.
inline constexpr uint64_t kMaxEventSeq = uint64_t{1} << 63;

struct RegistryOptions {
  int64_t lease_ms = 10'000;                 // a worker silent this long is dropped
  int64_t max_chunks = 1'000'000;            // tracked chunks; LRU forgetting past it
  int num_shards = 64;                       // chunk table shards (contention vs. LRU precision)
  int max_chunks_per_request = 1024;         // Resolve: chunks per request
  int64_t max_tokens_per_request = 1 << 20;  // Resolve: tokens over all chunks
  int max_events_per_batch = 65'536;         // ReportEvents: events per batch
  // Resync: chunks per call. A valid HeldChunk takes up to ~100 bytes on the wire, so 500k of
  // them (~50 MB) fit in the default 64 MiB gRPC message; at 1M a resync that large failed in the
  // transport (RESOURCE_EXHAUSTED from gRPC) instead of getting this cap's answer. The server
  // checks at start that this and max_events_per_batch fit in its --max_message_bytes.
  int max_resync_chunks = 500'000;
  int64_t max_pinned_chunks = 10'000;  // pins outstanding
  int64_t max_pin_ttl_s = 7 * 24 * 3600;
  // Registered workers. Resolve walks every worker of the model per chunk, partly under the
  // membership lock, so an unbounded count is a way to stall routing.
  int max_workers = 4096;
  Clock* clock = nullptr;  // not owned; RealClock() when null
};

class Registry {
 public:
  explicit Registry(const RegistryOptions& options);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Hashes and positions of the prompt's chunks (hash::PlaceChunks), every chunk recorded as
  // used now, and per live worker of `in.model` how much of the prompt it holds.
  // INVALID_ARGUMENT on a malformed request, RESOURCE_EXHAUSTED past the per-request caps.
  absl::StatusOr<ResolveResult> Resolve(const ResolveInput& in);

  // Joins (or re-joins) a worker. A re-join drops what the registry believed the previous
  // registration held: the worker must Resync. RESOURCE_EXHAUSTED for a new worker id when
  // `max_workers` live workers are registered (a known id may always register again).
  absl::StatusOr<RegisterResult> RegisterWorker(const WorkerInfo& info);
  // Renews the lease. NOT_FOUND when the worker is unknown or its lease already expired (it
  // must RegisterWorker again and Resync).
  absl::StatusOr<HeartbeatResult> Heartbeat(std::string_view worker_id, const WorkerLoad& load);
  // Applies batch `seq` (1, 2, ... after each registration or Resync(seq=n) -> n+1). A repeat
  // is ignored; a gap applies nothing and answers resync_required until the worker Resyncs.
  // The batch is validated whole before any event applies. INVALID_ARGUMENT for seq 0 or past
  // kMaxEventSeq.
  absl::StatusOr<ReportResult> ReportEvents(std::string_view worker_id, uint64_t seq,
                                            std::span<const ChunkEvent> events);
  // Replaces everything the worker holds; the next batch must carry `seq + 1`. Returns the
  // number of chunks recorded (at most the table's cap: the LRU forgets the rest).
  // INVALID_ARGUMENT when `seq` >= kMaxEventSeq (no batch could follow it).
  absl::StatusOr<int> Resync(std::string_view worker_id, std::span<const HeldChunk> chunks,
                             uint64_t seq);
  absl::Status DeregisterWorker(std::string_view worker_id);

  // Admin.
  // At most `limit` chunks (1..10000), most recently used first; only those `worker_id` holds
  // when it is non-empty. `*total` (optional) receives the number of chunks known.
  absl::StatusOr<std::vector<ChunkRecord>> ListChunks(int limit, std::string_view worker_id,
                                                      int64_t* total);
  absl::StatusOr<ChunkRecord> GetChunk(const Hash128& hash);
  // Pins a chunk for `ttl_s` seconds: its holders are told to keep it in every heartbeat.
  // `chunk_if_unknown` registers a chunk no worker has reported yet (the gateway's
  // RegisterChunk). Returns the pin deadline (unix ms).
  absl::StatusOr<int64_t> PinChunk(const Hash128& hash, int64_t ttl_s,
                                   const std::optional<HeldChunk>& chunk_if_unknown);
  absl::Status UnpinChunk(const Hash128& hash);
  // Forgets the chunk and tells each holder to evict it at its next heartbeat. Returns the
  // number of workers told.
  absl::StatusOr<int> EvictChunk(const Hash128& hash);
  std::vector<WorkerRecord> ListWorkers();
  RegistryStats GetStats();

  // Drops workers whose lease expired and pins that ran out. Operations also check leases as
  // they go, so this only reclaims memory; the server calls it a few times per lease.
  void Sweep();

  const std::string& epoch() const { return epoch_; }
  const RegistryOptions& options() const { return options_; }

 private:
  struct Worker;
  // Looks up a registered worker; drops it and answers NOT_FOUND when its lease has expired.
  absl::StatusOr<std::shared_ptr<Worker>> FindLiveWorker(std::string_view worker_id);
  // Removes the worker's residency. REQUIRES: `w` already removed from the membership maps.
  void DropResidency(Worker& w);
  // Moves every worker whose lease ran out by `now` from the membership into `expired` (their
  // residency is dropped after the lock, DropResidency).
  void TakeExpiredLocked(int64_t now, std::vector<std::shared_ptr<Worker>>* expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(workers_mu_);
  void ApplyHeld(Worker& w, const HeldChunk& c);
  void ApplyEvicted(Worker& w, const Hash128& h);
  // Maps holders (incarnations) to worker ids for admin views.
  std::vector<ChunkHolder> HolderIds(const HolderList& holders);
  ChunkRecord ToRecord(const ChunkSnapshot& s);

  // Set at construction.
  const RegistryOptions options_;
  Clock* const clock_;
  const std::string epoch_;
  ChunkTable chunks_;

  // Membership; a leaf lock (nothing else is acquired while it is held). Lock order otherwise:
  // Worker::mu, then a chunk table shard. Exclusive, not reader-writer: resolves hold it only
  // to copy a few workers, and glibc's reader-preferring rwlock could starve heartbeats (and
  // so expire leases) under a steady stream of resolves.
  Mutex workers_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(workers_mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Worker>> by_incarnation_
      ABSL_GUARDED_BY(workers_mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(workers_mu_) = 1;

  // Pinned hashes (the table entry holds the deadline too; this index keeps heartbeats O(pins)).
  Mutex pins_mu_;
  absl::flat_hash_map<Hash128, int64_t, MixedHash128Hasher> pins_ ABSL_GUARDED_BY(pins_mu_);

  std::atomic<int64_t> resolves_{0};
  std::atomic<int64_t> resolve_hits_{0};
  std::atomic<int64_t> resyncs_requested_{0};
  std::atomic<int64_t> leases_expired_{0};
};

}  // namespace cascade::registry
