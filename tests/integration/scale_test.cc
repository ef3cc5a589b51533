// Scale-out on loopback with CPU workers (issue 14): a worker added under load starts taking
// requests with none failing, a worker drained the way SIGTERM drains it fails no request, and
// two gateways behind one registry send a prefix to the same holder.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

// Closed-loop clients sending distinct short requests until stopped; every reply is kept.
class Load {
 public:
  Load(cascade::v2::GatewayService::Stub& stub, int clients) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, &stub, c] {
        for (int i = 0; !stop_.load(); ++i) {
          Reply r = Generate(stub, Req("",
                                       "client " + std::to_string(c) + " request " +
                                           std::to_string(i) + " asks something",
                                       6));
          std::lock_guard<std::mutex> lock(mu_);
          replies_.push_back(std::move(r));
        }
      });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return replies_.size();
  }
  std::vector<Reply> replies() {
    std::lock_guard<std::mutex> lock(mu_);
    return replies_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Reply> replies_;
  std::vector<std::thread> threads_;
};

// Until the gateway has served a request: it then knows the workers even if a later resolve
// times out on this busy machine (it falls back to the workers it last saw).
bool WarmUp(Stack& stack, size_t workers) {
  return WaitFor([&] { return stack.registry()->ListWorkers().size() == workers; }) &&
         WaitFor([&] { return Generate(stack.gateway(), Req("", "warm up", 1)).status.ok(); });
}

void ExpectAllOk(const std::vector<Reply>& replies) {
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_code() << " " << r.status.error_message();
    ASSERT_TRUE(r.has_finish);
    EXPECT_NE(r.finish.finish_reason(), cascade::v2::FINISH_REASON_ERROR);
    EXPECT_EQ(r.tokens.size(), 6u);
  }
}

TEST(ScaleTest, AWorkerAddedUnderLoadTakesRequestsAndNoneFails) {
  StackOptions o;
  o.workers = 1;
  o.static_workers = false;  // the gateway learns workers from the registry only
  Stack stack(o);
  ASSERT_TRUE(WarmUp(stack, 1));
  Load load(stack.gateway(), 4);
  ASSERT_TRUE(WaitFor([&] { return load.count() >= 8; }, 20000));
  const size_t before = load.count();
  stack.StartWorker(1);
  // The new worker registers, heartbeats its load, and the router starts sending it requests.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const Reply& r : load.replies()) {
          if (r.start.worker_id() == "w1") return true;
        }
        return false;
      },
      20000))
      << "no request reached the added worker";
  const size_t at_join = load.count();
  ASSERT_TRUE(WaitFor([&] { return load.count() >= at_join + 16; }, 20000));
  load.Stop();
  std::vector<Reply> replies = load.replies();
  ExpectAllOk(replies);
  std::map<std::string, int> served;
  for (size_t i = before; i < replies.size(); ++i) ++served[replies[i].start.worker_id()];
  EXPECT_GT(served["w1"], 0);
  EXPECT_GT(served["w0"], 0);
  std::cout << "requests after the join: w0 " << served["w0"] << ", w1 " << served["w1"] << "\n";
}

TEST(ScaleTest, AWorkerDrainedLikeSigtermFailsNoRequest) {
  StackOptions o;
  o.workers = 2;
  o.static_workers = false;
  Stack stack(o);
  ASSERT_TRUE(WarmUp(stack, 2));
  Load load(stack.gateway(), 4);
  // Both workers busy before the drain begins.
  ASSERT_TRUE(WaitFor(
      [&] {
        std::map<std::string, int> served;
        for (const Reply& r : load.replies()) ++served[r.start.worker_id()];
        return served["w0"] > 0 && served["w1"] > 0;
      },
      20000))
      << load.count() << " replies, the first: " << load.replies()[0].status.error_message()
      << " from " << load.replies()[0].start.worker_id();
  stack.DrainWorker(1, absl::Seconds(5));  // returns once w1 has drained and stopped
  const size_t after_drain = load.count();
  ASSERT_TRUE(WaitFor([&] { return load.count() >= after_drain + 12; }, 20000));
  load.Stop();
  std::vector<Reply> replies = load.replies();
  ExpectAllOk(replies);
  // Everything that started after the drain ran on the remaining worker.
  for (size_t i = after_drain + 4; i < replies.size(); ++i) {
    EXPECT_EQ(replies[i].start.worker_id(), "w0") << i;
  }
}

// A gateway drained the way SIGTERM drains it lets the stream it is serving finish whole while
// it still holds the client's connection, and refuses a new one at once with UNAVAILABLE saying
// it is draining (a client or load balancer retries it on another replica).
TEST(ScaleTest, ADrainedGatewayFinishesItsStreamAndRefusesNewOnesAsDraining) {
  Stack stack({.workers = 1});
  absl::Notification started;
  Reply in_flight;
  std::thread reader([&] {
    in_flight = Generate(stack.gateway(), Req("You are terse.", "Count slowly.", 300), 120000, {},
                         [&] { started.Notify(); });
    if (!started.HasBeenNotified()) started.Notify();  // it failed before starting
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));

  std::thread drain([&] { stack.gateway_server().Shutdown(absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));  // the drain is under way; the long stream runs on
  Reply refused = Generate(stack.gateway(), Req("You are terse.", "Hi", 4), 10000);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("is draining"), std::string::npos)
      << refused.status.error_message();

  reader.join();
  drain.join();
  ASSERT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens.size(), 300u);
  EXPECT_TRUE(in_flight.has_finish);
}

TEST(ScaleTest, TwoGatewaysBehindOneRegistrySendAPrefixToTheSameHolder) {
  StackOptions o;
  o.workers = 3;
  o.static_workers = false;
  Stack stack(o);
  auto second = gateway::GatewayServer::Start(stack.GatewayConfig());
  ASSERT_TRUE(second.ok()) << second.status();
  auto second_stub = cascade::v2::GatewayService::NewStub(
      grpc::CreateChannel((*second)->address(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(WaitFor([&] { return stack.registry()->ListWorkers().size() == 3; }));

  // Each prefix is prefilled once through the first gateway, alternating so they land on
  // different workers as load allows; then both gateways must send it to its holder.
  std::map<std::string, std::string> holder;
  for (int p = 0; p < 4; ++p) {
    // About 800 tokens. With 200, one load signal lagging the last reply by a moment outweighed
    // the match and the next request went elsewhere: 4 runs in 10 while the admission slot came
    // back in the reactor's OnDone (after the client had its answer), 1 in 10 since it comes
    // back when the turn ends.
    const std::string system = LongSystemPrompt() + LongSystemPrompt() + LongSystemPrompt() +
                               LongSystemPrompt() + " Tenant " + std::to_string(p) + ".";
    ASSERT_TRUE(stack.WaitForIdleLoad());
    Reply first = Generate(stack.gateway(), Req(system, "first question", 4));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    holder[system] = first.start.worker_id();
  }
  for (const auto& [system, id] : holder) {
    ASSERT_TRUE(stack.WaitForIdleLoad());
    // The registry hears of the held chunks with the holder's next event batch.
    ASSERT_TRUE(WaitFor([&] {
      Reply probe = Generate(*second_stub, Req(system, "probe", 1));
      return probe.status.ok() && probe.start.worker_id() == id;
    })) << "second gateway did not route to the holder "
        << id;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(stack.WaitForIdleLoad());
      Reply a = Generate(stack.gateway(), Req(system, "question a" + std::to_string(i), 2));
      ASSERT_TRUE(stack.WaitForIdleLoad());
      Reply b = Generate(*second_stub, Req(system, "question b" + std::to_string(i), 2));
      ASSERT_TRUE(a.status.ok() && b.status.ok());
      EXPECT_EQ(a.start.worker_id(), id);
      EXPECT_EQ(b.start.worker_id(), id);
      EXPECT_GT(b.start.cached_tokens(), 0);
    }
  }
  (*second)->Shutdown(absl::Milliseconds(200));
}

}  // namespace
}  // namespace cascade::testing
