// Chunk residency bookkeeping; see residency.h.
#include "gpu_worker/engine/residency.h"

#include <algorithm>

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
    if (it != chunks_.end() && it->second.info.held_tokens >= held) continue;
    if (it != chunks_.end()) Forget(c.hash);

    Entry e;
    e.info.stored = true;
    e.info.hash = c.hash;
    e.info.parent = i == 0 ? hash::Hash128{} : seq.chunks[i - 1].hash;
    e.info.start = c.start;
    e.info.end = c.end;
    e.info.held_tokens = held;
    e.info.kind = seq.chunk_kinds[i];
    e.keys.assign(seq.block_keys.begin() + first_block, seq.block_keys.begin() + held_blocks);
    by_last_[e.keys.back()].push_back(c.hash);
    events_.push_back(e.info);
    chunks_.emplace(c.hash, std::move(e));
  }
}

void Residency::Forget(const hash::Hash128& chunk) {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return;
  auto last = by_last_.find(it->second.keys.back());
  if (last != by_last_.end()) {
    std::erase(last->second, chunk);
    if (last->second.empty()) by_last_.erase(last);
  }
  chunks_.erase(it);
}

void Residency::OnEvicted(const std::vector<hash::Hash128>& block_keys) {
  for (const hash::Hash128& k : block_keys) {
    auto it = by_last_.find(k);
    if (it == by_last_.end()) continue;
    std::vector<hash::Hash128> chunks = it->second;
    for (const hash::Hash128& h : chunks) {
      ChunkEvent ev = chunks_.at(h).info;
      ev.stored = false;
      ev.held_tokens = 0;
      events_.push_back(ev);
      Forget(h);
    }
  }
}

void Residency::OnTier(const std::vector<hash::Hash128>& block_keys, KvTier tier) {
  for (const hash::Hash128& k : block_keys) {
    auto it = by_last_.find(k);
    if (it == by_last_.end()) continue;
    for (const hash::Hash128& h : it->second) {
      ChunkEvent& info = chunks_.at(h).info;
      if (info.tier == tier) continue;
      info.tier = tier;
      events_.push_back(info);
    }
  }
}

std::vector<hash::Hash128> Residency::BlockKeysOf(const hash::Hash128& chunk) const {
  auto it = chunks_.find(chunk);
  return it == chunks_.end() ? std::vector<hash::Hash128>{} : it->second.keys;
}

std::optional<hash::Hash128> Residency::LastKeyOf(const hash::Hash128& chunk) const {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return std::nullopt;
  return it->second.keys.back();
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
