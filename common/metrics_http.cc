// The /metrics HTTP server on cpp-httplib: see metrics_http.h.
#include "common/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cascade::common {

// What the handlers read. Stop() clears it under `mu`, so a request that completes after Stop()
// (a slow client the grace period gave up on) never touches the registry or the callback.
struct MetricsHttpServer::State {
  std::mutex mu;
  const MetricsRegistry* registry = nullptr;  // null once stopped
  std::function<bool()> healthy;
  // Set by the accept loop's thread when it returns (all its connection threads joined).
  bool done = false;
  std::condition_variable done_cv;
};

namespace {

constexpr int kListenBacklog = 128;
constexpr char kMetricsType[] = "text/plain; version=0.0.4; charset=utf-8";

void Plain(httplib::Response& res, int status, const char* body) {
  res.status = status;
  res.set_content(body, "text/plain");
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry,
    std::function<bool()> healthy, const MetricsHttpLimits& limits) {
  const std::string address = absl::StrCat(host, ":", port);
  std::string bind_host = host;
  if (bind_host.size() > 2 && bind_host.front() == '[' && bind_host.back() == ']') {
    bind_host = bind_host.substr(1, bind_host.size() - 2);
  }
  if (bind_host.empty()) bind_host = "0.0.0.0";

  auto state = std::make_shared<State>();
  state->registry = registry;
  state->healthy = std::move(healthy);
  auto http = std::make_shared<httplib::Server>();
  const int threads = std::max(1, limits.threads);
  http->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http->set_read_timeout(limits.read_timeout_s, 0);
  http->set_write_timeout(limits.write_timeout_s, 0);
  // One request per connection: a client cannot park on a kept-alive connection, and the
  // answer says `Connection: close` as before. The wait for that one request is bounded too.
  http->set_keep_alive_max_count(1);
  http->set_keep_alive_timeout(limits.read_timeout_s);
  // httplib's default also sets SO_REUSEPORT, which would let a second server share a busy
  // port; SO_REUSEADDR alone rebinds past TIME_WAIT and still fails on a live listener.
  auto listen_fd = std::make_shared<int>(-1);
  http->set_socket_options([listen_fd](socket_t fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    *listen_fd = fd;
  });

  http->Get("/metrics", [state](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->registry == nullptr) return Plain(res, 503, "stopping\n");
    res.status = 200;
    res.set_content(state->registry->RenderText(), kMetricsType);
  });
  http->Get("/healthz", [state](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(state->mu);
    const bool ok = state->registry != nullptr && (!state->healthy || state->healthy());
    if (ok) return Plain(res, 200, "ok\n");
    Plain(res, 503, "not serving\n");
  });
  http->Get(".*", [](const httplib::Request&, httplib::Response& res) {
    Plain(res, 404, "not found; try /metrics\n");
  });
  const auto not_allowed = [](const httplib::Request&, httplib::Response& res) {
    Plain(res, 405, "use GET\n");
  };
  http->Post(".*", not_allowed);
  http->Put(".*", not_allowed);
  http->Patch(".*", not_allowed);
  http->Delete(".*", not_allowed);
  http->Options(".*", not_allowed);

  int bound_port = port;
  errno = 0;
  if (port == 0) {
    bound_port = http->bind_to_any_port(bind_host);
  } else if (!http->bind_to_port(bind_host, port)) {
    bound_port = -1;
  }
  if (bound_port <= 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat("metrics server: cannot listen on ", address, ": ",
                                               err != 0 ? std::strerror(err) : "bind failed"));
  }

  // Debian's build listens with a backlog of 5: a burst of probes and scrapers past it would
  // see dropped SYNs and wait a second for the retry. Linux lets listen() raise it in place.
  if (*listen_fd >= 0) ::listen(*listen_fd, kListenBacklog);

  auto server = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(state, http, bound_port, std::max(0, limits.stop_grace_ms)));
  server->thread_ = std::thread([state, http] {
    if (!http->listen_after_bind()) LogError("metrics_http_listen_failed", {});
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->done_cv.notify_all();
  });
  // httplib's stop() only acts on a running server: wait until the loop runs (or gave up).
  for (int i = 0; i < 5000 && !http->is_running(); ++i) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->done) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

MetricsHttpServer::MetricsHttpServer(std::shared_ptr<State> state,
                                     std::shared_ptr<httplib::Server> http, int port,
                                     int stop_grace_ms)
    : state_(std::move(state)),
      http_(std::move(http)),
      port_(port),
      stop_grace_ms_(stop_grace_ms) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  http_->stop();  // closes the listening socket; the loop then joins its connection threads
  std::unique_lock<std::mutex> lock(state_->mu);
  // From here on no handler reads the registry or calls `healthy`.
  state_->registry = nullptr;
  state_->healthy = nullptr;
  const bool done = state_->done_cv.wait_for(lock, std::chrono::milliseconds(stop_grace_ms_),
                                             [&] { return state_->done; });
  lock.unlock();
  if (done) {
    thread_.join();
    return;
  }
  // A client is still trickling a request in (each byte within the read timeout). Leave the
  // loop to finish on its own: it holds the server and the state, and answers 503.
  LogError("metrics_http_stop_abandoned_slow_clients", {{"port", port_}});
  thread_.detach();
}

}  // namespace cascade::common
