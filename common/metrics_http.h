// The HTTP endpoint for scrapers and probes, on its own port: GET (or HEAD) /metrics renders a
// MetricsRegistry, /healthz answers 200 "ok" or 503 "not serving", anything else 404, other
// methods 405. Served by cpp-httplib (Debian's libcpp-httplib) on a pool of threads with short
// timeouts and one request per connection (`Connection: close`), so idle or slow clients hold
// at most a thread each for a bounded time and cannot starve a kubelet probe; a request may be
// at most `max_request_bytes` long and no body is ever read, so none can grow the server's memory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace cascade::common {

// How the server bounds what one client can hold. The defaults are what servers use.
struct MetricsHttpLimits {
  int threads = 64;          // connections served at once; more wait for a free thread
  int read_timeout_s = 2;    // silence allowed between request bytes (and before the first)
  int write_timeout_s = 2;   // a client that reads nothing for this long is dropped
  int stop_grace_ms = 3000;  // Stop() waits this long for requests in flight, then abandons them
  int max_request_bytes = 16 << 10;  // request line and headers; longer requests get 400
};

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving. `registry` must outlive the
  // server (or its Stop()). `healthy` (optional) decides /healthz; without it /healthz is always
  // ok. Returns Unavailable naming the address when it cannot bind (e.g. the port is in use).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const MetricsRegistry* registry,
      std::function<bool()> healthy = nullptr, const MetricsHttpLimits& limits = {});

  // Stops accepting, waits up to `stop_grace_ms` for requests in flight, and returns; after it
  // returns `registry` and `healthy` are never touched again (a client still trickling a
  // request in then gets 503, from a server left to finish on its own). Idempotent; the
  // destructor calls it. Call from one thread.
  void Stop();
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  struct State;
  MetricsHttpServer(std::shared_ptr<State> state, std::shared_ptr<httplib::Server> http, int port,
                    int stop_grace_ms);

  // Set at construction.
  const std::shared_ptr<State> state_;  // shared with the handlers
  std::shared_ptr<httplib::Server> http_;
  const int port_;
  const int stop_grace_ms_;
  std::thread thread_;    // runs the accept loop
  bool stopped_ = false;  // touched only by the owner's thread, in Stop()
};

}  // namespace cascade::common
