// Metrics: the exact Prometheus text format for counters, gauges and histograms with labels, exact
// totals under concurrency, and the HTTP endpoint (GET /metrics, /healthz, 404, busy port).
#include "services/common/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/metrics_http.h"
#include "tests/services_common/test_util.h"

namespace cascade::common {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

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
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"0.125\"} 2\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"0.5\"} 3\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"1\"} 3\n"
            "cascade:ttft_seconds_bucket{model=\"m1\",le=\"+Inf\"} 4\n"
            "cascade:ttft_seconds_sum{model=\"m1\"} 2.5625\n"
            "cascade:ttft_seconds_count{model=\"m1\"} 4\n");
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

  (*server)->Stop();
  EXPECT_EQ(testing::HttpGet(port, "/metrics"), "");
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
