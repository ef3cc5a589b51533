// Registry admin views and actions: list/inspect chunks, pin/unpin, evict everywhere, workers,
// stats. These scan or lock more than the serving path, which is fine at admin rates.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache_service/registry/registry.h"
#include "cache_service/registry/registry_internal.h"

namespace cascade::registry {
namespace {

constexpr int kDefaultListLimit = 100;
constexpr int kMaxListLimit = 10'000;
constexpr size_t kMaxPendingEvictions = 10'000;

absl::Status UnknownChunk(const Hash128& h) {
  return absl::NotFoundError(absl::StrCat("chunk ", h.ToHex(),
                                          " is not known (never resolved or reported, evicted, "
                                          "or forgotten by the --max_chunks LRU cap)"));
}

}  // namespace

std::vector<ChunkHolder> Registry::HolderIds(const HolderList& holders) {
  std::vector<ChunkHolder> out;
  MutexLock<Mutex> lock(&workers_mu_);
  for (const Holder& h : holders) {
    auto it = by_incarnation_.find(h.worker);
    if (it != by_incarnation_.end()) {
      out.push_back(
          {it->second->info.worker_id, h.held_tokens, h.on_host ? KvTier::kHost : KvTier::kGpu});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ChunkHolder& a, const ChunkHolder& b) { return a.worker_id < b.worker_id; });
  return out;
}

ChunkRecord Registry::ToRecord(const ChunkSnapshot& s) {
  ChunkRecord r;
  r.hash = s.hash;
  r.parent_hash = s.meta.parent;
  r.start = s.meta.start;
  r.end = s.meta.end;
  r.kind = s.meta.kind;
  r.holders = HolderIds(s.holders);
  r.pinned_until_ms = s.pinned_until_ms > clock_->NowMs() ? s.pinned_until_ms : 0;
  r.last_used_ms = s.last_used_ms;
  return r;
}

absl::StatusOr<std::vector<ChunkRecord>> Registry::ListChunks(int limit, std::string_view worker_id,
                                                              int64_t* total) {
  if (limit < 0 || limit > kMaxListLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", limit, " must be in [0, 10000] (0 = 100)"));
  }
  if (limit == 0) limit = kDefaultListLimit;
  std::optional<uint64_t> only;
  if (!worker_id.empty()) {
    absl::StatusOr<std::shared_ptr<Worker>> w = FindLiveWorker(worker_id);
    if (!w.ok()) return w.status();
    only = (*w)->incarnation;
  }
  std::vector<std::pair<int64_t, Hash128>> used;
  chunks_.ForEach([&](const ChunkSnapshot& s) {
    if (only.has_value() && std::none_of(s.holders.begin(), s.holders.end(),
                                         [&](const Holder& h) { return h.worker == *only; })) {
      return;
    }
    used.emplace_back(s.last_used_ms, s.hash);
  });
  size_t n = std::min(used.size(), static_cast<size_t>(limit));
  std::partial_sort(used.begin(), used.begin() + n, used.end(),
                    [](const auto& a, const auto& b) { return a > b; });
  std::vector<ChunkRecord> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::optional<ChunkSnapshot> s = chunks_.Get(used[i].second);
    if (s.has_value()) out.push_back(ToRecord(*s));  // else forgotten since the scan
  }
  if (total != nullptr) *total = chunks_.size();
  return out;
}

absl::StatusOr<ChunkRecord> Registry::GetChunk(const Hash128& hash) {
  std::optional<ChunkSnapshot> s = chunks_.Get(hash);
  if (!s.has_value()) return UnknownChunk(hash);
  return ToRecord(*s);
}

absl::StatusOr<int64_t> Registry::PinChunk(const Hash128& hash, int64_t ttl_s,
                                           const std::optional<HeldChunk>& chunk_if_unknown) {
  if (ttl_s < 1 || ttl_s > options_.max_pin_ttl_s) {
    return absl::InvalidArgumentError(
        absl::StrCat("ttl_seconds: ", ttl_s, " must be in [1, ", options_.max_pin_ttl_s, "]"));
  }
  ChunkMeta meta;
  if (chunk_if_unknown.has_value()) {
    const HeldChunk& c = *chunk_if_unknown;
    if (absl::Status s = internal::ValidateHeldChunk(c, "chunk"); !s.ok()) return s;
    if (c.hash != hash) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.hash: ", c.hash.ToHex(), " differs from hash ", hash.ToHex()));
    }
    meta = ChunkMeta{c.parent_hash, c.start, c.end, c.kind};
  }
  const int64_t now = clock_->NowMs();
  const int64_t until = now + ttl_s * 1000;
  MutexLock<Mutex> lock(&pins_mu_);
  if (!pins_.contains(hash) && static_cast<int64_t>(pins_.size()) >= options_.max_pinned_chunks) {
    absl::erase_if(pins_, [&](const auto& kv) { return kv.second <= now; });
    if (static_cast<int64_t>(pins_.size()) >= options_.max_pinned_chunks) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pins: ", pins_.size(), " chunks are pinned already, the limit is ",
                       options_.max_pinned_chunks, "; unpin some or wait for their TTLs"));
    }
  }
  if (!chunks_.SetPin(hash, until, chunk_if_unknown.has_value() ? &meta : nullptr, now)) {
    return absl::NotFoundError(
        absl::StrCat("chunk ", hash.ToHex(),
                     " is not known; pass `chunk` to pin a chunk before any worker "
                     "reports it"));
  }
  pins_[hash] = until;
  return until;
}

absl::Status Registry::UnpinChunk(const Hash128& hash) {
  MutexLock<Mutex> lock(&pins_mu_);
  bool was_pinned = pins_.erase(hash) > 0;
  if (!chunks_.SetPin(hash, 0, nullptr, clock_->NowMs()) && !was_pinned) {
    return UnknownChunk(hash);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Registry::EvictChunk(const Hash128& hash) {
  std::optional<HolderList> holders = chunks_.Erase(hash);
  {
    MutexLock<Mutex> lock(&pins_mu_);
    pins_.erase(hash);
  }
  if (!holders.has_value()) return UnknownChunk(hash);
  int told = 0;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    for (const Holder& h : *holders) {
      auto it = by_incarnation_.find(h.worker);
      if (it == by_incarnation_.end()) continue;
      std::vector<Hash128>& pending = it->second->pending_evict;
      // Bounded: a worker that never heartbeats again is dropped at lease expiry anyway.
      if (pending.size() >= kMaxPendingEvictions) pending.erase(pending.begin());
      pending.push_back(hash);
      ++told;
    }
  }
  return told;
}

std::vector<WorkerRecord> Registry::ListWorkers() {
  const int64_t now = clock_->NowMs();
  std::vector<std::shared_ptr<Worker>> live;
  std::vector<WorkerRecord> out;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    for (const auto& [id, w] : workers_) {
      if (w->lease_expires_ms <= now) continue;
      live.push_back(w);
      out.push_back(WorkerRecord{w->info, w->load, w->lease_expires_ms, 0, 0});
    }
  }
  for (size_t i = 0; i < live.size(); ++i) {
    MutexLock<Mutex> lock(&live[i]->mu);
    out[i].chunks = chunks_.HeldCount(live[i]->incarnation);
    out[i].applied_seq = live[i]->applied_seq;
  }
  std::sort(out.begin(), out.end(), [](const WorkerRecord& a, const WorkerRecord& b) {
    return a.info.worker_id < b.info.worker_id;
  });
  return out;
}

RegistryStats Registry::GetStats() {
  const int64_t now = clock_->NowMs();
  RegistryStats s;
  s.chunks = chunks_.size();
  {
    MutexLock<Mutex> lock(&workers_mu_);
    for (const auto& [id, w] : workers_) s.workers += w->lease_expires_ms > now ? 1 : 0;
  }
  // Hits first: see the comment where they are counted (registry.cc).
  s.resolve_hits = resolve_hits_.load(std::memory_order_acquire);
  s.resolves = resolves_.load(std::memory_order_relaxed);
  s.chunks_forgotten = chunks_.forgotten();
  s.resyncs_requested = resyncs_requested_.load(std::memory_order_relaxed);
  s.leases_expired = leases_expired_.load(std::memory_order_relaxed);
  {
    MutexLock<Mutex> lock(&pins_mu_);
    for (const auto& [h, until] : pins_) s.pinned_chunks += until > now ? 1 : 0;
  }
  return s;
}

}  // namespace cascade::registry
