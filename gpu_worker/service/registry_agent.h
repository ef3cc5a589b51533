// Keeps the chunk registry informed about one worker: registers (and re-registers after a
// registry restart, detected by a new epoch or NOT_FOUND), heartbeats with load, streams chunk
// stored/evicted events in numbered batches, resyncs everything held when a batch may have been
// lost, and applies the registry's evict requests. The registry is soft state: while it is
// unreachable the worker keeps serving and the agent keeps retrying.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cascade/v1/registry.grpc.pb.h"
#include "gpu_worker/engine/engine.h"
#include "common/transport.h"

namespace cascade::worker {

struct AgentOptions {
  std::string worker_id;
  std::string address;  // what the gateway dials
  std::string model;
  int block_size = 16;
  int64_t max_context = 0;
  int32_t vocab_size = 0;
  int64_t heartbeat_ms = 1000;
  std::string registry_address;
  common::ClientTlsOptions tls;
};

// Thread-safe. Owns one background thread.
class RegistryAgent {
 public:
  // Starts the background thread; an unreachable registry is not an error (it retries).
  static absl::StatusOr<std::unique_ptr<RegistryAgent>> Start(const AgentOptions& options,
                                                              engine::Engine* engine);
  ~RegistryAgent();

  // Wakes the thread to forward new chunk events (called after engine steps).
  void OnStep();
  // Tells the registry this worker is leaving (drain); further calls are no-ops.
  void Deregister();
  void Stop();

  bool registered() const;

 private:
  RegistryAgent(const AgentOptions& options, engine::Engine* engine,
                std::shared_ptr<grpc::Channel> channel);
  void Run();
  bool Register();
  bool Resync();
  void Heartbeat();
  void Report();

  const AgentOptions options_;
  engine::Engine* const engine_;
  std::unique_ptr<cascade::v1::ChunkRegistry::Stub> stub_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;         // guarded by mu_
  bool wake_ = false;         // guarded by mu_
  bool registered_ = false;   // guarded by mu_
  bool left_ = false;         // guarded by mu_; Deregister() ran

  // Owned by the agent thread.
  std::string epoch_;
  uint64_t next_seq_ = 1;
  bool needs_resync_ = true;
  int64_t last_heartbeat_ms_ = 0;
  int32_t sent_running_ = -1;  // load in the last heartbeat
  int32_t sent_waiting_ = -1;
  static constexpr int64_t kMinHeartbeatGapMs = 50;
  int failures_ = 0;
  std::thread thread_;
};

}  // namespace cascade::worker
