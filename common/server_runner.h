// Runs one Cascade gRPC server: listens on host:port, serves the registered services plus
// grpc.health.v1.Health and server reflection, applies keepalive/message-size/connection-age
// settings and TLS, serves /metrics on its own port, and drains gracefully on SIGTERM/SIGINT or
// on request: health -> NOT_SERVING, drain callbacks, in-flight RPCs finish within a bound, stop.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/health.h"
#include "common/internal_auth.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/transport.h"

namespace cascade::common {

struct ServerOptions {
  // Names the server in the ready line "<name> serving on HOST:PORT" and in logs.
  std::string name = "cascade-server";
  std::string host = "0.0.0.0";
  int port = 0;  // 0 picks a free port; ServerRunner::port() reports it
  // The /metrics and /healthz HTTP port: -1 disables it, 0 picks a free one.
  int metrics_port = -1;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;  // both send and receive
  // Bound on draining in-flight RPCs at shutdown; those still running then are cancelled.
  absl::Duration drain_timeout = absl::Seconds(10);
  // Connections are closed (GOAWAY) after this age, plus a grace for their RPCs, so clients
  // reconnect and rebalance across replicas. Zero or infinite disables.
  absl::Duration max_connection_age = absl::Minutes(5);
  absl::Duration max_connection_age_grace = absl::Seconds(30);
  KeepaliveOptions keepalive;
  ServerTlsOptions tls;
  // Internal auth (mTLS with roles, internal_auth.h) for the registry and workers; replaces
  // `tls` (setting both is an error). Unset: `tls` alone decides (plaintext when it is off).
  std::optional<InternalServerAuth> internal_auth;
  LogLevel log_level = LogLevel::kInfo;     // applied by RunServer
  LogFormat log_format = LogFormat::kText;  // applied by RunServer
  // Drain on SIGTERM/SIGINT. Tests that run several servers in one process may turn it off.
  bool handle_signals = true;
  bool print_ready_line = true;
  MetricsRegistry* metrics = nullptr;  // nullptr: MetricsRegistry::Default()
};

// A service to register, with the name health checks use for it (its full proto name, e.g.
// cascade::v2::GatewayService::service_full_name()). grpc::Service does not expose its own name.
struct ServiceRegistration {
  grpc::Service* service;  // not owned; must outlive the server
  std::string name;
};

// Thread-safe after Start() unless noted. Typical use is RunServer() below; tests drive the
// runner directly to shut it down programmatically.
class ServerRunner {
 public:
  explicit ServerRunner(ServerOptions options);
  // Shuts down (with the configured drain timeout) if still running.
  ~ServerRunner();
  ServerRunner(const ServerRunner&) = delete;
  ServerRunner& operator=(const ServerRunner&) = delete;

  // REQUIRES: before Start(). Not thread-safe.
  void AddService(ServiceRegistration registration);
  // Runs during shutdown after health went NOT_SERVING and before the server stops accepting
  // RPCs, e.g. a worker deregistering from the registry. REQUIRES: before Start().
  void AddDrainCallback(std::function<void()> callback);
  // The same, given the drain's deadline: the whole drain (these callbacks, then the server's
  // wait for in-flight RPCs) ends by it, e.g. a service letting its streams finish while the
  // server still holds their connections open.
  void AddDrainCallback(std::function<void(absl::Time deadline)> callback);

  // Binds, starts serving, marks every service and "" SERVING and prints the ready line.
  // Errors (port in use, unreadable TLS files, bad options) come back as a Status naming the
  // cause. REQUIRES: called once.
  absl::Status Start();

  int port() const { return port_; }                  // the bound port, after Start()
  int metrics_port() const { return metrics_port_; }  // -1 when disabled
  // "HOST:PORT" as printed in the ready line.
  std::string address() const;
  // "127.0.0.1:PORT" (or the host when it is not a wildcard): what a local client dials.
  std::string local_address() const;
  HealthService& health() { return health_; }
  grpc::Server* server() { return server_.get(); }

  // Asks Wait() to shut down; returns at once. Thread-safe; what the signal handler triggers.
  void RequestShutdown();
  // Blocks until a shutdown is requested, then runs Shutdown(drain_timeout) and returns.
  void Wait();
  // Graceful shutdown, synchronous: health NOT_SERVING for all, drain callbacks, end Watch
  // streams, stop accepting RPCs and wait for in-flight ones until `drain` after the start (then
  // cancel them), stop /metrics. Idempotent; concurrent callers wait for the first to finish.
  void Shutdown(absl::Duration drain);
  bool shutdown_requested() const;

 private:
  enum class State { kNew, kRunning, kShuttingDown, kStopped };

  // Set at construction, or in Start() before the server runs.
  const ServerOptions options_;
  std::vector<ServiceRegistration> services_;
  std::vector<std::function<void(absl::Time)>> drain_callbacks_;
  HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  int port_ = 0;
  int metrics_port_ = -1;
  int signal_callback_id_ = 0;  // 0: none registered

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
};

// What a server's main() calls after parsing flags: applies the log settings, starts a
// ServerRunner with `services`, calls `on_started` (if given; e.g. to register with the
// registry, or start background work), waits for SIGTERM/SIGINT and drains. Returns OK after a
// clean shutdown, or the error that kept the server from starting.
absl::Status RunServer(const ServerOptions& options,
                       const std::vector<ServiceRegistration>& services,
                       const std::function<absl::Status(ServerRunner&)>& on_started = nullptr);

}  // namespace cascade::common
