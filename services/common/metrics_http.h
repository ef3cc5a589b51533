// A tiny HTTP/1.1 server for scrapers and probes, on its own port: GET /metrics renders a
// MetricsRegistry, GET /healthz answers 200 "ok" or 503 "not serving". One connection at a time,
// `Connection: close`; it serves Prometheus and kubelet, not browsers at scale.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/common/metrics.h"

namespace cascade::common {

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving on a thread. `registry` must
  // outlive the server. `healthy` (optional) decides /healthz; without it /healthz is always ok.
  // Returns Unavailable naming the address when it cannot bind (e.g. the port is in use).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const MetricsRegistry* registry,
      std::function<bool()> healthy = nullptr);

  // Stops the thread and closes the socket. Idempotent; the destructor calls it.
  void Stop();
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                    const MetricsRegistry* registry, std::function<bool()> healthy);
  void Serve();
  void HandleConnection(int fd);

  // Set at construction.
  const int listen_fd_;
  const int wake_read_fd_;   // Stop() writes to wake_write_fd_ so poll() returns
  const int wake_write_fd_;
  const int port_;
  const MetricsRegistry* const registry_;
  const std::function<bool()> healthy_;
  std::thread thread_;
  bool stopped_ = false;  // touched only by the owner's thread, in Stop()
};

}  // namespace cascade::common
