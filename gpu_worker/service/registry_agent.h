// Keeps the chunk registry informed about one worker: registers (and re-registers after a
// registry restart, detected by a new epoch or NOT_FOUND), heartbeats with load, streams chunk
// stored/evicted events in numbered batches, resyncs everything held when a batch may have been
// lost, and applies the registry's evict and pin requests. The registry is soft state: while it
// is unreachable the worker keeps serving and the agent keeps retrying. It talks through a
// registry::RegistryClient, so tests drive it against an in-process registry.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cache_service/client/registry_client.h"
#include "common/mutex.h"
#include "common/transport.h"
#include "gpu_worker/engine/engine.h"

namespace cascade::worker {

struct AgentOptions {
  std::string worker_id;
  std::string address;  // what the gateway dials
  std::string model;
  int block_size = 16;
  int64_t max_context = 0;
  int32_t vocab_size = 0;
  int64_t heartbeat_ms = 1000;
  std::string registry_address;  // for Start(options, engine) and the logs
  common::ClientTlsOptions tls;  // for Start(options, engine)
};

// Thread-safe. Owns one background thread.
class RegistryAgent {
 public:
  // Dials options.registry_address (gRPC, TLS per options.tls) and starts the background thread;
  // an unreachable registry is not an error (it retries).
  static absl::StatusOr<std::unique_ptr<RegistryAgent>> Start(const AgentOptions& options,
                                                              engine::Engine* engine);
  // Starts the background thread over `client`. `engine` is not owned and must outlive the agent.
  static std::unique_ptr<RegistryAgent> Start(const AgentOptions& options, engine::Engine* engine,
                                              std::unique_ptr<registry::RegistryClient> client);
  ~RegistryAgent();

  // Wakes the thread to forward new chunk events (called after engine steps).
  void OnStep();
  // Tells the registry this worker is leaving (drain); further calls are no-ops.
  void Deregister();
  void Stop();

  bool registered() const;

 private:
  RegistryAgent(const AgentOptions& options, engine::Engine* engine,
                std::unique_ptr<registry::RegistryClient> client);
  void Run();
  bool Register();
  bool Resync();
  void Heartbeat();
  void Report();
  void SetRegistered(bool registered);

  // Set at construction.
  const AgentOptions options_;
  engine::Engine* const engine_;
  const std::unique_ptr<registry::RegistryClient> client_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;  // Deregister() ran

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
