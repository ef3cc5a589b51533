// Sharded chunk table with a per-shard LRU; see chunk_table.h.
#include "cache_service/registry/chunk_table.h"

#include <algorithm>

namespace cascade::registry {

ChunkTable::ChunkTable(int64_t max_chunks, int num_shards)
    : per_shard_cap_(std::max<int64_t>(
          1, (max_chunks + std::max(num_shards, 1) - 1) / std::max(num_shards, 1))),
      shard_storage_(new Shard[std::max(num_shards, 1)]),
      shards_(shard_storage_.get(), static_cast<size_t>(std::max(num_shards, 1))) {}

ChunkTable::Entry& ChunkTable::FindOrInsert(Shard& s, const hash::Hash128& h, const ChunkMeta& meta,
                                            int64_t now_ms) {
  auto [it, inserted] = s.map.try_emplace(h);
  Entry& e = it->second;
  if (inserted) {
    e.meta = meta;
    e.last_used_ms = now_ms;
    s.lru.push_front(h);
    e.lru = s.lru.begin();
    size_.fetch_add(1, std::memory_order_relaxed);
    EnforceCap(s, h, now_ms);
  }
  return e;
}

void ChunkTable::EnforceCap(Shard& s, const hash::Hash128& keep, int64_t now_ms) {
  // Pinned chunks are skipped (moved to the front); the number of pins is capped by the
  // registry, so this loop is bounded and the table stays within cap + pins.
  size_t skipped = 0;
  while (static_cast<int64_t>(s.map.size()) > per_shard_cap_ && skipped < s.lru.size()) {
    hash::Hash128 victim = s.lru.back();
    auto it = s.map.find(victim);
    if (victim == keep || it->second.pinned_until_ms > now_ms) {
      s.lru.splice(s.lru.begin(), s.lru, std::prev(s.lru.end()));
      ++skipped;
      continue;
    }
    s.lru.pop_back();
    Unindex(s, victim, it->second.holders);
    s.map.erase(it);
    size_.fetch_sub(1, std::memory_order_relaxed);
    forgotten_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ChunkTable::Unindex(Shard& s, const hash::Hash128& h, const HolderList& holders) {
  for (const Holder& holder : holders) {
    auto it = s.held_by.find(holder.worker);
    if (it == s.held_by.end()) continue;
    it->second.erase(h);
    if (it->second.empty()) s.held_by.erase(it);
  }
}

void ChunkTable::Touch(const hash::Hash128& hash, const ChunkMeta& meta, int64_t now_ms,
                       HolderList* holders) {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  Entry& e = FindOrInsert(s, hash, meta, now_ms);
  e.meta = meta;
  e.last_used_ms = now_ms;
  if (e.lru != s.lru.begin()) s.lru.splice(s.lru.begin(), s.lru, e.lru);
  holders->insert(holders->end(), e.holders.begin(), e.holders.end());
}

void ChunkTable::UpsertHolder(const hash::Hash128& hash, const ChunkMeta& meta, Holder holder,
                              int64_t now_ms) {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  Entry& e = FindOrInsert(s, hash, meta, now_ms);
  for (Holder& h : e.holders) {
    if (h.worker == holder.worker) {
      h.held_tokens = holder.held_tokens;
      h.on_host = holder.on_host;
      return;
    }
  }
  e.holders.push_back(holder);
  s.held_by[holder.worker].insert(hash);
}

void ChunkTable::RemoveHolder(const hash::Hash128& hash, uint64_t worker) {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  auto it = s.map.find(hash);
  if (it == s.map.end()) return;
  HolderList& hl = it->second.holders;
  auto gone =
      std::remove_if(hl.begin(), hl.end(), [&](const Holder& h) { return h.worker == worker; });
  if (gone == hl.end()) return;
  hl.erase(gone, hl.end());
  auto idx = s.held_by.find(worker);
  if (idx != s.held_by.end()) {
    idx->second.erase(hash);
    if (idx->second.empty()) s.held_by.erase(idx);
  }
}

void ChunkTable::RemoveWorker(uint64_t worker) {
  for (Shard& s : shards_) {
    MutexLock<Mutex> lock(&s.mu);
    auto idx = s.held_by.find(worker);
    if (idx == s.held_by.end()) continue;
    for (const hash::Hash128& h : idx->second) {
      auto it = s.map.find(h);
      if (it == s.map.end()) continue;  // cannot happen: the index follows the map
      HolderList& hl = it->second.holders;
      hl.erase(std::remove_if(hl.begin(), hl.end(),
                              [&](const Holder& holder) { return holder.worker == worker; }),
               hl.end());
    }
    s.held_by.erase(idx);
  }
}

int64_t ChunkTable::HeldCount(uint64_t worker) const {
  int64_t n = 0;
  for (Shard& s : shards_) {
    MutexLock<Mutex> lock(&s.mu);
    auto idx = s.held_by.find(worker);
    if (idx != s.held_by.end()) n += static_cast<int64_t>(idx->second.size());
  }
  return n;
}

bool ChunkTable::HasHolder(const hash::Hash128& hash, uint64_t worker) const {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  auto it = s.map.find(hash);
  if (it == s.map.end()) return false;
  for (const Holder& h : it->second.holders) {
    if (h.worker == worker) return true;
  }
  return false;
}

ChunkSnapshot ChunkTable::Snapshot(const hash::Hash128& h, const Entry& e) {
  return ChunkSnapshot{h, e.meta, e.holders, e.pinned_until_ms, e.last_used_ms};
}

std::optional<ChunkSnapshot> ChunkTable::Get(const hash::Hash128& hash) const {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  auto it = s.map.find(hash);
  if (it == s.map.end()) return std::nullopt;
  return Snapshot(hash, it->second);
}

bool ChunkTable::SetPin(const hash::Hash128& hash, int64_t until_ms,
                        const ChunkMeta* meta_if_unknown, int64_t now_ms) {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  auto it = s.map.find(hash);
  if (it == s.map.end()) {
    if (meta_if_unknown == nullptr) return false;
    FindOrInsert(s, hash, *meta_if_unknown, now_ms).pinned_until_ms = until_ms;
    return true;
  }
  it->second.pinned_until_ms = until_ms;
  return true;
}

std::optional<HolderList> ChunkTable::Erase(const hash::Hash128& hash) {
  Shard& s = ShardFor(hash);
  MutexLock<Mutex> lock(&s.mu);
  auto it = s.map.find(hash);
  if (it == s.map.end()) return std::nullopt;
  HolderList holders = std::move(it->second.holders);
  Unindex(s, hash, holders);
  s.lru.erase(it->second.lru);
  s.map.erase(it);
  size_.fetch_sub(1, std::memory_order_relaxed);
  return holders;
}

void ChunkTable::ForEach(const std::function<void(const ChunkSnapshot&)>& fn) const {
  for (Shard& s : shards_) {
    MutexLock<Mutex> lock(&s.mu);
    for (const auto& [h, e] : s.map) fn(Snapshot(h, e));
  }
}

}  // namespace cascade::registry
