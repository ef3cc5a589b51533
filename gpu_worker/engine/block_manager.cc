// Block pool and prefix cache; see block_manager.h for the invariants.
#include "gpu_worker/engine/block_manager.h"

#include <cassert>
#include <cstdint>
#include <unordered_set>

namespace cascade::engine {

BlockManager::BlockManager(int64_t num_blocks, int block_size, std::function<int64_t()> now_ms)
    : block_size_(block_size),
      now_ms_(std::move(now_ms)),
      ref_(num_blocks, 0),
      key_(num_blocks),
      hints_(num_blocks),
      last_use_(num_blocks, 0),
      uses_(num_blocks, 0),
      parent_(num_blocks),
      parent_block_(num_blocks, -1),
      evict_on_release_(num_blocks, false),
      children_(static_cast<size_t>(num_blocks)) {
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
  const int32_t b = it->second;
  AddRef(b);
  NoteUse(b);
  return b;
}

void BlockManager::NoteUse(int32_t block) {
  if (uses_[block] < INT32_MAX) ++uses_[block];
}

void BlockManager::MaybeCandidate(int32_t block) {
  if (ref_[block] == 0 && key_[block].has_value() && ChildCount(*key_[block]) == 0) {
    evictable_.Add(block, hints_[block], last_use_[block]);
  }
}

int32_t BlockManager::PickVictim() const {
  const int32_t b = evictable_.Pick(now_ms_ ? now_ms_() : 0);
  if (b >= 0 || num_unreferenced_ == 0) return b;
  for (int32_t i = 0; i < num_blocks(); ++i) {
    if (ref_[i] == 0 && key_[i].has_value()) return i;
  }
  return -1;
}

int32_t BlockManager::AllocateFresh() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = PickVictim();
    if (b < 0) return -1;
    evictable_.Remove(b);
    --num_unreferenced_;
    if (on_evict_) {
      on_evict_(b, *key_[b], parent_[b], hints_[b]);
    }
    DropKey(b);
  }
  ref_[b] = 1;
  uses_[b] = 0;
  if (on_reuse_) on_reuse_(b);
  return b;
}

void BlockManager::ForNextVictims(
    int64_t n, const std::function<bool(int32_t, const hash::Hash128&, const hash::Hash128&,
                                        const EvictionHints&)>& f) const {
  if (n <= 0) return;
  int64_t seen = 0;
  const int64_t now = now_ms_ ? now_ms_() : 0;
  evictable_.ForEachInOrder(now, [&](int32_t leaf) {
    for (int32_t b = leaf; b >= 0;) {
      const hash::Hash128& key = *key_[b];
      const hash::Hash128& parent = parent_[b];
      if (!f(b, key, parent, hints_[b]) || ++seen >= n) return false;
      // The parent is next if this block is its only cached child and nothing references or
      // retains it.
      if (parent.IsZero() || ChildCount(parent) != 1) break;
      const int32_t pb = ParentBlock(b);
      b = pb >= 0 && ref_[pb] == 0 && hints_[pb].retain_until_ms <= now ? pb : -1;
    }
    return true;
  });
}

void BlockManager::AddRef(int32_t block) {
  if (ref_[block] == 0) {
    // A cached block nobody references stops being evictable.
    assert(key_[block].has_value());
    evictable_.Remove(block);
    --num_unreferenced_;
  }
  ++ref_[block];
}

void BlockManager::Release(int32_t block) {
  assert(ref_[block] > 0);
  if (--ref_[block] > 0) return;
  if (key_[block].has_value()) {
    ++num_unreferenced_;
    last_use_[block] = ++tick_;
    if (evict_on_release_[block]) {
      const hash::Hash128 key = *key_[block];
      EvictKeys(std::span<const hash::Hash128>(&key, 1));
      return;
    }
    MaybeCandidate(block);
  } else {
    hints_[block] = EvictionHints{};
    free_.push_back(block);
  }
}

bool BlockManager::Commit(int32_t block, const hash::Hash128& key, const hash::Hash128& parent) {
  if (key_[block].has_value()) return *key_[block] == key;
  if (by_key_.count(key)) return false;
  key_[block] = key;
  by_key_.emplace(key, block);
  parent_[block] = parent;
  parent_block_[block] = -1;
  if (!parent.IsZero()) {
    children_.Add(parent, block);
    // The parent is no longer a leaf.
    if (auto p = by_key_.find(parent); p != by_key_.end()) {
      evictable_.Remove(p->second);
      parent_block_[block] = p->second;
    }
  }
  return true;
}

int32_t BlockManager::ParentBlock(int32_t block) const {
  const hash::Hash128& parent = parent_[block];
  const int32_t hint = parent_block_[block];
  // The hint holds while that block still holds the parent's key (keys are unique among cached
  // blocks); else (the parent was not cached at this block's commit, or was dropped and cached
  // again elsewhere) the index says.
  if (hint >= 0 && key_[hint].has_value() && *key_[hint] == parent) return hint;
  const auto p = by_key_.find(parent);
  return p == by_key_.end() ? -1 : p->second;
}

void BlockManager::RaiseHints(int32_t block, const EvictionHints& h) {
  hints_[block].Raise(h);
  if (evictable_.Contains(block)) evictable_.Add(block, hints_[block], last_use_[block]);
}

std::optional<int32_t> BlockManager::Lookup(const hash::Hash128& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> BlockManager::ChainBlocks(const hash::Hash128& key) const {
  std::vector<int32_t> chain;
  hash::Hash128 k = key;
  while (!k.IsZero()) {
    auto it = by_key_.find(k);
    if (it == by_key_.end()) return {};
    chain.push_back(it->second);
    k = parent_[it->second];
  }
  return {chain.rbegin(), chain.rend()};
}

void BlockManager::DropKey(int32_t block) {
  if (!key_[block].has_value()) return;
  const hash::Hash128 key = *key_[block];
  const hash::Hash128 parent = parent_[block];
  evicted_.push_back(key);
  by_key_.erase(key);
  key_[block].reset();
  hints_[block] = EvictionHints{};
  evict_on_release_[block] = false;
  if (parent.IsZero()) return;
  if (children_.Remove(parent, block) == 0) {
    // The parent became a leaf.
    if (const int32_t pb = ParentBlock(block); pb >= 0) MaybeCandidate(pb);
  }
}

int64_t BlockManager::EvictKeys(std::span<const hash::Hash128> keys,
                                std::vector<hash::Hash128>* covered) {
  // The keys, then their cached descendants breadth first through the child index.
  std::vector<hash::Hash128> doomed =
      children_.WithDescendants(keys, [&](int32_t b) -> const hash::Hash128& { return *key_[b]; });
  int64_t dropped = 0;
  // Descendants before their ancestors, so no parent is made a candidate only to be dropped.
  for (auto k = doomed.rbegin(); k != doomed.rend(); ++k) {
    auto it = by_key_.find(*k);
    if (it == by_key_.end()) continue;
    int32_t b = it->second;
    if (ref_[b] > 0) {  // in use: a live sequence still reads it; dropped at its release
      evict_on_release_[b] = true;
      continue;
    }
    evictable_.Remove(b);
    --num_unreferenced_;
    DropKey(b);
    free_.push_back(b);
    ++dropped;
  }
  if (covered != nullptr) *covered = std::move(doomed);
  return dropped;
}

std::vector<hash::Hash128> BlockManager::TakeEvictedKeys() {
  std::vector<hash::Hash128> out;
  out.swap(evicted_);
  return out;
}

}  // namespace cascade::engine
