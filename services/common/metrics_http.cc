// The /metrics HTTP server: see metrics_http.h.
#include "services/common/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/absl_compat.h"
#include "services/common/log.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

constexpr size_t kMaxRequestBytes = 16 * 1024;

void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away; nothing useful to do
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string Response(int code, std::string_view reason, std::string_view content_type,
                     std::string_view body, bool head_only) {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", ToAbsl(reason), "\r\nContent-Type: ",
                                 ToAbsl(content_type), "\r\nContent-Length: ", body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (!head_only) out.append(body);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry,
    std::function<bool()> healthy) {
  std::string address = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  std::string service = absl::StrCat(port);
  std::string bind_host = host;
  if (bind_host.size() > 2 && bind_host.front() == '[' && bind_host.back() == ']') {
    bind_host = bind_host.substr(1, bind_host.size() - 2);
  }
  if (int rc = ::getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), service.c_str(),
                             &hints, &result);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    // SO_REUSEADDR lets a restarted server rebind past TIME_WAIT; without SO_REUSEPORT, a port
    // held by a live process still fails, which is what we want.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 64) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(result);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot listen on ", address, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int bound_port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("metrics server: pipe: ", std::strerror(errno)));
  }
  auto server = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
      fd, pipe_fds[0], pipe_fds[1], bound_port, registry, std::move(healthy)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                                     const MetricsRegistry* registry,
                                     std::function<bool()> healthy)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      registry_(registry),
      healthy_(std::move(healthy)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  char byte = 'q';
  (void)!::write(wake_write_fd_, &byte, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_fd_);
  ::close(wake_write_fd_);
}

void MetricsHttpServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      LogError("metrics_http_poll_failed", {{"error", std::strerror(errno)}});
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      HandleConnection(conn);
      ::close(conn);
    }
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  // A slow or silent client must not wedge the only serving thread.
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  std::string_view first_line = request;
  first_line = first_line.substr(0, first_line.find("\r\n"));
  std::vector<absl::string_view> parts = absl::StrSplit(ToAbsl(first_line), ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    WriteAll(fd, Response(400, "Bad Request", "text/plain", "bad request\n", false));
    return;
  }
  absl::string_view method = parts[0];
  absl::string_view path = parts[1];
  path = path.substr(0, path.find('?'));
  bool head = method == "HEAD";
  if (method != "GET" && !head) {
    WriteAll(fd, Response(405, "Method Not Allowed", "text/plain", "use GET\n", false));
    return;
  }
  if (path == "/metrics") {
    WriteAll(fd, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                          registry_->RenderText(), head));
  } else if (path == "/healthz") {
    bool ok = !healthy_ || healthy_();
    WriteAll(fd, ok ? Response(200, "OK", "text/plain", "ok\n", head)
                    : Response(503, "Service Unavailable", "text/plain", "not serving\n", head));
  } else {
    WriteAll(fd, Response(404, "Not Found", "text/plain", "not found; try /metrics\n", head));
  }
}

}  // namespace cascade::common
