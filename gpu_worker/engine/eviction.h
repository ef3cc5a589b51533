// The eviction order both KV tiers (GPU blocks, host copies) share: lowest priority first, then
// least recently used; entries still inside their retention time go last. The tiers add only
// candidates that no cached entry extends (leaves of the prefix tree), so a block is evicted
// after the blocks that extend it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>
#include <unordered_map>

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

 private:
  using Key = std::tuple<int32_t, uint64_t, int32_t>;  // priority, tick, id
  std::set<Key> order_;
  std::unordered_map<int32_t, std::pair<Key, int64_t>> pos_;  // id -> key, retain_until_ms
};

}  // namespace cascade::engine
