// Metrics: the exact Prometheus text format for counters, gauges and histograms with labels, exact
// totals under concurrency, and the HTTP endpoint (GET /metrics, /healthz, 404, 405, busy port,
// probes answered while idle and slow clients hold connections, bounded Stop()).
#include "common/metrics.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace cascade::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// One request, reading the answer until the server closes or `within` passes; what arrived.
std::string HttpRequestWithin(int port, const std::string& request,
                              std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  int fd = testing::ConnectLoopback(port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

TEST(MetricsTest, RendersPrometheusTextFormat) {
  MetricsRegistry r;
  r.GetCounter("cascade:requests_total", "Requests served.", {{"model", "m1"}})->Increment(3);
  r.GetCounter("cascade:requests_total", "Requests served.", {{"model", "m\"2\\\n"}})->Increment();
  Gauge* g = r.GetGauge("cascade:num_requests_running", "Requests running now.");
  g->Set(5);
  g->Decrement(2);
  Histogram* h = r.GetHistogram("cascade:ttft_seconds", "Time to first token.", {0.125, 0.5, 1.0},
                                {{"model", "m1"}});
  for (double v : {0.0625, 0.125, 0.375, 2.0}) h->Observe(v);
  EXPECT_EQ(r.RenderText(),
            "# HELP cascade:num_requests_running Requests running now.\n"
            "# TYPE cascade:num_requests_running gauge\n"
            "cascade:num_requests_running 3\n"
            "# HELP cascade:requests_total Requests served.\n"
            "# TYPE cascade:requests_total counter\n"
            "cascade:requests_total{model=\"m\\\"2\\\\\\n\"} 1\n"
            "cascade:requests_total{model=\"m1\"} 3\n"
            "# HELP cascade:ttft_seconds Time to first token.\n"
            "# TYPE cascade:ttft_seconds histogram\n"
            "cascade:ttft_seconds_count{model=\"m1\"} 4\n"
            "cascade:ttft_seconds_sum{model=\"m1\"} 2.5625\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"0.125\"} 2\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"0.5\"} 3\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"1\"} 3\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"+Inf\"} 4\n");
}

TEST(MetricsTest, SameNameAndLabelsReturnSameSeriesInAnyLabelOrder) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("x_total", "x", {{"a", "1"}, {"b", "2"}});
  Counter* b = r.GetCounter("x_total", "x", {{"b", "2"}, {"a", "1"}});
  Counter* c = r.GetCounter("x_total", "x", {{"a", "1"}, {"b", "3"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Increment(-5);  // counters never go down
  EXPECT_EQ(a->Value(), 0);
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("c_total", "c");
  Histogram* h = r.GetHistogram("h", "h", LinearBuckets(1, 1, 3));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        h->Observe(i % 4);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c->Value(), 80000);
  Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.cumulative.back(), 80000u);
  EXPECT_EQ(s.cumulative[0], 40000u);  // 0 and 1 fall in le=1
  EXPECT_EQ(s.sum, 8 * 2500 * (0 + 1 + 2 + 3));
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_THAT(ExponentialBuckets(1, 2, 4), ::testing::ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(LinearBuckets(0.5, 0.5, 3), ::testing::ElementsAre(0.5, 1.0, 1.5));
}

TEST(MetricsDeathTest, ReusingANameWithAnotherTypeAborts) {
  MetricsRegistry r;
  r.GetCounter("dup", "d");
  EXPECT_DEATH(r.GetGauge("dup", "d"), "two types");
  EXPECT_DEATH(r.GetCounter("bad name", "d"), "bad metric name");
}

TEST(MetricsHttpTest, ServesMetricsHealthzAndNotFound) {
  MetricsRegistry r;
  r.GetCounter("cascade:up_total", "Up.")->Increment(7);
  std::atomic<bool> healthy{true};
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &r, [&] { return healthy.load(); });
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_GT(port, 0);

  std::string metrics = testing::HttpGet(port, "/metrics");
  EXPECT_THAT(metrics, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(metrics, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(metrics, HasSubstr("\r\n\r\n# HELP cascade:up_total Up.\n"));
  EXPECT_THAT(metrics, HasSubstr("cascade:up_total 7\n"));

  EXPECT_THAT(testing::HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 200 OK"));
  healthy = false;
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(testing::HttpGet(port, "/nope"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(testing::HttpGet(port, "/metrics?x=1"), HasSubstr("cascade:up_total 7\n"));
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), HasSubstr("Connection: close\r\n"));
  std::string post =
      HttpRequestWithin(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                        std::chrono::seconds(10));
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405"));
  std::string head = HttpRequestWithin(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                                       std::chrono::seconds(10));
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, Not(HasSubstr("cascade:up_total")));
  EXPECT_THAT(HttpRequestWithin(port, "garbage\r\n\r\n", std::chrono::seconds(10)),
              StartsWith("HTTP/1.1 400"));

  (*server)->Stop();
  EXPECT_EQ(testing::HttpGet(port, "/metrics"), "");
}

// Finding 6 of issue 9: the old server took one connection at a time, so 30 idle connections or
// one client dripping a byte every 1.5 s left /healthz unanswered for 10 s and more (a kubelet
// would have killed a healthy pod). Now each holds one thread of a pool, for a bounded time.
TEST(MetricsHttpTest, HealthzAnswersWhileIdleAndSlowClientsHoldConnections) {
  MetricsRegistry r;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &r, [] { return true; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    int fd = testing::ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  int drip = testing::ConnectLoopback(port);
  ASSERT_GE(drip, 0);
  std::atomic<bool> stop{false};
  std::thread dripper([&] {
    const std::string request = "GET /healthz HTTP/1.1\r\nHost: slow\r\n\r\n";
    for (char c : request) {
      for (int i = 0; i < 15 && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stop || ::send(drip, &c, 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all of them accepted
  // A liveness bound, not a benchmark: the answer takes milliseconds; the old server took
  // over a minute here (2 s per idle connection, one at a time).
  std::string answer = HttpRequestWithin(port, "GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n",
                                         std::chrono::seconds(3));
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answer, HasSubstr("\r\n\r\nok\n"));
  stop = true;
  dripper.join();
  ::close(drip);
  for (int fd : idle) ::close(fd);
}

// Resident memory of this process (the server runs in it), in bytes.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// The endpoint takes no request bodies, so it must not read one: httplib buffers a POST's body
// whole before any handler runs, with no size limit (a chunked or unbounded one is not even
// checked against a limit). A client streaming a body grew the server's memory without bound,
// and one announcing a body it never sent held a thread until the read timeout.
TEST(MetricsHttpTest, RequestBodiesAreRefusedUnreadSoTheyCannotFillMemory) {
  MetricsRegistry r;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &r, [] { return true; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  // Announced but never sent: the refusal comes at once, not after the 2 s read timeout.
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE"}) {
    std::string answer = HttpRequestWithin(
        port,
        absl::StrCat(method,
                     " /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n"),
        std::chrono::milliseconds(1000));
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 405")) << method;
  }

  // Streamed: 256 MB of a chunked body must not end up in the server's memory.
  const int64_t before = ResidentBytes();
  int fd = testing::ConnectLoopback(port);
  ASSERT_GE(fd, 0);
  const std::string head =
      "POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "40000000000\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  const std::string piece(1 << 20, 'a');
  for (int i = 0; i < 256; ++i) {
    if (::send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) <= 0) break;  // refused: closed
  }
  ::close(fd);
  const int64_t grown = ResidentBytes() - before;
  EXPECT_LT(grown, int64_t{64} << 20) << "resident memory grew by " << grown << " bytes";
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 200 OK"));
}

// httplib keeps every header line in memory and sets no limit on their number: a client that
// kept sending header lines grew the server by ~4 bytes per byte sent (183 MB for 47 MB).
TEST(MetricsHttpTest, AnEndlessHeaderIsCutOffAtTheRequestSizeLimit) {
  MetricsRegistry r;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &r, [] { return true; });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const int64_t before = ResidentBytes();
  int fd = testing::ConnectLoopback(port);
  ASSERT_GE(fd, 0);
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::string lines;
  for (int i = 0; i < 16384; ++i) absl::StrAppend(&lines, "X-Pad-", i, ": yyyyyyyyyyyyyyyy\r\n");
  int64_t sent = 0;
  for (int i = 0; i < 128 && sent < (int64_t{64} << 20); ++i) {
    const ssize_t n = ::send(fd, lines.data(), lines.size(), MSG_NOSIGNAL);
    if (n <= 0) break;  // refused: closed
    sent += n;
  }
  std::string answer;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 2000) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const int64_t grown = ResidentBytes() - before;
  EXPECT_LT(sent, int64_t{16} << 20) << "the server kept reading";
  EXPECT_LT(grown, int64_t{32} << 20) << "resident memory grew by " << grown << " bytes";
  EXPECT_THAT(testing::HttpGet(port, "/healthz"), StartsWith("HTTP/1.1 200 OK"));
}

// A client trickling a request in must not hold up shutdown past the grace period, and once
// Stop() returns the server is gone for new clients.
TEST(MetricsHttpTest, StopReturnsDespiteASlowClient) {
  MetricsRegistry r;
  MetricsHttpLimits limits;
  limits.stop_grace_ms = 500;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &r, nullptr, limits);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  int drip = testing::ConnectLoopback(port);
  ASSERT_GE(drip, 0);
  std::atomic<bool> stop{false};
  std::thread dripper([&] {
    const std::string request =
        "GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Pad: aaaaaaaaaaaaaa\r\n\r\n";
    for (char c : request) {
      if (stop || ::send(drip, &c, 1, MSG_NOSIGNAL) != 1) return;
      for (int i = 0; i < 5 && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  (*server)->Stop();
  // Generous: the grace is 0.5 s; without it Stop() waited for the whole request (~30 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(testing::ConnectLoopback(port), -1);
  stop = true;
  dripper.join();
  ::close(drip);
}

TEST(MetricsHttpTest, BusyPortIsAClearError) {
  MetricsRegistry r;
  auto first = MetricsHttpServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(first.ok());
  auto second = MetricsHttpServer::Start("127.0.0.1", (*first)->port(), &r);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("127.0.0.1:" + std::to_string((*first)->port())));
}

}  // namespace
}  // namespace cascade::common
