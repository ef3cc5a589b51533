// Which prompt chunks this engine holds in its prefix cache, as the registry should see them:
// a chunk is held through the last full cached block inside it. Produces stored/evicted events
// and full snapshots for resync.
//
// Bounded per block: chunks held through the same last block hold the same KV (the same tokens
// under other chunk boundaries or kinds, or other tokens after that block), so a client could
// pile up any number of them over a few blocks. At most `max_chunks_per_block` unpinned chunks
// are recorded through one block; a new one displaces the least recently used, and the displaced
// chunk is withdrawn (an evicted event), so the registry never keeps a claim the worker dropped.
// Pinned chunks are never displaced (the engine caps pins). A chunk costs O(1) memory: its block
// keys are rebuilt from parent links shared by every chunk over the same blocks. Evicting a block
// costs O(chunks held through it).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/sequence.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// Not thread-safe; the engine guards it.
class Residency {
 public:
  // `record_events`: false when nothing takes the events (a worker without a registry), so they
  // are not queued. REQUIRES: block_size >= 1, max_chunks_per_block >= 1.
  Residency(int block_size, int max_chunks_per_block, bool record_events = true)
      : block_size_(block_size),
        max_chunks_per_block_(max_chunks_per_block),
        record_events_(record_events) {}

  // Records what `seq`'s committed blocks now hold of its prompt chunks; chunks already recorded
  // count as used now (the cap displaces the least recently used).
  void Update(Sequence& seq);
  // Drops chunks whose last held block was evicted.
  void OnEvicted(const std::vector<hash::Hash128>& block_keys);
  // The blocks moved to `tier` (offloaded to the host, restored to the GPU): chunks held through
  // them are stored again with that tier.
  void OnTier(const std::vector<hash::Hash128>& block_keys, KvTier tier);
  // Marks a chunk pinned (or no longer), recorded or not: a pinned chunk is never displaced.
  void SetPinned(const hash::Hash128& chunk, bool pinned);

  bool Contains(const hash::Hash128& chunk) const { return chunks_.count(chunk) > 0; }
  // Leading prompt tokens held through this chunk (0 if not held).
  int64_t HeldTokens(const hash::Hash128& chunk) const {
    auto it = chunks_.find(chunk);
    return it == chunks_.end() ? 0 : it->second.info.held_tokens;
  }
  // Keys of the blocks the chunk occupies (from the block holding its first token); empty if
  // unknown.
  std::vector<hash::Hash128> BlockKeysOf(const hash::Hash128& chunk) const;

  // Key of the last full block the chunk is held through; nullopt if unknown.
  std::optional<hash::Hash128> LastKeyOf(const hash::Hash128& chunk) const;

  std::vector<ChunkEvent> Held() const;
  std::vector<ChunkEvent> TakeEvents();

  // Chunks recorded now.
  int64_t size() const { return static_cast<int64_t>(chunks_.size()); }
  // Chunks held through `block_key` as their last block.
  int64_t ChunksThrough(const hash::Hash128& block_key) const;
  // Chunks displaced by the per-block cap since construction.
  int64_t displaced() const { return displaced_; }

 private:
  struct Entry {
    ChunkEvent info;
    hash::Hash128 last;      // key of the last held block
    int64_t num_blocks = 0;  // from the block holding the chunk's first token through `last`
    uint64_t last_use = 0;   // tick of the last Update that recorded or saw it
    bool pinned = false;     // which list of its block it is in
    size_t slot = 0;         // its index there
  };
  // The chunks held through one block (as their last one).
  struct Through {
    std::vector<hash::Hash128> unpinned;  // at most max_chunks_per_block_
    std::vector<hash::Hash128> pinned;
  };
  // A block key's parent, and how many recorded chunks span the key.
  struct Link {
    hash::Hash128 parent;
    int64_t refs = 0;
  };

  // Removes a chunk's record without an event.
  void Forget(const hash::Hash128& chunk);
  // Removes a chunk's record and queues its evicted event.
  void Withdraw(const hash::Hash128& chunk);
  // Withdraws the least recently used unpinned chunks through `block` until at most `keep`
  // unpinned ones are left.
  void Trim(const hash::Hash128& block, size_t keep);
  // Puts `chunk` (recorded as `e`) in its block's list for e.pinned, or takes it out.
  void AddToList(const hash::Hash128& chunk, Entry& e);
  void RemoveFromList(const hash::Hash128& chunk, const Entry& e);
  // Queues `ev` for TakeEvents (when events are recorded).
  void Emit(const ChunkEvent& ev);
  // Drops one reference from each of the `n` links from `last` back.
  void Unlink(const hash::Hash128& last, int64_t n);

  const int block_size_;
  const size_t max_chunks_per_block_;
  const bool record_events_;
  std::unordered_map<hash::Hash128, Entry, hash::Hash128Hasher> chunks_;
  // Last held block key -> chunks held through it.
  std::unordered_map<hash::Hash128, Through, hash::Hash128Hasher> by_last_;
  // Block key -> its parent, while a recorded chunk spans it.
  std::unordered_map<hash::Hash128, Link, hash::Hash128Hasher> links_;
  std::unordered_set<hash::Hash128, hash::Hash128Hasher> pinned_;
  std::vector<ChunkEvent> events_;
  uint64_t tick_ = 0;
  int64_t displaced_ = 0;
};

}  // namespace cascade::engine
