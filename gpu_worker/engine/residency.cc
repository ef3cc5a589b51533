// Chunk residency bookkeeping; see residency.h.
#include "gpu_worker/engine/residency.h"

#include <algorithm>
#include <cassert>

namespace cascade::engine {

void Residency::Update(Sequence& seq) {
  if (seq.num_committed == seq.reported_committed) return;
  seq.reported_committed = seq.num_committed;
  const int64_t bs = block_size_;
  for (size_t i = 0; i < seq.chunks.size(); ++i) {
    const hash::PlacedChunk& c = seq.chunks[i];
    const int64_t held_blocks = std::min<int64_t>(c.end / bs, seq.num_committed);
    const int64_t first_block = c.start / bs;
    if (held_blocks <= first_block) continue;  // nothing of this chunk is in a full block yet
    const int64_t held = held_blocks * bs;
    auto it = chunks_.find(c.hash);
    if (it != chunks_.end()) {
      it->second.last_use = ++tick_;
      if (it->second.info.held_tokens >= held) continue;
      Forget(c.hash);
    }

    Entry e;
    e.info.stored = true;
    e.info.hash = c.hash;
    e.info.parent = i == 0 ? hash::Hash128{} : seq.chunks[i - 1].hash;
    e.info.start = c.start;
    e.info.end = c.end;
    e.info.held_tokens = held;
    e.info.kind = seq.chunk_kinds[i];
    e.last = seq.block_keys[held_blocks - 1];
    e.num_blocks = held_blocks - first_block;
    e.last_use = ++tick_;
    e.pinned = pinned_.count(c.hash) > 0;
    for (int64_t j = first_block; j < held_blocks; ++j) {
      Link& link = links_[seq.block_keys[j]];
      link.parent = j == 0 ? hash::Hash128{} : seq.block_keys[j - 1];
      ++link.refs;
    }
    // Room first, so the withdrawals of displaced chunks precede this chunk's event.
    if (!e.pinned) Trim(e.last, max_chunks_per_block_ - 1);
    Emit(e.info);
    auto [pos, inserted] = chunks_.emplace(c.hash, e);
    assert(inserted);
    AddToList(c.hash, pos->second);
  }
}

void Residency::Emit(const ChunkEvent& ev) {
  if (record_events_) events_.push_back(ev);
}

void Residency::AddToList(const hash::Hash128& chunk, Entry& e) {
  Through& t = by_last_[e.last];
  std::vector<hash::Hash128>& list = e.pinned ? t.pinned : t.unpinned;
  e.slot = list.size();
  list.push_back(chunk);
}

void Residency::RemoveFromList(const hash::Hash128& chunk, const Entry& e) {
  auto t = by_last_.find(e.last);
  assert(t != by_last_.end());
  std::vector<hash::Hash128>& list = e.pinned ? t->second.pinned : t->second.unpinned;
  assert(e.slot < list.size() && list[e.slot] == chunk);
  // Swap with the last one and pop: O(1) whatever the list's length.
  if (e.slot + 1 != list.size()) {
    list[e.slot] = list.back();
    chunks_.at(list[e.slot]).slot = e.slot;
  }
  list.pop_back();
  (void)chunk;
  if (t->second.pinned.empty() && t->second.unpinned.empty()) by_last_.erase(t);
}

void Residency::Unlink(const hash::Hash128& last, int64_t n) {
  hash::Hash128 k = last;
  for (int64_t i = 0; i < n; ++i) {
    auto it = links_.find(k);
    if (it == links_.end()) return;  // (only with unchained test keys)
    k = it->second.parent;
    if (--it->second.refs <= 0) links_.erase(it);
  }
}

void Residency::Forget(const hash::Hash128& chunk) {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return;
  RemoveFromList(chunk, it->second);
  Unlink(it->second.last, it->second.num_blocks);
  chunks_.erase(it);
}

void Residency::Withdraw(const hash::Hash128& chunk) {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return;
  ChunkEvent ev = it->second.info;
  ev.stored = false;
  ev.held_tokens = 0;
  Emit(ev);
  Forget(chunk);
}

void Residency::Trim(const hash::Hash128& block, size_t keep) {
  while (true) {
    auto t = by_last_.find(block);
    if (t == by_last_.end() || t->second.unpinned.size() <= keep) return;
    // The list holds at most max_chunks_per_block_ + 1 chunks: a scan is O(1).
    const hash::Hash128* lru = nullptr;
    uint64_t oldest = 0;
    for (const hash::Hash128& h : t->second.unpinned) {
      const uint64_t use = chunks_.at(h).last_use;
      if (lru == nullptr || use < oldest) {
        lru = &h;
        oldest = use;
      }
    }
    const hash::Hash128 victim = *lru;
    ++displaced_;
    Withdraw(victim);
  }
}

void Residency::SetPinned(const hash::Hash128& chunk, bool pinned) {
  if (pinned) {
    pinned_.insert(chunk);
  } else {
    pinned_.erase(chunk);
  }
  auto it = chunks_.find(chunk);
  if (it == chunks_.end() || it->second.pinned == pinned) return;
  RemoveFromList(chunk, it->second);
  it->second.pinned = pinned;
  AddToList(chunk, it->second);
  if (!pinned) Trim(it->second.last, max_chunks_per_block_);
}

void Residency::OnEvicted(const std::vector<hash::Hash128>& block_keys) {
  for (const hash::Hash128& k : block_keys) {
    auto it = by_last_.find(k);
    if (it == by_last_.end()) continue;
    const Through gone = std::move(it->second);
    by_last_.erase(it);
    for (const std::vector<hash::Hash128>* list : {&gone.unpinned, &gone.pinned}) {
      for (const hash::Hash128& h : *list) {
        auto e = chunks_.find(h);
        ChunkEvent ev = e->second.info;
        ev.stored = false;
        ev.held_tokens = 0;
        Emit(ev);
        Unlink(e->second.last, e->second.num_blocks);
        chunks_.erase(e);
      }
    }
  }
}

void Residency::OnTier(const std::vector<hash::Hash128>& block_keys, KvTier tier) {
  for (const hash::Hash128& k : block_keys) {
    auto it = by_last_.find(k);
    if (it == by_last_.end()) continue;
    for (const std::vector<hash::Hash128>* list : {&it->second.unpinned, &it->second.pinned}) {
      for (const hash::Hash128& h : *list) {
        ChunkEvent& info = chunks_.at(h).info;
        if (info.tier == tier) continue;
        info.tier = tier;
        Emit(info);
      }
    }
  }
}

std::vector<hash::Hash128> Residency::BlockKeysOf(const hash::Hash128& chunk) const {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return {};
  std::vector<hash::Hash128> keys;
  keys.reserve(static_cast<size_t>(it->second.num_blocks));
  hash::Hash128 k = it->second.last;
  for (int64_t i = 0; i < it->second.num_blocks; ++i) {
    keys.push_back(k);
    auto link = links_.find(k);
    if (link == links_.end()) break;  // (only with unchained test keys)
    k = link->second.parent;
  }
  std::reverse(keys.begin(), keys.end());
  return keys;
}

std::optional<hash::Hash128> Residency::LastKeyOf(const hash::Hash128& chunk) const {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return std::nullopt;
  return it->second.last;
}

int64_t Residency::ChunksThrough(const hash::Hash128& block_key) const {
  auto it = by_last_.find(block_key);
  if (it == by_last_.end()) return 0;
  return static_cast<int64_t>(it->second.unpinned.size() + it->second.pinned.size());
}

std::vector<ChunkEvent> Residency::Held() const {
  std::vector<ChunkEvent> out;
  out.reserve(chunks_.size());
  for (const auto& [h, e] : chunks_) out.push_back(e.info);
  std::sort(out.begin(), out.end(), [](const ChunkEvent& a, const ChunkEvent& b) {
    return a.start != b.start ? a.start < b.start : a.hash < b.hash;
  });
  return out;
}

std::vector<ChunkEvent> Residency::TakeEvents() {
  std::vector<ChunkEvent> out;
  out.swap(events_);
  return out;
}

}  // namespace cascade::engine
