// Field-by-field translation; see registry_wire.h.
#include "cache_service/wire/registry_wire.h"

#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cache_service/registry/registry_internal.h"

namespace cascade::registry::wire {
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A chunk whose every field takes its longest valid encoding (registry/validate.cc's limits).
void SetLongestChunk(v2::HeldChunk* c) {
  const std::string hex(32, 'f');
  c->set_hash(hex);
  c->set_parent_hash(hex);
  c->set_start(internal::kMaxPosition);
  c->set_end(internal::kMaxPosition);
  c->set_held_tokens(internal::kMaxPosition);
  c->set_kind(static_cast<v2::ChunkKind>(std::numeric_limits<int32_t>::max()));  // any kind > 0
  c->set_tier(v2::KV_TIER_HOST);
}

// Bytes of `req` with nothing repeated, and what each longest element adds (its tag and
// length prefix included): `add` appends one element.
template <typename Request, typename Add>
std::pair<int64_t, int64_t> Sizes(Add add) {
  Request req;
  req.set_worker_id(std::string(internal::kMaxWorkerIdBytes, 'w'));
  req.set_seq(kMaxEventSeq);
  const auto empty = static_cast<int64_t>(req.ByteSizeLong());
  add(&req);
  return {empty, static_cast<int64_t>(req.ByteSizeLong()) - empty};
}

}  // namespace

absl::StatusOr<Hash128> ParseHash(const std::string& hex, std::string_view field) {
  std::optional<Hash128> h = Hash128::FromHex(hex);
  if (!h.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": '", absl::CHexEscape(AV(std::string_view(hex).substr(0, 40))),
                     hex.size() > 40 ? "..." : "", "' is not a hash (32 hex characters)"));
  }
  return *h;
}

absl::StatusOr<Hash128> ParseOptionalHash(const std::string& hex, std::string_view field) {
  if (hex.empty()) return Hash128{};
  return ParseHash(hex, field);
}

std::vector<hash::ChunkSpec> SpecsFromProto(const v2::ResolveRequest& req) {
  std::vector<hash::ChunkSpec> specs;
  specs.reserve(req.chunks_size());
  for (const v2::ResolveChunk& c : req.chunks()) {
    specs.push_back(
        hash::ChunkSpec{static_cast<int32_t>(c.kind()),
                        std::span<const int32_t>(c.token_ids().data(), c.token_ids().size()),
                        std::string_view(c.cache_salt())});
  }
  return specs;
}

void ToProto(const ResolveInput& in, v2::ResolveRequest* req) {
  req->set_model(std::string(in.model));
  req->set_cache_salt(std::string(in.cache_salt));
  for (const hash::ChunkSpec& c : in.chunks) {
    v2::ResolveChunk* out = req->add_chunks();
    out->set_kind(static_cast<v2::ChunkKind>(c.kind));
    out->mutable_token_ids()->Add(c.tokens.begin(), c.tokens.end());
    out->set_cache_salt(std::string(c.cache_salt));
  }
}

void ToProto(const ResolveResult& r, v2::ResolveResponse* resp) {
  for (const ResolvedChunk& c : r.chunks) {
    v2::ResolvedChunk* out = resp->add_chunks();
    out->set_hash(c.hash.ToHex());
    out->set_start(c.start);
    out->set_end(c.end);
  }
  for (const WorkerMatch& m : r.workers) {
    v2::WorkerMatch* out = resp->add_workers();
    out->set_worker_id(m.worker_id);
    out->set_address(m.address);
    out->set_matched_chunks(m.matched_chunks);
    out->set_matched_tokens(m.matched_tokens);
    out->set_matched_host_tokens(m.matched_host_tokens);
    out->set_kv_numerics(m.kv_numerics);
    out->set_block_size(m.block_size);
    ToProto(m.load, out->mutable_load());
  }
}

absl::StatusOr<ResolveResult> FromProto(const v2::ResolveResponse& resp) {
  ResolveResult r;
  for (int i = 0; i < resp.chunks_size(); ++i) {
    const v2::ResolvedChunk& c = resp.chunks(i);
    absl::StatusOr<Hash128> h = ParseHash(c.hash(), absl::StrCat("chunks[", i, "].hash"));
    if (!h.ok()) return h.status();
    r.chunks.push_back(ResolvedChunk{*h, c.start(), c.end()});
  }
  for (const v2::WorkerMatch& m : resp.workers()) {
    r.workers.push_back(WorkerMatch{m.worker_id(), m.address(), m.matched_chunks(),
                                    m.matched_tokens(), FromProto(m.load()),
                                    m.matched_host_tokens(), m.kv_numerics(), m.block_size()});
  }
  return r;
}

WorkerLoad FromProto(const v2::WorkerLoad& load) {
  return WorkerLoad{load.running(), load.waiting(), load.free_kv_blocks(), load.total_kv_blocks()};
}

void ToProto(const WorkerLoad& load, v2::WorkerLoad* out) {
  out->set_running(load.running);
  out->set_waiting(load.waiting);
  out->set_free_kv_blocks(load.free_kv_blocks);
  out->set_total_kv_blocks(load.total_kv_blocks);
}

WorkerInfo FromProto(const v2::RegisterWorkerRequest& req) {
  return WorkerInfo{req.worker_id(),  req.address(),     req.model(),      req.kv_capacity_blocks(),
                    req.block_size(), req.max_context(), req.vocab_size(), req.kv_numerics()};
}

void ToProto(const WorkerInfo& info, v2::RegisterWorkerRequest* req) {
  req->set_worker_id(info.worker_id);
  req->set_address(info.address);
  req->set_model(info.model);
  req->set_kv_capacity_blocks(info.kv_capacity_blocks);
  req->set_block_size(info.block_size);
  req->set_max_context(info.max_context);
  req->set_vocab_size(info.vocab_size);
  req->set_kv_numerics(info.kv_numerics);
}

void ToProto(const HeartbeatResult& r, v2::HeartbeatResponse* resp) {
  resp->set_registry_epoch(r.registry_epoch);
  for (const Hash128& h : r.pinned_hashes) resp->add_pinned_hashes(h.ToHex());
  for (const Hash128& h : r.evict_hashes) resp->add_evict_hashes(h.ToHex());
}

absl::StatusOr<HeartbeatResult> FromProto(const v2::HeartbeatResponse& resp) {
  HeartbeatResult r;
  r.registry_epoch = resp.registry_epoch();
  for (int i = 0; i < resp.pinned_hashes_size(); ++i) {
    absl::StatusOr<Hash128> h =
        ParseHash(resp.pinned_hashes(i), absl::StrCat("pinned_hashes[", i, "]"));
    if (!h.ok()) return h.status();
    r.pinned_hashes.push_back(*h);
  }
  for (int i = 0; i < resp.evict_hashes_size(); ++i) {
    absl::StatusOr<Hash128> h =
        ParseHash(resp.evict_hashes(i), absl::StrCat("evict_hashes[", i, "]"));
    if (!h.ok()) return h.status();
    r.evict_hashes.push_back(*h);
  }
  return r;
}

absl::StatusOr<HeldChunk> FromProto(const v2::HeldChunk& c, std::string_view field) {
  absl::StatusOr<Hash128> h = ParseHash(c.hash(), absl::StrCat(AV(field), ".hash"));
  if (!h.ok()) return h.status();
  absl::StatusOr<Hash128> parent =
      ParseOptionalHash(c.parent_hash(), absl::StrCat(AV(field), ".parent_hash"));
  if (!parent.ok()) return parent.status();
  if (c.tier() != v2::KV_TIER_UNSPECIFIED && c.tier() != v2::KV_TIER_GPU &&
      c.tier() != v2::KV_TIER_HOST) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ".tier: ", static_cast<int>(c.tier()), " is not a KvTier"));
  }
  return HeldChunk{*h,
                   c.start(),
                   c.end(),
                   c.held_tokens(),
                   *parent,
                   static_cast<int32_t>(c.kind()),
                   c.tier() == v2::KV_TIER_HOST ? KvTier::kHost : KvTier::kGpu};
}

void ToProto(const HeldChunk& c, v2::HeldChunk* out) {
  out->set_hash(c.hash.ToHex());
  out->set_start(c.start);
  out->set_end(c.end);
  out->set_held_tokens(c.held_tokens);
  if (!c.parent_hash.IsZero()) out->set_parent_hash(c.parent_hash.ToHex());
  out->set_kind(static_cast<v2::ChunkKind>(c.kind));
  out->set_tier(c.tier == KvTier::kHost ? v2::KV_TIER_HOST : v2::KV_TIER_GPU);
}

absl::StatusOr<std::vector<ChunkEvent>> EventsFromProto(const v2::ReportEventsRequest& req) {
  std::vector<ChunkEvent> events;
  events.reserve(req.events_size());
  for (int i = 0; i < req.events_size(); ++i) {
    const v2::ChunkEvent& e = req.events(i);
    ChunkEvent out;
    if (e.type() == v2::ChunkEvent::TYPE_STORED) {
      out.type = ChunkEvent::Type::kStored;
    } else if (e.type() == v2::ChunkEvent::TYPE_EVICTED) {
      out.type = ChunkEvent::Type::kEvicted;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("events[", i, "].type: must be TYPE_STORED or TYPE_EVICTED"));
    }
    absl::StatusOr<HeldChunk> c = FromProto(e.chunk(), absl::StrCat("events[", i, "].chunk"));
    if (!c.ok()) return c.status();
    out.chunk = *c;
    events.push_back(out);
  }
  return events;
}

void ToProto(const ChunkEvent& e, v2::ChunkEvent* out) {
  out->set_type(e.type == ChunkEvent::Type::kStored ? v2::ChunkEvent::TYPE_STORED
                                                    : v2::ChunkEvent::TYPE_EVICTED);
  ToProto(e.chunk, out->mutable_chunk());
}

absl::StatusOr<std::vector<HeldChunk>> ChunksFromProto(const v2::ResyncRequest& req) {
  std::vector<HeldChunk> chunks;
  chunks.reserve(req.chunks_size());
  for (int i = 0; i < req.chunks_size(); ++i) {
    absl::StatusOr<HeldChunk> c = FromProto(req.chunks(i), absl::StrCat("chunks[", i, "]"));
    if (!c.ok()) return c.status();
    chunks.push_back(*c);
  }
  return chunks;
}

void ToProto(const ChunkRecord& r, v2::ChunkRecord* out) {
  out->set_hash(r.hash.ToHex());
  if (!r.parent_hash.IsZero()) out->set_parent_hash(r.parent_hash.ToHex());
  out->set_start(r.start);
  out->set_end(r.end);
  out->set_num_tokens(r.end - r.start);
  out->set_kind(static_cast<v2::ChunkKind>(r.kind));
  for (const ChunkHolder& h : r.holders) {
    v2::ChunkHolder* holder = out->add_holders();
    holder->set_worker_id(h.worker_id);
    holder->set_held_tokens(h.held_tokens);
    holder->set_tier(h.tier == KvTier::kHost ? v2::KV_TIER_HOST : v2::KV_TIER_GPU);
  }
  out->set_pinned_until_ms(r.pinned_until_ms);
  out->set_last_used_ms(r.last_used_ms);
}

void ToProto(const WorkerRecord& r, v2::WorkerRecord* out) {
  out->set_worker_id(r.info.worker_id);
  out->set_address(r.info.address);
  out->set_model(r.info.model);
  ToProto(r.load, out->mutable_load());
  out->set_lease_expires_ms(r.lease_expires_ms);
  out->set_chunks(r.chunks);
  out->set_block_size(r.info.block_size);
  out->set_applied_seq(r.applied_seq);
  out->set_kv_numerics(r.info.kv_numerics);
}

void ToProto(const RegistryStats& s, v2::GetStatsResponse* out) {
  out->set_chunks(s.chunks);
  out->set_workers(s.workers);
  out->set_resolves(s.resolves);
  out->set_resolve_hits(s.resolve_hits);
  out->set_chunks_forgotten(s.chunks_forgotten);
  out->set_resyncs_requested(s.resyncs_requested);
  out->set_leases_expired(s.leases_expired);
}

int64_t MaxResyncRequestBytes(int64_t chunks) {
  static const std::pair<int64_t, int64_t> kSizes =
      Sizes<v2::ResyncRequest>([](v2::ResyncRequest* r) { SetLongestChunk(r->add_chunks()); });
  return kSizes.first + chunks * kSizes.second;
}

int64_t MaxReportEventsRequestBytes(int64_t events) {
  static const std::pair<int64_t, int64_t> kSizes =
      Sizes<v2::ReportEventsRequest>([](v2::ReportEventsRequest* r) {
        v2::ChunkEvent* e = r->add_events();
        e->set_type(v2::ChunkEvent::TYPE_EVICTED);
        SetLongestChunk(e->mutable_chunk());
      });
  return kSizes.first + events * kSizes.second;
}

}  // namespace cascade::registry::wire
