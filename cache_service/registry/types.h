// Plain value types of the chunk registry, shared by the core, the gRPC service (which translates
// them to and from cascade.v2 messages) and RegistryClient. No gRPC or protobuf here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/chunk_hash.h"

namespace cascade::registry {

using hash::Hash128;

// A prompt to resolve. Views only: the caller keeps the model, salts and tokens alive for the
// duration of the call (the service points them into the request message, no copies).
// A worker's KV memory tier (cascade.v2.KvTier values; unspecified reads as kGpu).
enum class KvTier : int32_t { kGpu = 1, kHost = 2 };

struct ResolveInput {
  std::string_view model;
  std::string_view cache_salt;              // request-level salt
  std::span<const hash::ChunkSpec> chunks;  // in prompt order
};

// A worker's load at its last heartbeat.
struct WorkerLoad {
  int32_t running = 0;         // sequences decoding or prefilling
  int32_t waiting = 0;         // sequences waiting for admission
  int64_t free_kv_blocks = 0;  // unreferenced cached blocks count as free
  int64_t total_kv_blocks = 0;
};

struct ResolvedChunk {
  Hash128 hash;       // chained hash, equal to hash::PlaceChunks
  int64_t start = 0;  // first global position
  int64_t end = 0;    // one past the last
};

// How much of a prompt one live worker holds.
struct WorkerMatch {
  std::string worker_id;
  std::string address;
  int32_t matched_chunks = 0;  // leading chunks whose every token it holds
  int64_t matched_tokens = 0;  // leading tokens it holds (may end inside a chunk)
  WorkerLoad load;
  int64_t matched_host_tokens = 0;  // of matched_tokens, those only in its host KV tier
  std::string kv_numerics;          // as registered (WorkerInfo::kv_numerics)
  int32_t block_size = 0;           // as registered (WorkerInfo::block_size); 0: unknown
};

struct ResolveResult {
  std::vector<ResolvedChunk> chunks;  // one per input chunk, in order
  std::vector<WorkerMatch> workers;   // live workers of the model, best match first
};

// What a worker says about itself when it registers.
struct WorkerInfo {
  std::string worker_id;  // 1..128 of [A-Za-z0-9._:@-]
  std::string address;    // host:port of its Worker service
  std::string model;
  int64_t kv_capacity_blocks = 0;
  int32_t block_size = 0;  // tokens per KV block, > 0
  int64_t max_context = 0;
  int32_t vocab_size = 0;
  // Backend::KvNumerics(): the settings that fix a KV block's bits; workers of different numerics
  // never exchange blocks. Empty: unknown (an older worker). At most 128 printable ASCII.
  std::string kv_numerics;
};

struct RegisterResult {
  int64_t lease_ms = 0;        // heartbeat well within it
  std::string registry_epoch;  // changes on every registry start
};

struct HeartbeatResult {
  std::string registry_epoch;
  std::vector<Hash128> pinned_hashes;  // pinned chunks this worker holds: keep them
  std::vector<Hash128> evict_hashes;   // chunks an admin evicted: drop them
};

// What a worker holds of one chunk. `held_tokens` counts the leading prompt tokens up to the
// chunk's end that the worker holds in full KV blocks; the chunk is fully held when it equals
// `end`. A chunk ending inside a KV block is therefore at most partly held on its own.
struct HeldChunk {
  Hash128 hash;
  int64_t start = 0;
  int64_t end = 0;
  int64_t held_tokens = 0;
  Hash128 parent_hash;         // zero for a prompt's first chunk
  int32_t kind = 0;            // cascade.v2.ChunkKind value
  KvTier tier = KvTier::kGpu;  // where its last held block is
};

struct ChunkEvent {
  enum class Type { kStored, kEvicted };
  Type type = Type::kStored;
  HeldChunk chunk;
};

struct ReportResult {
  bool resync_required = false;  // the worker must call Resync with everything it holds
  uint64_t applied_seq = 0;      // last batch applied
};

// Admin views.
struct ChunkHolder {
  std::string worker_id;
  int64_t held_tokens = 0;
  KvTier tier = KvTier::kGpu;
};

struct ChunkRecord {
  Hash128 hash;
  Hash128 parent_hash;
  int64_t start = 0;
  int64_t end = 0;
  int32_t kind = 0;
  std::vector<ChunkHolder> holders;
  int64_t pinned_until_ms = 0;  // unix ms; 0 when not pinned (or the pin expired)
  int64_t last_used_ms = 0;     // unix ms of the last resolve or report that touched it
};

struct WorkerRecord {
  WorkerInfo info;
  WorkerLoad load;
  int64_t lease_expires_ms = 0;
  int64_t chunks = 0;  // chunks it reports holding
  uint64_t applied_seq = 0;
};

struct RegistryStats {
  int64_t chunks = 0;   // chunks known now
  int32_t workers = 0;  // live workers
  int64_t resolves = 0;
  int64_t resolve_hits = 0;       // resolves whose first chunk some live worker held
  int64_t chunks_forgotten = 0;   // by the LRU cap
  int64_t resyncs_requested = 0;  // after event gaps
  int64_t leases_expired = 0;
  int64_t pinned_chunks = 0;
};

}  // namespace cascade::registry
