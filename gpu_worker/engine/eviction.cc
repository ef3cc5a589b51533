// Eviction order shared by the KV tiers; see eviction.h.
#include "gpu_worker/engine/eviction.h"

#include <cassert>

namespace cascade::engine {

void EvictionQueue::Add(int32_t id, const EvictionHints& hints, uint64_t tick) {
  Remove(id);
  const Key k{hints.priority, tick, id};
  order_.insert(k);
  pos_.emplace(id, std::make_pair(k, hints.retain_until_ms));
  if (hints.retain_until_ms > 0) ++retained_;
}

void EvictionQueue::Remove(int32_t id) {
  auto it = pos_.find(id);
  if (it == pos_.end()) return;
  if (it->second.second > 0) --retained_;
  order_.erase(it->second.first);
  pos_.erase(it);
}

int32_t EvictionQueue::Pick(int64_t now_ms) const {
  if (order_.empty()) return -1;
  if (retained_ == 0) return std::get<2>(*order_.begin());
  // Retained entries are few (chunks registered with retention_seconds), so the walk is short.
  for (const Key& k : order_) {
    if (pos_.at(std::get<2>(k)).second <= now_ms) return std::get<2>(k);
  }
  return std::get<2>(*order_.begin());
}

void ChildIndex::Add(const hash::Hash128& parent, int32_t id) {
  Head& h = heads_[parent];
  next_[id] = h.first;
  prev_[id] = -1;
  if (h.first >= 0) prev_[h.first] = id;
  h.first = id;
  ++h.count;
}

int64_t ChildIndex::Remove(const hash::Hash128& parent, int32_t id) {
  auto it = heads_.find(parent);
  assert(it != heads_.end());
  Head& h = it->second;
  if (prev_[id] >= 0) {
    next_[prev_[id]] = next_[id];
  } else {
    assert(h.first == id);
    h.first = next_[id];
  }
  if (next_[id] >= 0) prev_[next_[id]] = prev_[id];
  next_[id] = prev_[id] = -1;
  const int64_t left = --h.count;
  if (left == 0) heads_.erase(it);
  return left;
}

void ChildIndex::Children(const hash::Hash128& parent, std::vector<int32_t>* out) const {
  auto it = heads_.find(parent);
  if (it == heads_.end()) return;
  for (int32_t id = it->second.first; id >= 0; id = next_[id]) out->push_back(id);
}

}  // namespace cascade::engine
