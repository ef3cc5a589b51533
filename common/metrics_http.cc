// The /metrics HTTP server on cpp-httplib: see metrics_http.h.
#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

// Milliseconds for poll(), from httplib's seconds.
int PollMs(int seconds) { return std::max(0, seconds) * 1000; }

// A connection's socket as httplib reads and writes it, except that the request may be at most
// `max_request_bytes` long: httplib keeps every header line of a request in memory, with no
// limit on their number, so a client streaming header lines grew the server without bound.
// Reading past the cap fails like a closed connection (httplib then answers 400).
class BoundedSocketStream final : public httplib::Stream {
 public:
  BoundedSocketStream(int fd, const MetricsHttpLimits& limits)
      : fd_(fd),
        read_timeout_ms_(PollMs(limits.read_timeout_s)),
        write_timeout_ms_(PollMs(limits.write_timeout_s)),
        left_(static_cast<size_t>(std::max(0, limits.max_request_bytes))) {}

  bool is_readable() const override { return Wait(POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return Wait(POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (left_ == 0 || !is_readable()) return -1;
    const ssize_t n = ::recv(fd_, ptr, std::min(size, left_), 0);
    if (n > 0) left_ -= static_cast<size_t>(n);
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(&::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(&::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  bool Wait(short events, int timeout_ms) const {
    pollfd p{fd_, events, 0};
    int n;
    do {
      n = ::poll(&p, 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & events) != 0;
  }
  void Address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    char text[INET6_ADDRSTRLEN] = {};
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) ip = text;
      port = ntohs(in->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
      if (::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)) != nullptr) ip = text;
      port = ntohs(in6->sin6_port);
    }
  }

  const int fd_;
  const int read_timeout_ms_;
  const int write_timeout_ms_;
  size_t left_;  // request bytes still allowed
};

// httplib's server, serving each connection through a BoundedSocketStream. One request per
// connection, as httplib does with keep_alive_max_count 1: wait for its first byte (at most the
// read timeout, giving up early once the server stops), answer it, close.
class BoundedServer final : public httplib::Server {
 public:
  explicit BoundedServer(const MetricsHttpLimits& limits) : limits_(limits) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    bool ok = false;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::seconds(std::max(0, limits_.read_timeout_s));
    for (;;) {
      pollfd p{sock, POLLIN, 0};
      const int n = ::poll(&p, 1, 100);
      if (n > 0) {
        BoundedSocketStream stream(sock, limits_);
        bool closed = false;
        ok = process_request(stream, /*close_connection=*/true, closed, nullptr);
        break;
      }
      if ((n < 0 && errno != EINTR) || svr_sock_ == INVALID_SOCKET ||
          std::chrono::steady_clock::now() >= deadline) {
        break;
      }
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  const MetricsHttpLimits limits_;
};

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
  auto http = std::make_shared<BoundedServer>(limits);
  const int threads = std::max(1, limits.threads);
  http->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // BoundedServer applies the timeouts and serves one request per connection: a client cannot
  // park on a kept-alive connection, and the answer says `Connection: close` as before.
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
  // Nothing here takes a request body, and httplib reads one whole into memory (no size limit)
  // before its handlers run: other methods are refused before that, and the connection closes
  // with the body unread.
  http->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    Plain(res, 405, "use GET\n");
    return httplib::Server::HandlerResponse::Handled;
  });

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
