// The registry's chunk table: chunk hash -> positions, holders, pin and last use, plus the
// reverse index worker -> chunks it holds. Sharded by a mix of the hash's bits so that resolves
// from many gateway threads and event batches from many workers rarely meet on one mutex; each
// shard forgets its least recently used chunks past its share of the cap, and a forgotten
// chunk leaves its holders' index in the same step. Internal to cascade_registry_core.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "common/chunk_hash.h"
#include "common/mutex.h"

namespace cascade::registry {

// One worker incarnation holding a chunk. Incarnations (not ids) are stored, so a worker that
// re-registers under the same id never inherits entries of its previous life.
struct Holder {
  uint64_t worker = 0;
  int64_t held_tokens = 0;
  bool on_host = false;  // its last held block is in the worker's host KV tier
};
using HolderList = absl::InlinedVector<Holder, 4>;

// Immutable facts of a chunk (all determined by its chained hash).
struct ChunkMeta {
  hash::Hash128 parent;
  int64_t start = 0;
  int64_t end = 0;
  int32_t kind = 0;
};

// Hashes come from the network (workers report them), so they are not trusted to be uniform:
// sequential or crafted values must still spread over shards and hash-map slots. A 64-bit
// finalizer (splitmix64's) over both halves makes every input bit reach every output bit.
inline uint64_t MixHash128(const hash::Hash128& h) {
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
  };
  return mix(h.hi ^ mix(h.lo + 0x9e3779b97f4a7c15ULL));
}
struct MixedHash128Hasher {
  size_t operator()(const hash::Hash128& h) const { return static_cast<size_t>(MixHash128(h)); }
};

struct ChunkSnapshot {
  hash::Hash128 hash;
  ChunkMeta meta;
  HolderList holders;
  int64_t pinned_until_ms = 0;
  int64_t last_used_ms = 0;
};

class ChunkTable {
 public:
  // `max_chunks` is split evenly over `num_shards` (>= 1); since shard selection mixes every
  // bit of the hash, this approximates one global LRU that needs no global lock, whatever the
  // hashes look like.
  ChunkTable(int64_t max_chunks, int num_shards);
  ChunkTable(const ChunkTable&) = delete;
  ChunkTable& operator=(const ChunkTable&) = delete;

  // Marks `hash` used at `now_ms`, sets its facts to `meta` and appends its holders to
  // `*holders`. The resolve path: its `meta` is the registry's own placement of the chunk (the
  // hash chains the prefix, so it fixes the positions), and replaces what a worker's report put
  // there first (a worker's claim of start and end is not checked against the tokens).
  void Touch(const hash::Hash128& hash, const ChunkMeta& meta, int64_t now_ms, HolderList* holders);

  // Records that `holder.worker` holds `holder.held_tokens` of the chunk (inserting it if
  // unknown, which may make the LRU forget another chunk and with it every holder's record of
  // it). Does not refresh the chunk's LRU position: only resolves say a chunk is wanted.
  void UpsertHolder(const hash::Hash128& hash, const ChunkMeta& meta, Holder holder,
                    int64_t now_ms);
  // Removes `worker` from the chunk's holders; no-op if either is unknown.
  void RemoveHolder(const hash::Hash128& hash, uint64_t worker);
  bool HasHolder(const hash::Hash128& hash, uint64_t worker) const;
  // Removes `worker` from every chunk it holds: O(shards + its chunks), not O(table).
  void RemoveWorker(uint64_t worker);
  // Chunks `worker` holds that the table still knows (never more than the table's size).
  int64_t HeldCount(uint64_t worker) const;

  std::optional<ChunkSnapshot> Get(const hash::Hash128& hash) const;

  // Sets the pin deadline (0 clears it). Inserts the chunk from `meta_if_unknown` when given;
  // returns false when the chunk is unknown and no metadata was given.
  bool SetPin(const hash::Hash128& hash, int64_t until_ms, const ChunkMeta* meta_if_unknown,
              int64_t now_ms);

  // Forgets a chunk; returns its holders, or nullopt when it was unknown.
  std::optional<HolderList> Erase(const hash::Hash128& hash);

  // Calls `fn` for every chunk, one shard at a time (shard lock held: `fn` must not call back).
  void ForEach(const std::function<void(const ChunkSnapshot&)>& fn) const;

  int64_t size() const { return size_.load(std::memory_order_relaxed); }
  int64_t forgotten() const { return forgotten_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    ChunkMeta meta;
    HolderList holders;
    int64_t pinned_until_ms = 0;
    int64_t last_used_ms = 0;
    std::list<hash::Hash128>::iterator lru;  // position in Shard::lru
  };
  using HashSet = absl::flat_hash_set<hash::Hash128, MixedHash128Hasher>;
  struct Shard {
    mutable Mutex mu;
    absl::flat_hash_map<hash::Hash128, Entry, MixedHash128Hasher> map ABSL_GUARDED_BY(mu);
    std::list<hash::Hash128> lru ABSL_GUARDED_BY(mu);  // front = most recently used
    // worker -> this shard's chunks it holds; exactly the inverse of the entries' holders, so
    // it never outgrows the map.
    absl::flat_hash_map<uint64_t, HashSet> held_by ABSL_GUARDED_BY(mu);
  };

  Shard& ShardFor(const hash::Hash128& h) const { return shards_[MixHash128(h) % shards_.size()]; }
  // Finds or inserts; a new entry goes to the LRU front and may push the shard over its cap.
  Entry& FindOrInsert(Shard& s, const hash::Hash128& h, const ChunkMeta& meta, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void EnforceCap(Shard& s, const hash::Hash128& keep, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Drops `h` from the held_by index of each of `holders`.
  static void Unindex(Shard& s, const hash::Hash128& h, const HolderList& holders)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  static ChunkSnapshot Snapshot(const hash::Hash128& h, const Entry& e);

  // Set at construction.
  const int64_t per_shard_cap_;
  std::unique_ptr<Shard[]> shard_storage_;
  std::span<Shard> shards_;

  std::atomic<int64_t> size_{0};
  std::atomic<int64_t> forgotten_{0};
};

}  // namespace cascade::registry
