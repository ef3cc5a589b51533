// Paged KV block pool with an exact prefix cache: fixed-size blocks, reference counts, a map
// from chained block keys to blocks, and tree-aware eviction of unreferenced cached blocks
// (eviction.h's order: priority, then least recently used, retention last).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/eviction.h"

namespace cascade::engine {

// Called when a cached block is evicted to be reused, before its key is dropped: the block's
// content is still the key's (the host tier copies it out). Not called for EvictKeys.
using EvictListener = std::function<void(int32_t block, const hash::Hash128& key,
                                         const hash::Hash128& parent, const EvictionHints& hints)>;
// Called for every block AllocateFresh hands out (from the free list or evicted), before the
// caller writes it: the engine orders the next step after a copy still reading the block.
using ReuseListener = std::function<void(int32_t block)>;

// Not thread-safe: owned by the engine and used from its step thread only.
//
// Invariants:
//  - a block is in exactly one of: the free list (ref 0, no key), cached and unreferenced
//    (ref 0, has key; evictable), or in use (ref > 0, key or not);
//  - eviction takes only leaves: unreferenced cached blocks whose key no cached block names as
//    its parent. So a block goes only after every cached block that extends it, and a cached
//    block's ancestors stay cached. (If no leaf is unreferenced but some cached block is, which
//    only a private duplicate's parent can be, that block is taken.)
class BlockManager {
 public:
  // `now_ms`: the clock retention is measured on (null: retention never holds a block).
  BlockManager(int64_t num_blocks, int block_size, std::function<int64_t()> now_ms = nullptr);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  // Blocks that an allocation can take now: free plus cached unreferenced.
  int64_t NumAvailable() const { return static_cast<int64_t>(free_.size()) + num_unreferenced_; }
  // Blocks on the free list: allocations take these before evicting a cached block.
  int64_t NumFree() const { return static_cast<int64_t>(free_.size()); }
  int64_t NumCached() const { return static_cast<int64_t>(by_key_.size()); }
  int64_t NumInUse() const { return num_blocks() - NumAvailable(); }

  void set_evict_listener(EvictListener listener) { on_evict_ = std::move(listener); }
  void set_reuse_listener(ReuseListener listener) { on_reuse_ = std::move(listener); }

  // The cached blocks that eviction would take next, about in order, up to n of them: f(block,
  // key, parent, hints) for each until f returns false. Each candidate leaf (in eviction order,
  // those still retained left out) comes with the run of its unreferenced ancestors that have no
  // other cached child, which become leaves as it goes (a finished prompt's chain goes tail
  // first). An estimate, not a promise: releases, hits and the ancestors' own recency may change
  // the order before the evictions come. Takes no references and changes nothing.
  void ForNextVictims(
      int64_t n,
      const std::function<bool(int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                               const EvictionHints& hints)>& f) const;

  // Length of the longest run of `keys` from the start that is cached. Takes no references.
  int CountCachedPrefix(std::span<const hash::Hash128> keys) const;

  // Takes a reference on the cached block for `key`. REQUIRES: the key is cached.
  int32_t AcquireCached(const hash::Hash128& key);

  // Takes a fresh block, evicting a cached unreferenced one (in eviction order) if the free list
  // is empty. Returns -1 when every block is in use.
  int32_t AllocateFresh();

  // Adds a reference to a block in use, or to a cached unreferenced one.
  // REQUIRES: the block is in use or cached (not on the free list).
  void AddRef(int32_t block);

  // Drops one reference; at zero a keyed block becomes evictable (most recently used), an
  // unkeyed one free, and one an eviction asked for while it was in use (EvictKeys) is dropped
  // and freed with its unreferenced cached descendants.
  void Release(int32_t block);

  // Registers the key of a block whose tokens' K/V are now written. `parent` is the key of the
  // previous block (zero for block 0). If the key is already cached on another block (two
  // sequences computed the same block at once), the existing mapping stays and this block
  // stays private. Returns true if this block now holds the key.
  bool Commit(int32_t block, const hash::Hash128& key, const hash::Hash128& parent);

  // Raises a block's eviction hints (the larger priority and retention win).
  void RaiseHints(int32_t block, const EvictionHints& hints);
  const EvictionHints& hints(int32_t block) const { return hints_[block]; }

  std::optional<int32_t> Lookup(const hash::Hash128& key) const;
  // The cached blocks of `key`'s chain, root first (following parent keys); empty if the chain
  // is broken (an ancestor is no longer cached).
  std::vector<int32_t> ChainBlocks(const hash::Hash128& key) const;
  bool IsCachedKey(const hash::Hash128& key) const { return by_key_.count(key) > 0; }

  // Drops the given keys and all their cached descendants from the cache where unreferenced.
  // Those in use are dropped when their last reference goes (Release), with whatever descendants
  // are cached by then: otherwise a block in use below a dropped ancestor stayed cached, though
  // no lookup could reach it, until LRU eviction found it. Returns the number of blocks dropped
  // now. If `covered` is not null, it receives the given keys and every cached descendant
  // (dropped or in use), for the host tier to erase below them. Costs O(keys + descendants),
  // found through the child index, not a pass over the cache.
  int64_t EvictKeys(std::span<const hash::Hash128> keys,
                    std::vector<hash::Hash128>* covered = nullptr);

  // Keys dropped from the cache since the last call (evicted or admin-evicted).
  std::vector<hash::Hash128> TakeEvictedKeys();

  int32_t RefCount(int32_t block) const { return ref_[block]; }

  // How often the block's content was taken again since it was last handed out (AllocateFresh):
  // prefix hits on it (AcquireCached) and restores into it (NoteUse; the content came back from
  // the host tier, so it was wanted twice). Saturates at INT32_MAX. The host tier's write policy
  // reads it (EngineOptions::host_offload_min_uses).
  int32_t Uses(int32_t block) const { return uses_[block]; }
  void NoteUse(int32_t block);

 private:
  void DropKey(int32_t block);
  // Makes `block` an eviction candidate if it is an unreferenced cached leaf.
  void MaybeCandidate(int32_t block);
  int32_t PickVictim() const;
  int64_t ChildCount(const hash::Hash128& key) const { return children_.Count(key); }
  // The block holding a cached block's parent key, -1 if none is cached (parent_block_ where it
  // still holds, else the index).
  int32_t ParentBlock(int32_t block) const;

  const int block_size_;
  const std::function<int64_t()> now_ms_;
  std::vector<int32_t> ref_;                       // [num_blocks] reference counts
  std::vector<std::optional<hash::Hash128>> key_;  // [num_blocks] key when cached
  std::vector<EvictionHints> hints_;               // [num_blocks]
  std::vector<uint64_t> last_use_;                 // [num_blocks] tick of the last release
  std::vector<int32_t> uses_;                      // [num_blocks] Uses()
  // [num_blocks] a cached block's parent key, and the block that held it when this one was
  // committed (-1: none; a hint, valid while that block still holds the key): ForNextVictims'
  // walk up a chain reads these instead of two hash lookups a block.
  std::vector<hash::Hash128> parent_;
  std::vector<int32_t> parent_block_;
  std::vector<bool> evict_on_release_;  // [num_blocks] EvictKeys met it in use
  std::vector<int32_t> free_;           // unkeyed, unreferenced blocks (stack)
  int64_t num_unreferenced_ = 0;        // keyed blocks with ref 0
  EvictionQueue evictable_;             // the unreferenced cached leaves
  uint64_t tick_ = 0;
  std::unordered_map<hash::Hash128, int32_t, hash::Hash128Hasher> by_key_;  // key -> block
  ChildIndex children_;  // parent key -> the blocks whose cached keys name it
  std::vector<hash::Hash128> evicted_;
  EvictListener on_evict_;
  ReuseListener on_reuse_;
};

}  // namespace cascade::engine
