// The gRPC cascade.v2.WorkerService service: generation on token ids over an EngineLoop, engine
// stats, and chunk eviction. Translates proto <-> engine types and absl::Status -> grpc::Status.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cascade/v2/worker.grpc.pb.h"
#include "common/internal_auth.h"
#include "common/mutex.h"
#include "common/stream_gate.h"
#include "gpu_worker/engine/engine_loop.h"
#include "gpu_worker/service/kv_serve.h"
#include "gpu_worker/service/peer_fetch.h"

namespace cascade::worker {

class WorkerMetrics;

// Thread-safe; the loop must outlive the service and any RPC in flight.
class WorkerService final : public cascade::v2::WorkerService::CallbackService {
 public:
  // `peer`: how this worker fetches KV from the peer a request names (PeerKv); fetching is off
  // without a host KV tier (fetched blocks land there). `metrics` (optional) counts fetches.
  WorkerService(std::string worker_id, engine::EngineLoop* loop, PeerFetchOptions peer = {},
                WorkerMetrics* metrics = nullptr);

  grpc::ServerWriteReactor<cascade::v2::WorkerServiceGenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const cascade::v2::WorkerServiceGenerateRequest* request) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const cascade::v2::WorkerServiceGetStatsRequest* request,
                                     cascade::v2::WorkerServiceGetStatsResponse* response) override;
  grpc::ServerUnaryReactor* EvictChunks(grpc::CallbackServerContext* context,
                                        const cascade::v2::EvictChunksRequest* request,
                                        cascade::v2::EvictChunksResponse* response) override;
  grpc::ServerWriteReactor<cascade::v2::FetchKvResponse>* FetchKv(
      grpc::CallbackServerContext* context, const cascade::v2::FetchKvRequest* request) override;

  // Converts the request; INVALID_ARGUMENT names the field (e.g. a chunk hash that does not
  // match the worker's own hashing).
  absl::StatusOr<engine::Request> ToEngineRequest(
      const cascade::v2::WorkerServiceGenerateRequest& r) const;

  // What to fetch from the request's peer, or nullopt (no peer, fetching off, nothing to gain:
  // this worker already holds as much). `req` is the converted request.
  std::optional<FetchPlan> PlanFetch(const cascade::v2::WorkerServiceGenerateRequest& r,
                                     const engine::Request& req) const;
  // Counts a finished fetch (metrics and GetStats).
  void CountFetch(const FetchOutcome& outcome);
  PeerFetcher* fetcher() { return fetcher_.get(); }

  // Drain, before the server stops: new Generate streams are refused UNAVAILABLE ("draining";
  // a gateway resumes them on another worker) and those in flight may finish until `deadline`.
  // Once some had to finish, waits a moment more (`linger`, within the deadline) so that their
  // last messages and statuses reach the clients before the server closes the connections.
  void DrainStreams(absl::Time deadline, absl::Duration linger = absl::Milliseconds(200));

  // Tests: faults this worker injects into the blocks it sends to peers.
  void SetFetchFaultsForTesting(const FetchFaults& faults) {
    MutexLock lock(&faults_mu_);
    faults_ = faults;
  }

 private:
  const std::string worker_id_;
  engine::EngineLoop* const loop_;
  const std::unique_ptr<PeerFetcher> fetcher_;  // null when fetching is off
  WorkerMetrics* const metrics_;
  std::atomic<int64_t> fetches_ok_{0};
  std::atomic<int64_t> fetch_fallbacks_{0};
  Mutex faults_mu_;
  FetchFaults faults_ ABSL_GUARDED_BY(faults_mu_);
  common::StreamGate gate_;
};

// Who may call what on a worker under internal auth: Generate is the gateway's; FetchKv is other
// workers'; GetStats and EvictChunks are admin's.
common::MethodPolicy WorkerMethodPolicy();

}  // namespace cascade::worker
