// The gRPC cascade.v2.WorkerService service: generation on token ids over an EngineLoop, engine
// stats, and chunk eviction. Translates proto <-> engine types and absl::Status -> grpc::Status.
#pragma once

#include <string>

#include "cascade/v2/worker.grpc.pb.h"
#include "common/internal_auth.h"
#include "gpu_worker/engine/engine_loop.h"

namespace cascade::worker {

// Thread-safe; the loop must outlive the service and any RPC in flight.
class WorkerService final : public cascade::v2::WorkerService::CallbackService {
 public:
  WorkerService(std::string worker_id, engine::EngineLoop* loop);

  grpc::ServerWriteReactor<cascade::v2::WorkerServiceGenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const cascade::v2::WorkerServiceGenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const cascade::v2::WorkerServiceGetStatsRequest* request,
                                     cascade::v2::WorkerServiceGetStatsResponse* response) override;
  grpc::ServerUnaryReactor* EvictChunks(grpc::CallbackServerContext* context,
                                        const cascade::v2::EvictChunksRequest* request,
                                        cascade::v2::EvictChunksResponse* response) override;

  // Converts the request; INVALID_ARGUMENT names the field (e.g. a chunk hash that does not
  // match the worker's own hashing).
  absl::StatusOr<engine::Request> ToEngineRequest(
      const cascade::v2::WorkerServiceGenerateRequest& r) const;

 private:
  const std::string worker_id_;
  engine::EngineLoop* const loop_;
};

// Who may call what on a worker under internal auth: Generate is the gateway's; GetStats and
// EvictChunks are admin's.
common::MethodPolicy WorkerMethodPolicy();

}  // namespace cascade::worker
