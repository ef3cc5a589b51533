// Registry: resolve, membership with leases, residency events and resync.
#include "cache_service/registry/registry.h"

#include <algorithm>
#include <random>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache_service/registry/registry_internal.h"

namespace cascade::registry {
namespace {

std::string NewEpoch(int64_t now_ms) {
  std::random_device rd;
  uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%x-%016x", now_ms, r);
}

absl::Status UnknownWorker(std::string_view id, std::string_view why) {
  return absl::NotFoundError(absl::StrCat("worker '", internal::AV(id), "' ", internal::AV(why),
                                          "; call RegisterWorker and Resync"));
}

}  // namespace

Registry::Registry(const RegistryOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock()),
      epoch_(NewEpoch(clock_->NowMs())),
      chunks_(options.max_chunks, options.num_shards) {}

Registry::~Registry() = default;

absl::StatusOr<ResolveResult> Registry::Resolve(const ResolveInput& in) {
  if (in.model.empty() || in.model.size() > internal::kMaxModelBytes) {
    return absl::InvalidArgumentError("model: must be 1..256 bytes");
  }
  if (in.cache_salt.size() > internal::kMaxSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt: ", in.cache_salt.size(), " bytes exceed the limit of 1024"));
  }
  if (in.chunks.empty()) {
    return absl::InvalidArgumentError("chunks: at least one chunk is required");
  }
  if (in.chunks.size() > static_cast<size_t>(options_.max_chunks_per_request)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("chunks: ", in.chunks.size(), " chunks exceed the limit of ",
                     options_.max_chunks_per_request, " per request (--max_chunks_per_request)"));
  }
  int64_t total_tokens = 0;
  for (size_t i = 0; i < in.chunks.size(); ++i) {
    const hash::ChunkSpec& c = in.chunks[i];
    if (c.kind <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks[", i, "].kind: must be set (not CHUNK_KIND_UNSPECIFIED)"));
    }
    if (c.cache_salt.size() > internal::kMaxSaltBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks[", i, "].cache_salt: ", c.cache_salt.size(), " bytes exceed the limit of 1024"));
    }
    total_tokens += static_cast<int64_t>(c.tokens.size());
    if (total_tokens > options_.max_tokens_per_request) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chunks[", i, "].token_ids: the prompt reaches ", total_tokens,
                       " tokens here, over the limit of ", options_.max_tokens_per_request,
                       " per request (--max_tokens_per_request)"));
    }
  }

  const int64_t now = clock_->NowMs();
  std::vector<hash::PlacedChunk> placed = hash::PlaceChunks(in.model, in.cache_salt, in.chunks);

  // Walk the chain once. A run is one worker holding every chunk from 0 so far; it ends at
  // the first chunk the worker does not hold at all.
  struct Run {
    uint64_t worker;
    int64_t max_held;
    int64_t max_held_gpu;  // leading tokens held on the GPU tier (ancestors stay on the GPU
                           // while a descendant is there, so this is a prefix of max_held)
    size_t length;         // chunks in the run
    bool open;
  };
  absl::InlinedVector<Run, 8> runs;
  // Runs and each chunk's holders in worker order (a chunk has one holder a worker), so a chunk
  // costs a sort of its holders and one merge, not runs x holders: a system chunk held by
  // thousands of workers would otherwise make every Resolve quadratic in them.
  auto by_worker = [](const auto& a, const auto& b) { return a.worker < b.worker; };
  HolderList holders;
  ResolveResult out;
  out.chunks.reserve(placed.size());
  Hash128 prev;
  for (size_t i = 0; i < placed.size(); ++i) {
    const hash::PlacedChunk& p = placed[i];
    out.chunks.push_back(ResolvedChunk{p.hash, p.start, p.end});
    holders.clear();
    chunks_.Touch(p.hash, ChunkMeta{prev, p.start, p.end, in.chunks[i].kind}, now, &holders);
    prev = p.hash;
    // Holders report their own positions, which a buggy worker or a crafted report can put past
    // the chunk's real end: what this prompt places there bounds what anyone holds of it.
    for (Holder& h : holders) h.held_tokens = std::min(h.held_tokens, p.end);
    if (i == 0) {
      for (const Holder& h : holders) {
        runs.push_back(Run{h.worker, h.held_tokens, h.on_host ? 0 : h.held_tokens, 1, true});
      }
      std::sort(runs.begin(), runs.end(), by_worker);
      continue;
    }
    std::sort(holders.begin(), holders.end(), by_worker);
    auto it = holders.begin();
    for (Run& r : runs) {
      if (!r.open) continue;
      while (it != holders.end() && it->worker < r.worker) ++it;
      if (it == holders.end() || it->worker != r.worker) {
        r.open = false;
      } else {
        r.max_held = std::max(r.max_held, it->held_tokens);
        if (!it->on_host) r.max_held_gpu = std::max(r.max_held_gpu, it->held_tokens);
        ++r.length;
      }
    }
  }

  {
    MutexLock<Mutex> lock(&workers_mu_);
    for (const auto& [id, w] : workers_) {
      if (w->info.model != in.model || w->lease_expires_ms <= now) continue;
      WorkerMatch m{w->info.worker_id,   w->info.address,   0, 0, w->load, 0,
                    w->info.kv_numerics, w->info.block_size};
      // (A named copy: clang 14, which builds the fuzz targets, cannot capture a structured
      // binding in a lambda.)
      const uint64_t incarnation = w->incarnation;
      auto it = std::lower_bound(runs.begin(), runs.end(), incarnation,
                                 [](const Run& r, uint64_t w) { return r.worker < w; });
      if (it != runs.end() && it->worker == incarnation) {
        m.matched_tokens = it->max_held;
        m.matched_host_tokens = it->max_held - std::min(it->max_held, it->max_held_gpu);
        // A chunk counts as fully held when the worker holds this prompt's tokens through its
        // end. Chunks are held cumulatively (held_tokens counts from position 0), so a chunk
        // whose last partial block is covered by a later chunk's full block counts too.
        while (static_cast<size_t>(m.matched_chunks) < it->length &&
               out.chunks[m.matched_chunks].end <= it->max_held) {
          ++m.matched_chunks;
        }
      }
      out.workers.push_back(std::move(m));
    }
  }
  std::sort(out.workers.begin(), out.workers.end(), [](const WorkerMatch& a, const WorkerMatch& b) {
    if (a.matched_tokens != b.matched_tokens) return a.matched_tokens > b.matched_tokens;
    if (a.matched_chunks != b.matched_chunks) return a.matched_chunks > b.matched_chunks;
    // Widened first: two int32 counts from a worker's heartbeat may overflow int when added.
    const int64_t qa = int64_t{a.load.running} + a.load.waiting;
    const int64_t qb = int64_t{b.load.running} + b.load.waiting;
    if (qa != qb) return qa < qb;
    return a.worker_id < b.worker_id;
  });
  // Counted before the hit, and the hit with release: a snapshot that reads the hits first
  // (acquire) then sees at least as many resolves, so hits <= resolves in every snapshot.
  resolves_.fetch_add(1, std::memory_order_relaxed);
  if (!out.workers.empty() && out.workers.front().matched_tokens > 0) {
    resolve_hits_.fetch_add(1, std::memory_order_release);
  }
  return out;
}

absl::StatusOr<RegisterResult> Registry::RegisterWorker(const WorkerInfo& info) {
  if (absl::Status s = internal::ValidateWorkerInfo(info); !s.ok()) return s;
  auto w = std::make_shared<Worker>();
  w->info = info;
  std::shared_ptr<Worker> previous;
  std::vector<std::shared_ptr<Worker>> expired;
  bool full = false;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    const int64_t now = clock_->NowMs();
    const size_t cap = static_cast<size_t>(std::max(options_.max_workers, 0));
    if (!workers_.contains(info.worker_id) && workers_.size() >= cap) {
      // At the cap: leases that ran out but were not swept yet make room first. O(workers), and
      // only at the cap.
      TakeExpiredLocked(now, &expired);
      full = workers_.size() >= cap;
    }
    if (!full) {
      w->incarnation = next_incarnation_++;
      w->lease_expires_ms = now + options_.lease_ms;
      auto it = workers_.find(info.worker_id);
      if (it != workers_.end()) {
        previous = std::move(it->second);
        by_incarnation_.erase(previous->incarnation);
        it->second = w;
      } else {
        workers_.emplace(info.worker_id, w);
      }
      by_incarnation_.emplace(w->incarnation, w);
    }
  }
  leases_expired_.fetch_add(static_cast<int64_t>(expired.size()), std::memory_order_relaxed);
  for (const auto& e : expired) DropResidency(*e);
  if (full) {
    // (The id passed ValidateWorkerInfo: [A-Za-z0-9._:@-] only, safe to quote as is.)
    return absl::ResourceExhaustedError(
        absl::StrCat("worker_id: '", info.worker_id, "' would be worker ", options_.max_workers + 1,
                     ", over the limit of ", options_.max_workers,
                     " registered workers (--max_workers); deregister departed workers "
                     "or raise the limit"));
  }
  // A re-registering worker restarted (or lost track); what it held before is unknown now.
  if (previous != nullptr) DropResidency(*previous);
  return RegisterResult{options_.lease_ms, epoch_};
}

absl::StatusOr<std::shared_ptr<Registry::Worker>> Registry::FindLiveWorker(
    std::string_view worker_id) {
  if (absl::Status s = internal::ValidateWorkerId(worker_id); !s.ok()) return s;
  const int64_t now = clock_->NowMs();
  {
    MutexLock<Mutex> lock(&workers_mu_);
    auto it = workers_.find(internal::AV(worker_id));
    if (it == workers_.end()) return UnknownWorker(worker_id, "is not registered");
    if (it->second->lease_expires_ms > now) return it->second;
  }
  std::shared_ptr<Worker> expired;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    auto it = workers_.find(internal::AV(worker_id));
    if (it == workers_.end()) return UnknownWorker(worker_id, "is not registered");
    if (it->second->lease_expires_ms > now) return it->second;  // renewed meanwhile
    expired = std::move(it->second);
    workers_.erase(it);
    by_incarnation_.erase(expired->incarnation);
  }
  leases_expired_.fetch_add(1, std::memory_order_relaxed);
  DropResidency(*expired);
  return UnknownWorker(worker_id, "lease expired");
}

void Registry::DropResidency(Worker& w) {
  MutexLock<Mutex> lock(&w.mu);
  w.dropped = true;
  chunks_.RemoveWorker(w.incarnation);
}

absl::StatusOr<HeartbeatResult> Registry::Heartbeat(std::string_view worker_id,
                                                    const WorkerLoad& load) {
  if (absl::Status s = internal::ValidateLoad(load); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<Worker>> found = FindLiveWorker(worker_id);
  if (!found.ok()) return found.status();
  Worker& w = **found;
  const int64_t now = clock_->NowMs();
  HeartbeatResult out;
  out.registry_epoch = epoch_;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    auto it = workers_.find(internal::AV(worker_id));
    if (it == workers_.end() || it->second.get() != &w) {
      // Expired (swept) or replaced by a re-registration since the lookup above.
      return UnknownWorker(worker_id, "lease expired");
    }
    w.lease_expires_ms = now + options_.lease_ms;
    w.load = load;
    out.evict_hashes.swap(w.pending_evict);
  }
  std::vector<Hash128> pinned;
  {
    MutexLock<Mutex> lock(&pins_mu_);
    for (const auto& [h, until] : pins_) {
      if (until > now) pinned.push_back(h);
    }
  }
  for (const Hash128& h : pinned) {
    if (chunks_.HasHolder(h, w.incarnation)) out.pinned_hashes.push_back(h);
  }
  return out;
}

void Registry::ApplyHeld(Worker& w, const HeldChunk& c) {
  chunks_.UpsertHolder(c.hash, ChunkMeta{c.parent_hash, c.start, c.end, c.kind},
                       Holder{w.incarnation, c.held_tokens, c.tier == KvTier::kHost},
                       clock_->NowMs());
}

void Registry::ApplyEvicted(Worker& w, const Hash128& h) { chunks_.RemoveHolder(h, w.incarnation); }

absl::StatusOr<ReportResult> Registry::ReportEvents(std::string_view worker_id, uint64_t seq,
                                                    std::span<const ChunkEvent> events) {
  if (seq == 0) return absl::InvalidArgumentError("seq: batches are numbered from 1");
  if (seq > kMaxEventSeq) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq: ", seq, " is past the last batch number, 2^63 = ", kMaxEventSeq));
  }
  if (events.size() > static_cast<size_t>(options_.max_events_per_batch)) {
    return absl::ResourceExhaustedError(absl::StrCat("events: ", events.size(),
                                                     " events exceed the limit of ",
                                                     options_.max_events_per_batch, " per batch"));
  }
  for (size_t i = 0; i < events.size(); ++i) {
    absl::Status s =
        internal::ValidateHeldChunk(events[i].chunk, absl::StrCat("events[", i, "].chunk"));
    // An eviction needs only the hash; its other fields may be left unset.
    if (!s.ok() && (events[i].type == ChunkEvent::Type::kStored || events[i].chunk.hash.IsZero())) {
      return s;
    }
  }
  absl::StatusOr<std::shared_ptr<Worker>> found = FindLiveWorker(worker_id);
  if (!found.ok()) return found.status();
  Worker& w = **found;
  MutexLock<Mutex> lock(&w.mu);
  if (w.dropped) return UnknownWorker(worker_id, "was dropped");
  if (w.resync_pending) return ReportResult{true, w.applied_seq};
  if (seq <= w.applied_seq) return ReportResult{false, w.applied_seq};  // a repeat: no effect
  if (seq != w.applied_seq + 1) {
    // A batch went missing: the registry's view of this worker can no longer be patched.
    w.resync_pending = true;
    resyncs_requested_.fetch_add(1, std::memory_order_relaxed);
    return ReportResult{true, w.applied_seq};
  }
  for (const ChunkEvent& e : events) {
    if (e.type == ChunkEvent::Type::kStored) {
      ApplyHeld(w, e.chunk);
    } else {
      ApplyEvicted(w, e.chunk.hash);
    }
  }
  w.applied_seq = seq;
  return ReportResult{false, seq};
}

absl::StatusOr<int> Registry::Resync(std::string_view worker_id, std::span<const HeldChunk> chunks,
                                     uint64_t seq) {
  if (seq >= kMaxEventSeq) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq: ", seq, " leaves no number for the next batch (seq + 1); must be below ",
                     "2^63 = ", kMaxEventSeq));
  }
  if (chunks.size() > static_cast<size_t>(options_.max_resync_chunks)) {
    return absl::ResourceExhaustedError(absl::StrCat("chunks: ", chunks.size(),
                                                     " chunks exceed the limit of ",
                                                     options_.max_resync_chunks, " per resync"));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::Status s = internal::ValidateHeldChunk(chunks[i], absl::StrCat("chunks[", i, "]"));
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::shared_ptr<Worker>> found = FindLiveWorker(worker_id);
  if (!found.ok()) return found.status();
  Worker& w = **found;
  MutexLock<Mutex> lock(&w.mu);
  if (w.dropped) return UnknownWorker(worker_id, "was dropped");
  chunks_.RemoveWorker(w.incarnation);
  for (const HeldChunk& c : chunks) ApplyHeld(w, c);
  w.applied_seq = seq;
  w.resync_pending = false;
  return static_cast<int>(chunks_.HeldCount(w.incarnation));
}

absl::Status Registry::DeregisterWorker(std::string_view worker_id) {
  if (absl::Status s = internal::ValidateWorkerId(worker_id); !s.ok()) return s;
  std::shared_ptr<Worker> w;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    auto it = workers_.find(internal::AV(worker_id));
    if (it == workers_.end()) return UnknownWorker(worker_id, "is not registered");
    w = std::move(it->second);
    workers_.erase(it);
    by_incarnation_.erase(w->incarnation);
  }
  DropResidency(*w);
  return absl::OkStatus();
}

void Registry::TakeExpiredLocked(int64_t now, std::vector<std::shared_ptr<Worker>>* expired) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second->lease_expires_ms <= now) {
      by_incarnation_.erase(it->second->incarnation);
      expired->push_back(std::move(it->second));
      workers_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Registry::Sweep() {
  const int64_t now = clock_->NowMs();
  std::vector<std::shared_ptr<Worker>> expired;
  {
    MutexLock<Mutex> lock(&workers_mu_);
    TakeExpiredLocked(now, &expired);
  }
  leases_expired_.fetch_add(static_cast<int64_t>(expired.size()), std::memory_order_relaxed);
  for (const auto& w : expired) DropResidency(*w);
  MutexLock<Mutex> lock(&pins_mu_);
  absl::erase_if(pins_, [&](const auto& kv) { return kv.second <= now; });
}

}  // namespace cascade::registry
