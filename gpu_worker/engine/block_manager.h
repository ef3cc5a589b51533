// Paged KV block pool with an exact prefix cache: fixed-size blocks, reference counts, a map
// from chained block keys to blocks, and LRU eviction of unreferenced cached blocks.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/chunk_hash.h"

namespace cascade::engine {

// Not thread-safe: owned by the engine and used from its step thread only.
//
// Invariants:
//  - a block is in exactly one of: the free list (ref 0, no key), the evictable LRU (ref 0,
//    has key), or in use (ref > 0, key or not);
//  - a cached block's ancestors (the blocks its key chains through) are cached too: sequences
//    release their blocks last-first, so an ancestor is always released no earlier than its
//    descendants and the LRU evicts descendants first. Admin eviction keeps this by evicting
//    unreferenced descendants with their ancestor.
class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  // Blocks that an allocation can take now: free plus evictable.
  int64_t NumAvailable() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t NumCached() const { return static_cast<int64_t>(by_key_.size()); }
  int64_t NumInUse() const { return num_blocks() - NumAvailable(); }

  // Length of the longest run of `keys` from the start that is cached. Takes no references.
  int CountCachedPrefix(std::span<const hash::Hash128> keys) const;

  // Takes a reference on the cached block for `key`. REQUIRES: the key is cached.
  int32_t AcquireCached(const hash::Hash128& key);

  // Takes a fresh block, evicting the least recently released cached block if the free list is
  // empty. Returns -1 when every block is in use.
  int32_t AllocateFresh();

  // Adds a reference to a block in use, or to a cached unreferenced one (leaving the LRU).
  // REQUIRES: the block is in use or cached (not on the free list).
  void AddRef(int32_t block);

  // Drops one reference; at zero a keyed block becomes evictable (most recent), an unkeyed one
  // free. Callers release a sequence's blocks last-first.
  void Release(int32_t block);

  // Registers the key of a block whose tokens' K/V are now written. `parent` is the key of the
  // previous block (zero for block 0). If the key is already cached on another block (two
  // sequences computed the same block at once), the existing mapping stays and this block
  // stays private. Returns true if this block now holds the key.
  bool Commit(int32_t block, const hash::Hash128& key, const hash::Hash128& parent);

  std::optional<int32_t> Lookup(const hash::Hash128& key) const;
  // The cached blocks of `key`'s chain, root first (following parent keys); empty if the chain
  // is broken (an ancestor is no longer cached).
  std::vector<int32_t> ChainBlocks(const hash::Hash128& key) const;
  bool IsCachedKey(const hash::Hash128& key) const { return by_key_.count(key) > 0; }

  // Drops the given keys and all their cached descendants from the cache where unreferenced.
  // Returns the number of blocks dropped.
  int64_t EvictKeys(std::span<const hash::Hash128> keys);

  // Keys dropped from the cache since the last call (LRU or admin eviction).
  std::vector<hash::Hash128> TakeEvictedKeys();

  int32_t RefCount(int32_t block) const { return ref_[block]; }

 private:
  struct KeyInfo {
    int32_t block;
    hash::Hash128 parent;
  };
  void DropKey(int32_t block);

  const int block_size_;
  std::vector<int32_t> ref_;                           // [num_blocks] reference counts
  std::vector<std::optional<hash::Hash128>> key_;      // [num_blocks] key when cached
  std::vector<int32_t> free_;                          // unkeyed, unreferenced blocks (stack)
  std::list<int32_t> lru_;                             // keyed, unreferenced; front = evict first
  std::vector<std::list<int32_t>::iterator> lru_pos_;  // [num_blocks] valid when in lru_
  std::vector<bool> in_lru_;
  std::unordered_map<hash::Hash128, KeyInfo, hash::Hash128Hasher> by_key_;
  std::vector<hash::Hash128> evicted_;
};

}  // namespace cascade::engine
