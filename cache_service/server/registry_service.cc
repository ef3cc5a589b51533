// ChunkRegistry handlers: parse (INVALID_ARGUMENT naming the field), call the core, translate.
#include "cache_service/server/registry_service.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cache_service/wire/registry_wire.h"

namespace cascade::registry {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(wire::ToGrpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

common::MetricsRegistry& Metrics(common::MetricsRegistry* m) {
  return m != nullptr ? *m : common::MetricsRegistry::Default();
}

}  // namespace

common::MethodPolicy RegistryMethodPolicy() {
  using common::Role;
  const std::string prefix = absl::StrCat("/", v2::ChunkRegistryService::service_full_name(), "/");
  common::MethodPolicy p;
  for (const char* m : {"RegisterWorker", "Heartbeat", "ReportEvents", "Resync"}) {
    p[prefix + m] = {Role::kWorker};
  }
  p[prefix + "DeregisterWorker"] = {Role::kWorker, Role::kAdmin};
  p[prefix + "Resolve"] = {Role::kGateway, Role::kAdmin};
  p[prefix + "PinChunk"] = {Role::kGateway, Role::kAdmin};
  for (const char* m :
       {"UnpinChunk", "EvictChunk", "ListChunks", "GetChunk", "ListWorkers", "GetStats"}) {
    p[prefix + m] = {Role::kAdmin};
  }
  return p;
}

RegistryService::RegistryService(Registry* registry, common::MetricsRegistry* metrics,
                                 bool check_worker_identity)
    : registry_(registry),
      check_worker_identity_(check_worker_identity),
      resolve_seconds_(Metrics(metrics).GetHistogram("cascade_registry_resolve_seconds",
                                                     "Resolve handling time in the registry.",
                                                     common::ExponentialBuckets(1e-6, 2.0, 24))),
      resolve_errors_(Metrics(metrics).GetCounter("cascade_registry_resolve_errors_total",
                                                  "Resolve calls rejected (bad or oversize).")) {}

grpc::Status RegistryService::CheckCaller(const Ctx& ctx, const std::string& worker_id) const {
  return check_worker_identity_ ? common::CheckWorkerIdentity(ctx, worker_id) : grpc::Status::OK;
}

RegistryService::Reactor* RegistryService::Resolve(Ctx* ctx, const v2::ResolveRequest* req,
                                                   v2::ResolveResponse* resp) {
  auto start = std::chrono::steady_clock::now();
  std::vector<hash::ChunkSpec> specs = wire::SpecsFromProto(*req);
  absl::StatusOr<ResolveResult> r = registry_->Resolve({req->model(), req->cache_salt(), specs});
  if (r.ok()) {
    wire::ToProto(*r, resp);
  } else {
    resolve_errors_->Increment();
  }
  resolve_seconds_->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::RegisterWorker(Ctx* ctx,
                                                          const v2::RegisterWorkerRequest* req,
                                                          v2::RegisterWorkerResponse* resp) {
  if (grpc::Status who = CheckCaller(*ctx, req->worker_id()); !who.ok()) return Finish(ctx, who);
  absl::StatusOr<RegisterResult> r = registry_->RegisterWorker(wire::FromProto(*req));
  if (r.ok()) {
    resp->set_lease_ms(r->lease_ms);
    resp->set_registry_epoch(r->registry_epoch);
  }
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::Heartbeat(Ctx* ctx, const v2::HeartbeatRequest* req,
                                                     v2::HeartbeatResponse* resp) {
  if (grpc::Status who = CheckCaller(*ctx, req->worker_id()); !who.ok()) return Finish(ctx, who);
  absl::StatusOr<HeartbeatResult> r =
      registry_->Heartbeat(req->worker_id(), wire::FromProto(req->load()));
  if (r.ok()) wire::ToProto(*r, resp);
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::ReportEvents(Ctx* ctx,
                                                        const v2::ReportEventsRequest* req,
                                                        v2::ReportEventsResponse* resp) {
  if (grpc::Status who = CheckCaller(*ctx, req->worker_id()); !who.ok()) return Finish(ctx, who);
  absl::StatusOr<std::vector<ChunkEvent>> events = wire::EventsFromProto(*req);
  if (!events.ok()) return Finish(ctx, events.status());
  absl::StatusOr<ReportResult> r = registry_->ReportEvents(req->worker_id(), req->seq(), *events);
  if (r.ok()) {
    resp->set_resync_required(r->resync_required);
    resp->set_applied_seq(r->applied_seq);
  }
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::Resync(Ctx* ctx, const v2::ResyncRequest* req,
                                                  v2::ResyncResponse* resp) {
  if (grpc::Status who = CheckCaller(*ctx, req->worker_id()); !who.ok()) return Finish(ctx, who);
  absl::StatusOr<std::vector<HeldChunk>> chunks = wire::ChunksFromProto(*req);
  if (!chunks.ok()) return Finish(ctx, chunks.status());
  absl::StatusOr<int> n = registry_->Resync(req->worker_id(), *chunks, req->seq());
  if (n.ok()) resp->set_chunks(*n);
  return Finish(ctx, n.status());
}

RegistryService::Reactor* RegistryService::DeregisterWorker(Ctx* ctx,
                                                            const v2::DeregisterWorkerRequest* req,
                                                            v2::DeregisterWorkerResponse*) {
  if (grpc::Status who = CheckCaller(*ctx, req->worker_id()); !who.ok()) return Finish(ctx, who);
  return Finish(ctx, registry_->DeregisterWorker(req->worker_id()));
}

RegistryService::Reactor* RegistryService::ListChunks(Ctx* ctx, const v2::ListChunksRequest* req,
                                                      v2::ListChunksResponse* resp) {
  int64_t total = 0;
  absl::StatusOr<std::vector<ChunkRecord>> r =
      registry_->ListChunks(req->limit(), req->worker_id(), &total);
  if (r.ok()) {
    for (const ChunkRecord& c : *r) wire::ToProto(c, resp->add_chunks());
    resp->set_total(total);
  }
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::GetChunk(Ctx* ctx, const v2::GetChunkRequest* req,
                                                    v2::GetChunkResponse* resp) {
  absl::StatusOr<Hash128> h = wire::ParseHash(req->hash(), "hash");
  if (!h.ok()) return Finish(ctx, h.status());
  absl::StatusOr<ChunkRecord> r = registry_->GetChunk(*h);
  if (r.ok()) wire::ToProto(*r, resp->mutable_chunk());
  return Finish(ctx, r.status());
}

RegistryService::Reactor* RegistryService::PinChunk(Ctx* ctx, const v2::PinChunkRequest* req,
                                                    v2::PinChunkResponse* resp) {
  absl::StatusOr<Hash128> h = wire::ParseHash(req->hash(), "hash");
  if (!h.ok()) return Finish(ctx, h.status());
  std::optional<HeldChunk> chunk;
  if (req->has_chunk()) {
    v2::HeldChunk c = req->chunk();
    if (c.hash().empty()) c.set_hash(req->hash());  // the chunk's hash may be left implied
    absl::StatusOr<HeldChunk> parsed = wire::FromProto(c, "chunk");
    if (!parsed.ok()) return Finish(ctx, parsed.status());
    chunk = *parsed;
  }
  absl::StatusOr<int64_t> until = registry_->PinChunk(*h, req->ttl_seconds(), chunk);
  if (until.ok()) resp->set_pinned_until_ms(*until);
  return Finish(ctx, until.status());
}

RegistryService::Reactor* RegistryService::UnpinChunk(Ctx* ctx, const v2::UnpinChunkRequest* req,
                                                      v2::UnpinChunkResponse*) {
  absl::StatusOr<Hash128> h = wire::ParseHash(req->hash(), "hash");
  if (!h.ok()) return Finish(ctx, h.status());
  return Finish(ctx, registry_->UnpinChunk(*h));
}

RegistryService::Reactor* RegistryService::EvictChunk(Ctx* ctx, const v2::EvictChunkRequest* req,
                                                      v2::EvictChunkResponse* resp) {
  absl::StatusOr<Hash128> h = wire::ParseHash(req->hash(), "hash");
  if (!h.ok()) return Finish(ctx, h.status());
  absl::StatusOr<int> n = registry_->EvictChunk(*h);
  if (n.ok()) resp->set_workers(*n);
  return Finish(ctx, n.status());
}

RegistryService::Reactor* RegistryService::ListWorkers(Ctx* ctx, const v2::ListWorkersRequest*,
                                                       v2::ListWorkersResponse* resp) {
  for (const WorkerRecord& w : registry_->ListWorkers()) wire::ToProto(w, resp->add_workers());
  return Finish(ctx, absl::OkStatus());
}

RegistryService::Reactor* RegistryService::GetStats(Ctx* ctx, const v2::GetStatsRequest*,
                                                    v2::GetStatsResponse* resp) {
  wire::ToProto(registry_->GetStats(), resp);
  return Finish(ctx, absl::OkStatus());
}

}  // namespace cascade::registry
