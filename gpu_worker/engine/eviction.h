// The eviction order both KV tiers (GPU blocks, host copies) share: lowest priority first, then
// least recently used; entries still inside their retention time go last. The tiers add only
// candidates that no cached entry extends (leaves of the prefix tree), so a block is evicted
// after the blocks that extend it; ChildIndex is how they know which entries extend a key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/chunk_hash.h"

namespace cascade::engine {

// How strongly a block should be kept, set per chunk by RegisterChunk (priority,
// retention_seconds) and carried with the block between tiers. The larger of two hints wins.
struct EvictionHints {
  int32_t priority = 0;         // lower is evicted first
  int64_t retain_until_ms = 0;  // on the engine's clock; before it, evicted only if nothing else
                                // can be

  void Raise(const EvictionHints& o) {
    if (o.priority > priority) priority = o.priority;
    if (o.retain_until_ms > retain_until_ms) retain_until_ms = o.retain_until_ms;
  }
};

// Not thread-safe. Ids are the tier's (block ids, host slots).
class EvictionQueue {
 public:
  // Adds (or re-adds, as most recent) a candidate. `tick` orders recency: larger is newer.
  void Add(int32_t id, const EvictionHints& hints, uint64_t tick);
  void Remove(int32_t id);
  bool Contains(int32_t id) const { return pos_.count(id) > 0; }
  size_t size() const { return pos_.size(); }
  bool empty() const { return pos_.empty(); }
  // The candidate to evict now, or -1 if there is none: the first in (priority, recency) order
  // whose retention has passed, else the first of all.
  int32_t Pick(int64_t now_ms) const;
  // Calls f(id) for the candidates whose retention has passed, in the order Pick would take them
  // (retained ones, evicted only when nothing else can be, are left out), until f returns false.
  template <class F>
  void ForEachInOrder(int64_t now_ms, F f) const {
    for (const Key& k : order_) {
      const int32_t id = std::get<2>(k);
      // (Without retained entries, the usual case, no lookup: the walk ahead of eviction runs
      // this over thousands of candidates every engine step of a full cache.)
      if (retained_ > 0 && pos_.at(id).second > now_ms) continue;
      if (!f(id)) return;
    }
  }

 private:
  using Key = std::tuple<int32_t, uint64_t, int32_t>;  // priority, tick, id
  std::set<Key> order_;
  std::unordered_map<int32_t, std::pair<Key, int64_t>> pos_;  // id -> key, retain_until_ms
  size_t retained_ = 0;  // entries with a retain_until_ms > 0 (passed or not)
};

// Which entries of a tier name each key as their parent (the prefix tree's child links), as
// intrusive lists over the tier's ids: adding or removing a child is O(1), and a key's children
// are listed without a pass over the tier, so an eviction's descendant search costs what it
// evicts. The parent need not be in the tier. Not thread-safe.
class ChildIndex {
 public:
  // Ids are in [0, num_ids).
  explicit ChildIndex(size_t num_ids) : next_(num_ids, -1), prev_(num_ids, -1) {}

  // REQUIRES: `id` is in no list.
  void Add(const hash::Hash128& parent, int32_t id);
  // Takes `id` out of `parent`'s list and returns how many children `parent` has left.
  // REQUIRES: `id` was added under `parent`.
  int64_t Remove(const hash::Hash128& parent, int32_t id);
  int64_t Count(const hash::Hash128& parent) const {
    auto it = heads_.find(parent);
    return it == heads_.end() ? 0 : it->second.count;
  }
  // Appends the ids of `parent`'s children to `out`.
  void Children(const hash::Hash128& parent, std::vector<int32_t>* out) const;
  // `keys` (each once), then every descendant the index reaches from them, breadth first (so an
  // ancestor comes before its descendants); `key_of(id)` is a child id's own key.
  template <class KeyOf>
  std::vector<hash::Hash128> WithDescendants(std::span<const hash::Hash128> keys,
                                             KeyOf key_of) const {
    std::unordered_set<hash::Hash128, hash::Hash128Hasher> seen;
    std::vector<hash::Hash128> out;
    for (const hash::Hash128& k : keys) {
      if (seen.insert(k).second) out.push_back(k);
    }
    std::vector<int32_t> kids;
    for (size_t i = 0; i < out.size(); ++i) {
      kids.clear();
      Children(out[i], &kids);
      for (int32_t id : kids) {
        const hash::Hash128& c = key_of(id);
        if (seen.insert(c).second) out.push_back(c);
      }
    }
    return out;
  }

 private:
  struct Head {
    int32_t first = -1;
    int64_t count = 0;
  };
  std::unordered_map<hash::Hash128, Head, hash::Hash128Hasher> heads_;
  std::vector<int32_t> next_;  // [num_ids] next sibling, -1 at the end
  std::vector<int32_t> prev_;  // [num_ids] previous sibling, -1 for the first
};

}  // namespace cascade::engine
