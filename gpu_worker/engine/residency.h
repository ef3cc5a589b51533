// Which prompt chunks this engine holds in its prefix cache, as the registry should see them:
// a chunk is held through the last full cached block inside it. Produces stored/evicted events
// and full snapshots for resync.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/sequence.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// Not thread-safe; the engine guards it.
class Residency {
 public:
  explicit Residency(int block_size) : block_size_(block_size) {}

  // Records what `seq`'s committed blocks now hold of its prompt chunks.
  void Update(Sequence& seq);
  // Drops chunks whose last held block was evicted.
  void OnEvicted(const std::vector<hash::Hash128>& block_keys);
  // The blocks moved to `tier` (offloaded to the host, restored to the GPU): chunks held through
  // them are stored again with that tier.
  void OnTier(const std::vector<hash::Hash128>& block_keys, KvTier tier);

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

 private:
  struct Entry {
    ChunkEvent info;
    std::vector<hash::Hash128> keys;  // blocks from the chunk's first to its last held one
  };
  void Forget(const hash::Hash128& chunk);

  const int block_size_;
  std::unordered_map<hash::Hash128, Entry, hash::Hash128Hasher> chunks_;
  // Last held block key -> chunks held through it.
  std::unordered_map<hash::Hash128, std::vector<hash::Hash128>, hash::Hash128Hasher> by_last_;
  std::vector<ChunkEvent> events_;
};

}  // namespace cascade::engine
