// Host KV tier bookkeeping; see host_tier.h.
#include "gpu_worker/engine/host_tier.h"

#include <cassert>
#include <cstring>
#include <unordered_set>

namespace cascade::engine {

HostKvTier::HostKvTier(int64_t num_slots, int64_t block_bytes, HostKvMemory memory,
                       std::function<int64_t()> now_ms)
    : block_bytes_(block_bytes),
      memory_(std::move(memory)),
      now_ms_(std::move(now_ms)),
      slots_(num_slots),
      children_(static_cast<size_t>(num_slots)) {
  free_.reserve(num_slots);
  for (int64_t s = num_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  stats_.slots = num_slots;
}

void HostKvTier::MaybeCandidate(int32_t slot) {
  const Entry& e = slots_[slot];
  if (e.used && !e.is_protected && ChildCount(e.key) == 0) {
    evictable_.Add(slot, e.hints, e.last_use);
  }
}

void HostKvTier::Protect(std::span<const hash::Hash128> keys) {
  for (const hash::Hash128& k : keys) {
    auto it = slot_of_.find(k);
    if (it == slot_of_.end() || slots_[it->second].is_protected) continue;
    slots_[it->second].is_protected = true;
    evictable_.Remove(it->second);
    protected_.push_back(it->second);
  }
}

void HostKvTier::Unprotect() {
  for (int32_t slot : protected_) {
    slots_[slot].is_protected = false;
    MaybeCandidate(slot);
  }
  protected_.clear();
}

int32_t HostKvTier::TakeSlot(const hash::Hash128& key, const hash::Hash128& parent,
                             const EvictionHints& hints) {
  if (slots_.empty()) return -1;
  int32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = evictable_.Pick(now_ms_ ? now_ms_() : 0);
    if (slot < 0) return -1;  // every leaf is protected: this block is not kept
    ++stats_.evicted;
    Drop(slot);
    free_.pop_back();  // Drop returned it to the free list
  }
  Entry& e = slots_[slot];
  e = Entry{true, false, key, parent, hints, ++tick_};
  slot_of_.emplace(key, slot);
  if (!parent.IsZero()) {
    children_.Add(parent, slot);
    if (auto p = slot_of_.find(parent); p != slot_of_.end()) evictable_.Remove(p->second);
  }
  MaybeCandidate(slot);
  return slot;
}

void HostKvTier::Record(int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                        const EvictionHints& hints, bool ahead) {
  if (auto it = slot_of_.find(key); it != slot_of_.end()) {
    Entry& e = slots_[it->second];
    e.hints.Raise(hints);
    e.last_use = ++tick_;
    if (evictable_.Contains(it->second)) evictable_.Add(it->second, e.hints, e.last_use);
    return;
  }
  const int32_t slot = TakeSlot(key, parent, hints);
  if (slot < 0) return;
  copies_.push_back({true, ahead, BlockCopy{block, SlotData(slot)}, key});
  ++stats_.offloaded;
  if (ahead) ++stats_.offloaded_ahead;
}

bool HostKvTier::Import(const hash::Hash128& key, const hash::Hash128& parent,
                        const EvictionHints& hints, std::span<const std::byte> bytes) {
  if (static_cast<int64_t>(bytes.size()) != block_bytes_) return false;
  if (slot_of_.count(key)) return true;
  const int32_t slot = TakeSlot(key, parent, hints);
  if (slot < 0) return false;
  std::memcpy(SlotData(slot), bytes.data(), bytes.size());
  ++stats_.imported;
  return true;
}

EvictionHints HostKvTier::Restore(const hash::Hash128& key, int32_t block) {
  const int32_t slot = slot_of_.at(key);
  Entry& e = slots_[slot];
  e.last_use = ++tick_;
  if (evictable_.Contains(slot)) evictable_.Add(slot, e.hints, e.last_use);
  copies_.push_back({false, false, BlockCopy{block, SlotData(slot)}, key});
  ++stats_.restored;
  return e.hints;
}

void HostKvTier::Drop(int32_t slot) {
  Entry& e = slots_[slot];
  assert(e.used);
  evictable_.Remove(slot);
  slot_of_.erase(e.key);
  evicted_.push_back(e.key);
  e.used = false;
  free_.push_back(slot);
  if (e.parent.IsZero()) return;
  if (children_.Remove(e.parent, slot) == 0) {
    if (auto p = slot_of_.find(e.parent); p != slot_of_.end()) MaybeCandidate(p->second);
  }
}

int64_t HostKvTier::Erase(std::span<const hash::Hash128> keys) {
  // The keys, then their host descendants breadth first through the child index.
  const std::vector<hash::Hash128> doomed = children_.WithDescendants(
      keys, [&](int32_t slot) -> const hash::Hash128& { return slots_[slot].key; });
  int64_t dropped = 0;
  for (auto k = doomed.rbegin(); k != doomed.rend(); ++k) {
    auto it = slot_of_.find(*k);
    if (it == slot_of_.end()) continue;
    Drop(it->second);
    ++dropped;
  }
  return dropped;
}

const std::byte* HostKvTier::Data(const hash::Hash128& key) const {
  auto it = slot_of_.find(key);
  return it == slot_of_.end() ? nullptr : SlotData(it->second);
}

std::vector<HostCopyOp> HostKvTier::TakeCopies() {
  std::vector<HostCopyOp> out;
  out.swap(copies_);
  return out;
}

std::vector<hash::Hash128> HostKvTier::TakeEvictedKeys() {
  std::vector<hash::Hash128> out;
  out.swap(evicted_);
  return out;
}

HostTierStats HostKvTier::Stats() const {
  HostTierStats s = stats_;
  s.used = static_cast<int64_t>(slot_of_.size());
  return s;
}

}  // namespace cascade::engine
