// The gRPC ChunkRegistry service: translates cascade.v2 messages to the registry core and back;
// the only place absl::Status becomes grpc::Status. Every handler is short, non-blocking work
// on the core (no I/O), so it runs inline on the callback thread with the default reactor.
#pragma once

#include "cache_service/registry/registry.h"
#include "cascade/v2/registry.grpc.pb.h"
#include "common/internal_auth.h"
#include "common/metrics.h"

namespace cascade::registry {

class RegistryService final : public cascade::v2::ChunkRegistryService::CallbackService {
 public:
  // `registry` and `metrics` are not owned and must outlive the service; `metrics` may be null
  // (MetricsRegistry::Default()). Thread-safe: handlers run concurrently.
  // With `check_worker_identity`, RPCs that act for a worker id (RegisterWorker, Heartbeat,
  // ReportEvents, Resync, DeregisterWorker) are refused PERMISSION_DENIED unless the caller's
  // certificate names that worker (or admin); calls without a certificate pass, since internal
  // auth refuses them before a handler runs (common::CheckWorkerIdentity).
  explicit RegistryService(Registry* registry, common::MetricsRegistry* metrics = nullptr,
                           bool check_worker_identity = true);

  using Ctx = grpc::CallbackServerContext;
  using Reactor = grpc::ServerUnaryReactor;
  Reactor* Resolve(Ctx* ctx, const v2::ResolveRequest* req, v2::ResolveResponse* resp) override;
  Reactor* RegisterWorker(Ctx* ctx, const v2::RegisterWorkerRequest* req,
                          v2::RegisterWorkerResponse* resp) override;
  Reactor* Heartbeat(Ctx* ctx, const v2::HeartbeatRequest* req,
                     v2::HeartbeatResponse* resp) override;
  Reactor* ReportEvents(Ctx* ctx, const v2::ReportEventsRequest* req,
                        v2::ReportEventsResponse* resp) override;
  Reactor* Resync(Ctx* ctx, const v2::ResyncRequest* req, v2::ResyncResponse* resp) override;
  Reactor* DeregisterWorker(Ctx* ctx, const v2::DeregisterWorkerRequest* req,
                            v2::DeregisterWorkerResponse* resp) override;
  Reactor* ListChunks(Ctx* ctx, const v2::ListChunksRequest* req,
                      v2::ListChunksResponse* resp) override;
  Reactor* GetChunk(Ctx* ctx, const v2::GetChunkRequest* req, v2::GetChunkResponse* resp) override;
  Reactor* PinChunk(Ctx* ctx, const v2::PinChunkRequest* req, v2::PinChunkResponse* resp) override;
  Reactor* UnpinChunk(Ctx* ctx, const v2::UnpinChunkRequest* req,
                      v2::UnpinChunkResponse* resp) override;
  Reactor* EvictChunk(Ctx* ctx, const v2::EvictChunkRequest* req,
                      v2::EvictChunkResponse* resp) override;
  Reactor* ListWorkers(Ctx* ctx, const v2::ListWorkersRequest* req,
                       v2::ListWorkersResponse* resp) override;
  Reactor* GetStats(Ctx* ctx, const v2::GetStatsRequest* req, v2::GetStatsResponse* resp) override;

 private:
  grpc::Status CheckCaller(const Ctx& ctx, const std::string& worker_id) const;

  // Set at construction.
  Registry* const registry_;
  const bool check_worker_identity_;
  common::Histogram* const resolve_seconds_;
  common::Counter* const resolve_errors_;
};

// Who may call what on the registry under internal auth: workers register, heartbeat and report
// for themselves; the gateway resolves and pins (its RegisterChunk); everything else is admin.
common::MethodPolicy RegistryMethodPolicy();

}  // namespace cascade::registry
