// ServerRunner on loopback: health states per service, Watch sees the drain, in-flight streams
// finish within the drain bound and later calls are rejected, a stream that outlives the bound
// is cancelled, busy ports are clear errors, and /metrics is served on its own port.
#include "common/server_runner.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/bounded_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace cascade::common {
namespace {

using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

ServerOptions TestOptions() {
  ServerOptions o;
  o.name = "test-server";
  o.host = "127.0.0.1";
  o.port = 0;
  o.handle_signals = false;
  o.drain_timeout = absl::Seconds(5);
  return o;
}

std::shared_ptr<grpc::Channel> Connect(const ServerRunner& runner) {
  auto channel = MakeChannel(runner.local_address(), ClientTlsOptions{});
  EXPECT_TRUE(channel.ok());
  return *channel;
}

// Collects the statuses a Watch stream delivers, on its own thread.
class Watcher {
 public:
  Watcher(std::shared_ptr<grpc::Channel> channel, std::string service) {
    thread_ = std::thread([this, channel, service] {
      auto stub = grpc::health::v1::Health::NewStub(channel);
      grpc::health::v1::HealthCheckRequest request;
      request.set_service(service);
      context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      auto reader = stub->Watch(&context_, request);
      HealthCheckResponse response;
      while (reader->Read(&response)) {
        absl::MutexLock lock(&mu_);
        seen_.push_back(response.status());
      }
      grpc::Status status = reader->Finish();
      absl::MutexLock lock(&mu_);
      final_ = status;
      done_ = true;
    });
  }
  ~Watcher() {
    context_.TryCancel();
    thread_.join();
  }
  // Waits until the stream has delivered `n` statuses.
  bool WaitForCount(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n || done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout) && seen_.size() >= n;
  }
  bool WaitForEnd(absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  std::vector<int> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  grpc::Status final_status() {
    absl::MutexLock lock(&mu_);
    return final_;
  }

 private:
  grpc::ClientContext context_;
  absl::Mutex mu_;
  std::vector<int> seen_ ABSL_GUARDED_BY(mu_);
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

TEST(ServerRunnerTest, HealthReportsEachServiceAndNotFoundForUnknown) {
  testing::PacedStreamService gateway(1, absl::Milliseconds(1));
  ServerRunner runner(TestOptions());
  runner.AddService({&gateway, cascade::v2::GatewayService::service_full_name()});
  ASSERT_TRUE(runner.Start().ok());
  EXPECT_GT(runner.port(), 0);
  auto channel = Connect(runner);

  HealthCheckResponse::ServingStatus s;
  ASSERT_TRUE(testing::CheckHealth(channel, "", &s).ok());
  EXPECT_EQ(s, HealthCheckResponse::SERVING);
  ASSERT_TRUE(testing::CheckHealth(channel, "cascade.v2.GatewayService", &s).ok());
  EXPECT_EQ(s, HealthCheckResponse::SERVING);
  EXPECT_EQ(testing::CheckHealth(channel, "no.such.Service", &s).error_code(),
            grpc::StatusCode::NOT_FOUND);

  runner.health().SetServingStatus("cascade.v2.GatewayService", false);
  ASSERT_TRUE(testing::CheckHealth(channel, "cascade.v2.GatewayService", &s).ok());
  EXPECT_EQ(s, HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(testing::CheckHealth(channel, "", &s).ok());
  EXPECT_EQ(s, HealthCheckResponse::SERVING);
}

// The service name is the client's: echoing all of it made the status larger than a client
// accepts in trailers (a 100 KB name came back as some other error, not NOT_FOUND).
TEST(ServerRunnerTest, HealthCheckOfAHugeUnknownServiceIsABoundedNotFound) {
  ServerRunner runner(TestOptions());
  ASSERT_TRUE(runner.Start().ok());
  auto channel = Connect(runner);
  HealthCheckResponse::ServingStatus s;
  grpc::Status st = testing::CheckHealth(channel, std::string(100'000, 'x') + "\n\x01", &s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message().substr(0, 200);
  EXPECT_LE(st.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_THAT(st.error_message(), HasSubstr("unknown service 'xxx"));
  EXPECT_THAT(st.error_message(), HasSubstr("(100002 bytes)"));
}

TEST(ServerRunnerTest, WatchSeesChangesAndUnknownServiceAppearing) {
  ServerRunner runner(TestOptions());
  ASSERT_TRUE(runner.Start().ok());
  auto channel = Connect(runner);
  Watcher watcher(channel, "later.Service");
  ASSERT_TRUE(watcher.WaitForCount(1));
  runner.health().SetServingStatus("later.Service", true);
  ASSERT_TRUE(watcher.WaitForCount(2));
  runner.health().SetServingStatus("later.Service", false);
  ASSERT_TRUE(watcher.WaitForCount(3));
  EXPECT_THAT(watcher.seen(), ::testing::ElementsAre(HealthCheckResponse::SERVICE_UNKNOWN,
                                                     HealthCheckResponse::SERVING,
                                                     HealthCheckResponse::NOT_SERVING));
}

TEST(ServerRunnerTest, ShutdownFlipsHealthDrainsInFlightStreamThenRejectsCalls) {
  // 10 messages, 150 ms apart: the stream is in flight for ~1.5 s, within the 5 s bound.
  testing::PacedStreamService gateway(10, absl::Milliseconds(150));
  ServerRunner runner(TestOptions());
  runner.AddService({&gateway, cascade::v2::GatewayService::service_full_name()});
  bool drain_callback_ran = false;
  runner.AddDrainCallback([&] { drain_callback_ran = true; });
  ASSERT_TRUE(runner.Start().ok());
  auto channel = Connect(runner);

  Watcher watcher(channel, "");
  ASSERT_TRUE(watcher.WaitForCount(1));

  auto stub = cascade::v2::GatewayService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto reader = stub->Generate(&context, cascade::v2::GenerateRequest());
  cascade::v2::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));  // the stream is in flight

  absl::Time start = absl::Now();
  std::thread shutdown([&] { runner.Shutdown(absl::Seconds(5)); });

  // Health goes NOT_SERVING first, and the Watch stream is then ended.
  ASSERT_TRUE(watcher.WaitForEnd());
  EXPECT_THAT(watcher.seen(), ::testing::ElementsAre(HealthCheckResponse::SERVING,
                                                     HealthCheckResponse::NOT_SERVING));
  EXPECT_EQ(watcher.final_status().error_code(), grpc::StatusCode::UNAVAILABLE);

  // While draining, a new call is refused; the in-flight stream keeps going. (The Watch ends a
  // moment before the server stops accepting calls; the pause covers that gap.)
  absl::SleepFor(absl::Milliseconds(300));
  {
    grpc::ClientContext c2;
    c2.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    auto r2 = stub->Generate(&c2, cascade::v2::GenerateRequest());
    cascade::v2::GenerateResponse ignored;
    EXPECT_FALSE(r2->Read(&ignored));
    EXPECT_FALSE(r2->Finish().ok());
  }

  int messages = 1;
  while (reader->Read(&response)) ++messages;
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(messages, 10);
  shutdown.join();
  absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(4)) << "drain waited for more than the in-flight stream";
  EXPECT_TRUE(drain_callback_ran);
  EXPECT_EQ(gateway.calls_started(), 1) << "a call started during the drain";

  // After shutdown, nothing listens: a new call fails fast.
  HealthCheckResponse::ServingStatus s;
  EXPECT_EQ(testing::CheckHealth(channel, "", &s, absl::Seconds(2)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST(ServerRunnerTest, StreamOutlivingTheDrainBoundIsCancelled) {
  testing::PacedStreamService gateway(1000, absl::Milliseconds(50));
  ServerRunner runner(TestOptions());
  runner.AddService({&gateway, cascade::v2::GatewayService::service_full_name()});
  ASSERT_TRUE(runner.Start().ok());
  auto channel = Connect(runner);
  auto stub = cascade::v2::GatewayService::NewStub(channel);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, cascade::v2::GenerateRequest());
  cascade::v2::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));

  absl::Time start = absl::Now();
  runner.Shutdown(absl::Milliseconds(500));
  absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(3));
  while (reader->Read(&response)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_EQ(gateway.calls_cancelled(), 1);
}

TEST(ServerRunnerTest, RequestShutdownWakesWait) {
  ServerRunner runner(TestOptions());
  ASSERT_TRUE(runner.Start().ok());
  std::thread waiter([&] { runner.Wait(); });
  runner.RequestShutdown();
  waiter.join();
  EXPECT_TRUE(runner.shutdown_requested());
  EXPECT_FALSE(runner.health().IsServing(""));
}

TEST(ServerRunnerTest, PortInUseIsAClearError) {
  ServerRunner first(TestOptions());
  ASSERT_TRUE(first.Start().ok());
  ServerOptions o = TestOptions();
  o.port = first.port();
  ServerRunner second(o);
  absl::Status s = second.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(first.port())));
  // RunServer reports the same error instead of serving.
  EXPECT_FALSE(RunServer(o, {}).ok());
}

TEST(ServerRunnerTest, BadOptionsAreRejected) {
  ServerOptions o = TestOptions();
  o.tls.cert_file = "/nonexistent/cert.pem";
  o.tls.key_file = "/nonexistent/key.pem";
  absl::Status s = ServerRunner(o).Start();
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/cert.pem"));
  o = TestOptions();
  o.port = 70000;
  EXPECT_EQ(ServerRunner(o).Start().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerRunnerTest, ServesMetricsAndHealthzOnItsOwnPortUntilDrain) {
  MetricsRegistry registry;
  registry.GetGauge("cascade:num_requests_running", "Running.")->Set(2);
  ServerOptions o = TestOptions();
  o.metrics_port = 0;
  o.metrics = &registry;
  ServerRunner runner(o);
  ASSERT_TRUE(runner.Start().ok());
  ASSERT_GT(runner.metrics_port(), 0);
  EXPECT_NE(runner.metrics_port(), runner.port());
  EXPECT_THAT(testing::HttpGet(runner.metrics_port(), "/metrics"),
              HasSubstr("cascade:num_requests_running 2\n"));
  EXPECT_THAT(testing::HttpGet(runner.metrics_port(), "/healthz"),
              ::testing::StartsWith("HTTP/1.1 200"));
  runner.health().SetAllNotServing();
  EXPECT_THAT(testing::HttpGet(runner.metrics_port(), "/healthz"),
              ::testing::StartsWith("HTTP/1.1 503"));
}

TEST(ServerRunnerTest, ClientChannelArgumentsMatchServerKeepalive) {
  ClientChannelOptions options;
  options.keepalive.time = absl::Seconds(1);  // below the server's minimum ping interval
  options.keepalive.min_ping_interval = absl::Seconds(10);
  grpc::ChannelArguments channel_args = ChannelArgumentsForClients(options);
  grpc_channel_args args = channel_args.c_channel_args();  // points into channel_args
  bool found = false;
  for (size_t i = 0; i < args.num_args; ++i) {
    if (std::string(args.args[i].key) == GRPC_ARG_KEEPALIVE_TIME_MS) {
      EXPECT_EQ(args.args[i].value.integer, 10000);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace cascade::common
