// Block pool and prefix cache; see block_manager.h for the invariants.
#include "gpu_worker/engine/block_manager.h"

#include <cassert>
#include <unordered_set>

namespace cascade::engine {

BlockManager::BlockManager(int64_t num_blocks, int block_size)
    : block_size_(block_size),
      ref_(num_blocks, 0),
      key_(num_blocks),
      lru_pos_(num_blocks),
      in_lru_(num_blocks, false) {
  free_.reserve(num_blocks);
  // Hand out low block ids first (stack pops from the back).
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int BlockManager::CountCachedPrefix(std::span<const hash::Hash128> keys) const {
  int n = 0;
  for (const hash::Hash128& k : keys) {
    if (!by_key_.count(k)) break;
    ++n;
  }
  return n;
}

int32_t BlockManager::AcquireCached(const hash::Hash128& key) {
  auto it = by_key_.find(key);
  assert(it != by_key_.end());
  int32_t b = it->second.block;
  if (in_lru_[b]) {
    lru_.erase(lru_pos_[b]);
    in_lru_[b] = false;
  }
  ++ref_[b];
  return b;
}

int32_t BlockManager::AllocateFresh() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    in_lru_[b] = false;
    DropKey(b);
  } else {
    return -1;
  }
  ref_[b] = 1;
  return b;
}

void BlockManager::AddRef(int32_t block) {
  if (ref_[block] == 0) {
    // A cached block nobody references: take it out of the evictable LRU.
    assert(in_lru_[block]);
    lru_.erase(lru_pos_[block]);
    in_lru_[block] = false;
  }
  ++ref_[block];
}

void BlockManager::Release(int32_t block) {
  assert(ref_[block] > 0);
  if (--ref_[block] > 0) return;
  if (key_[block].has_value()) {
    lru_pos_[block] = lru_.insert(lru_.end(), block);
    in_lru_[block] = true;
  } else {
    free_.push_back(block);
  }
}

bool BlockManager::Commit(int32_t block, const hash::Hash128& key, const hash::Hash128& parent) {
  if (key_[block].has_value()) return *key_[block] == key;
  if (by_key_.count(key)) return false;
  key_[block] = key;
  by_key_.emplace(key, KeyInfo{block, parent});
  return true;
}

std::optional<int32_t> BlockManager::Lookup(const hash::Hash128& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second.block;
}

std::vector<int32_t> BlockManager::ChainBlocks(const hash::Hash128& key) const {
  std::vector<int32_t> chain;
  hash::Hash128 k = key;
  while (!k.IsZero()) {
    auto it = by_key_.find(k);
    if (it == by_key_.end()) return {};
    chain.push_back(it->second.block);
    k = it->second.parent;
  }
  return {chain.rbegin(), chain.rend()};
}

void BlockManager::DropKey(int32_t block) {
  if (!key_[block].has_value()) return;
  evicted_.push_back(*key_[block]);
  by_key_.erase(*key_[block]);
  key_[block].reset();
}

int64_t BlockManager::EvictKeys(std::span<const hash::Hash128> keys) {
  // Collect the keys and, by repeated passes over the parent links, their cached descendants.
  std::unordered_set<hash::Hash128, hash::Hash128Hasher> doomed(keys.begin(), keys.end());
  bool grew = true;
  while (grew) {
    grew = false;
    for (const auto& [k, info] : by_key_) {
      if (!doomed.count(k) && doomed.count(info.parent)) {
        doomed.insert(k);
        grew = true;
      }
    }
  }
  int64_t dropped = 0;
  for (const hash::Hash128& k : doomed) {
    auto it = by_key_.find(k);
    if (it == by_key_.end()) continue;
    int32_t b = it->second.block;
    if (ref_[b] > 0) continue;  // in use: a live sequence still reads it
    lru_.erase(lru_pos_[b]);
    in_lru_[b] = false;
    DropKey(b);
    free_.push_back(b);
    ++dropped;
  }
  return dropped;
}

std::vector<hash::Hash128> BlockManager::TakeEvictedKeys() {
  std::vector<hash::Hash128> out;
  out.swap(evicted_);
  return out;
}

}  // namespace cascade::engine
