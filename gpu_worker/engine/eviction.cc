// Eviction order shared by the KV tiers; see eviction.h.
#include "gpu_worker/engine/eviction.h"

namespace cascade::engine {

void EvictionQueue::Add(int32_t id, const EvictionHints& hints, uint64_t tick) {
  Remove(id);
  const Key k{hints.priority, tick, id};
  order_.insert(k);
  pos_.emplace(id, std::make_pair(k, hints.retain_until_ms));
}

void EvictionQueue::Remove(int32_t id) {
  auto it = pos_.find(id);
  if (it == pos_.end()) return;
  order_.erase(it->second.first);
  pos_.erase(it);
}

int32_t EvictionQueue::Pick(int64_t now_ms) const {
  if (order_.empty()) return -1;
  // Retained entries are few (chunks registered with retention_seconds), so the walk is short.
  for (const Key& k : order_) {
    if (pos_.at(std::get<2>(k)).second <= now_ms) return std::get<2>(k);
  }
  return std::get<2>(*order_.begin());
}

}  // namespace cascade::engine
