// The gRPC ChunkRegistry service: translates cascade.v1 messages to the registry core and back;
// the only place absl::Status becomes grpc::Status. Every handler is short, non-blocking work
// on the core (no I/O), so it runs inline on the callback thread with the default reactor.
#pragma once

#include "cache_service/registry/registry.h"
#include "cascade/v1/registry.grpc.pb.h"
#include "common/internal_auth.h"
#include "common/metrics.h"

namespace cascade::registry {

class RegistryService final : public cascade::v1::ChunkRegistry::CallbackService {
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
  Reactor* Resolve(Ctx* ctx, const v1::ResolveRequest* req, v1::ResolveResponse* resp) override;
  Reactor* RegisterWorker(Ctx* ctx, const v1::RegisterWorkerRequest* req,
                          v1::RegisterWorkerResponse* resp) override;
  Reactor* Heartbeat(Ctx* ctx, const v1::HeartbeatRequest* req,
                     v1::HeartbeatResponse* resp) override;
  Reactor* ReportEvents(Ctx* ctx, const v1::ReportEventsRequest* req,
                        v1::ReportEventsResponse* resp) override;
  Reactor* Resync(Ctx* ctx, const v1::ResyncRequest* req, v1::ResyncResponse* resp) override;
  Reactor* DeregisterWorker(Ctx* ctx, const v1::DeregisterWorkerRequest* req,
                            v1::DeregisterWorkerResponse* resp) override;
  Reactor* ListChunks(Ctx* ctx, const v1::ListChunksRequest* req,
                      v1::ListChunksResponse* resp) override;
  Reactor* GetChunk(Ctx* ctx, const v1::GetChunkRequest* req, v1::ChunkRecord* resp) override;
  Reactor* PinChunk(Ctx* ctx, const v1::PinChunkRequest* req, v1::PinChunkResponse* resp) override;
  Reactor* UnpinChunk(Ctx* ctx, const v1::UnpinChunkRequest* req,
                      v1::UnpinChunkResponse* resp) override;
  Reactor* EvictChunk(Ctx* ctx, const v1::EvictChunkRequest* req,
                      v1::EvictChunkResponse* resp) override;
  Reactor* ListWorkers(Ctx* ctx, const v1::ListWorkersRequest* req,
                       v1::ListWorkersResponse* resp) override;
  Reactor* GetStats(Ctx* ctx, const v1::GetStatsRequest* req, v1::RegistryStats* resp) override;

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
