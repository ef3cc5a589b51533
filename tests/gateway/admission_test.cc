// Capacity-aware admission (admission.h): a worker gets at most its limit of requests, the rest
// wait in order and are refused at their queue deadline, a standing queue switches to short
// waits with the newest served first, and the limit follows the worker's time per token.
#include "services/gateway/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace cascade::gateway {
namespace {

// A clock the test moves by hand.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

std::vector<Scored> Ranked(std::initializer_list<const char*> addresses) {
  std::vector<Scored> out;
  for (const char* a : addresses) out.push_back({Candidate{a, a}, 0.0});
  return out;
}

// Collects each request's outcome, by the order it asked.
class Outcomes {
 public:
  Admission::Callback For(int i) {
    return [this, i](absl::StatusOr<Grant> g) {
      absl::MutexLock lock(&mu_);
      results_[i] = std::move(g);
    };
  }
  // Waits (real time; the controller's thread delivers) until `n` outcomes are in.
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  // Gives the controller's thread time to deliver anything it would (for "nothing happens").
  void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return results_.size();
  }
  bool Has(int i) {
    absl::MutexLock lock(&mu_);
    return results_.count(i) > 0;
  }
  absl::StatusOr<Grant> Get(int i) {
    absl::MutexLock lock(&mu_);
    auto it = results_.find(i);
    if (it == results_.end()) return absl::NotFoundError("no outcome yet");
    return it->second;
  }

 private:
  absl::Mutex mu_;
  std::map<int, absl::StatusOr<Grant>> results_ ABSL_GUARDED_BY(mu_);
};

// Adaptive limits under the relative rule alone (no absolute time-per-token target).
AdmissionOptions RelativeOnly(int initial_limit, int window_samples, double tolerance) {
  AdmissionOptions o;
  o.initial_limit = initial_limit;
  o.window_samples = window_samples;
  o.latency_tolerance = tolerance;
  o.tpot_target = absl::ZeroDuration();
  return o;
}

AdmissionOptions Fixed(int limit) {
  AdmissionOptions o;
  o.initial_limit = limit;
  o.adaptive = false;
  o.queue_timeout = absl::Seconds(2);
  o.standing_queue = absl::Seconds(10);
  return o;
}

TEST(AdmissionTest, AWorkerGetsAtMostItsLimitAndTheRestWaitInOrder) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(2), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  for (int i = 0; i < 4; ++i) a.Acquire(Ranked({"w:1"}), far, out.For(i));
  ASSERT_TRUE(out.WaitFor(2));
  out.Settle();
  ASSERT_EQ(out.size(), 2u) << "only the limit may run";
  EXPECT_TRUE(out.Get(0).ok());
  EXPECT_TRUE(out.Get(1).ok());
  EXPECT_EQ(a.queued(), 2);

  a.Release("w:1");
  ASSERT_TRUE(out.WaitFor(3));
  out.Settle();
  EXPECT_TRUE(out.Has(2)) << "the oldest waiter goes first";
  EXPECT_FALSE(out.Has(3));
  EXPECT_EQ(out.Get(2)->address, "w:1");
}

TEST(AdmissionTest, WorkersIdlePastForgetAfterAreForgottenButNotOnesInUse) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(2), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"gone:1"}), far, out.For(0));
  a.Acquire(Ranked({"busy:1"}), far, out.For(1));  // held: still in flight
  ASSERT_TRUE(out.WaitFor(2));
  a.Release("gone:1");
  auto addresses = [&] {
    std::vector<std::string> v;
    for (const Admission::WorkerView& w : a.Workers()) v.push_back(w.address);
    return v;
  };
  clock.Advance(absl::Minutes(9));  // under the 10-minute default
  a.Acquire(Ranked({"new:1"}), far, out.For(2));
  ASSERT_TRUE(out.WaitFor(3));
  EXPECT_EQ(addresses(), (std::vector<std::string>{"busy:1", "gone:1", "new:1"}));
  a.Release("new:1");
  clock.Advance(absl::Minutes(2));  // gone:1 idle 11 minutes, new:1 2 minutes
  a.Acquire(Ranked({"other:1"}), far, out.For(3));
  ASSERT_TRUE(out.WaitFor(4));
  EXPECT_EQ(addresses(), (std::vector<std::string>{"busy:1", "new:1", "other:1"}));
  a.Release("busy:1");
  a.Release("other:1");
}

TEST(AdmissionTest, AFullWorkerSpillsToTheNextCandidateWithRoom) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(1), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"holder:1", "other:1"}), far, out.For(0));
  a.Acquire(Ranked({"holder:1", "other:1"}), far, out.For(1));
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_EQ(out.Get(0)->address, "holder:1");
  ASSERT_TRUE(out.Get(1).ok());
  EXPECT_EQ(out.Get(1)->address, "other:1");
  // The spilled request keeps the others as failover candidates, chosen one first.
  ASSERT_EQ(out.Get(1)->ranked.size(), 2u);
  EXPECT_EQ(out.Get(1)->ranked[0].candidate.address, "other:1");
  EXPECT_EQ(out.Get(1)->ranked[1].candidate.address, "holder:1");
}

TEST(AdmissionTest, AWaiterIsRefusedAtItsQueueDeadlineWithAClearMessage) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(1), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"w:1"}), far, out.For(0));
  a.Acquire(Ranked({"w:1"}), far, out.For(1));
  ASSERT_TRUE(out.WaitFor(1));
  clock.Advance(absl::Milliseconds(1900));
  out.Settle();
  EXPECT_FALSE(out.Has(1)) << "refused before its queue deadline";
  clock.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_TRUE(absl::IsResourceExhausted(out.Get(1).status()));
  EXPECT_NE(out.Get(1).status().message().find("--queue_timeout"), absl::string_view::npos)
      << out.Get(1).status();
  // Its slot was never taken: a release lets the next request in at once.
  a.Release("w:1");
  a.Acquire(Ranked({"w:1"}), far, out.For(2));
  ASSERT_TRUE(out.WaitFor(3));
  EXPECT_TRUE(out.Get(2).ok());
}

TEST(AdmissionTest, TheClientsOwnDeadlineEndsTheWaitSooner) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(1), [&] { return clock.Now(); });
  a.Acquire(Ranked({"w:1"}), clock.Now() + absl::Hours(1), out.For(0));
  a.Acquire(Ranked({"w:1"}), clock.Now() + absl::Milliseconds(100), out.For(1));
  ASSERT_TRUE(out.WaitFor(1));
  clock.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_TRUE(absl::IsResourceExhausted(out.Get(1).status()));
}

TEST(AdmissionTest, ACancelledWaiterLeavesTheQueueAndGetsNoCallback) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(1), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"w:1"}), far, out.For(0));
  const uint64_t t1 = a.Acquire(Ranked({"w:1"}), far, out.For(1));
  a.Acquire(Ranked({"w:1"}), far, out.For(2));
  ASSERT_TRUE(out.WaitFor(1));
  EXPECT_TRUE(a.Cancel(t1));
  EXPECT_FALSE(a.Cancel(t1)) << "a ticket is withdrawn once";
  a.Release("w:1");
  ASSERT_TRUE(out.WaitFor(2));
  out.Settle();
  EXPECT_FALSE(out.Has(1));
  EXPECT_TRUE(out.Get(2).ok());
}

TEST(AdmissionTest, BeyondMaxPendingIsRefusedAtOnce) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  AdmissionOptions o = Fixed(1);
  o.max_pending = 3;
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  for (int i = 0; i < 4; ++i) a.Acquire(Ranked({"w:1"}), far, out.For(i));
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_TRUE(out.Get(0).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(out.Get(3).status()));
  EXPECT_NE(out.Get(3).status().message().find("--max_concurrent"), absl::string_view::npos);
}

// Requests being prepared and routed hold room (TryHold) beside the admitted and queued ones: a
// burst gets at most max_pending holds, the rest are refused before reaching the registry; a
// released hold (its request moving on to Acquire, or ending) gives its room back.
TEST(AdmissionTest, HeldRoomCountsAgainstMaxPendingUntilReleased) {
  Outcomes out;
  FakeClock clock;
  AdmissionOptions o = Fixed(1);
  o.max_pending = 3;
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  std::vector<Admission::Hold> holds;
  for (int i = 0; i < 5; ++i) holds.push_back(a.TryHold());
  EXPECT_TRUE(holds[0] && holds[1] && holds[2]);
  EXPECT_FALSE(holds[3]) << "a fourth request held room while three were being routed";
  EXPECT_FALSE(holds[4]);
  holds[0].Release();  // routed: on to Acquire, which it gets
  {
    Admission::Hold probe = a.TryHold();
    EXPECT_TRUE(probe) << "a released hold gave no room back";
  }
  a.Acquire(Ranked({"w:1"}), far, out.For(0));
  ASSERT_TRUE(out.WaitFor(1));
  EXPECT_TRUE(out.Get(0).ok());
  EXPECT_FALSE(a.TryHold()) << "one admitted and two held";
  {
    Admission::Hold moved = std::move(holds[1]);  // a hold moves with its request...
    EXPECT_FALSE(holds[1]);
  }  // ... and one dropped without Release (the request ended while routing) gives room back
  Admission::Hold again = a.TryHold();
  EXPECT_TRUE(again);
}

TEST(AdmissionTest, AStandingQueueServesTheNewestFirstAndRefusesTheOldQuickly) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  AdmissionOptions o = Fixed(1);
  o.queue_timeout = absl::Seconds(30);
  o.standing_queue = absl::Seconds(1);
  o.overload_queue_timeout = absl::Milliseconds(100);
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"w:1"}), far, out.For(0));  // runs
  a.Acquire(Ranked({"w:1"}), far, out.For(1));  // queues: the queue stands from here
  ASSERT_TRUE(out.WaitFor(1));
  clock.Advance(absl::Milliseconds(1100));
  a.Acquire(Ranked({"w:1"}), clock.Now() + absl::Hours(1), out.For(2));
  // Overloaded now: waiter 1 has waited past the short timeout and is refused.
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_TRUE(a.overloaded());
  EXPECT_TRUE(absl::IsResourceExhausted(out.Get(1).status()));
  EXPECT_NE(out.Get(1).status().message().find("overloaded"), absl::string_view::npos);
  a.Acquire(Ranked({"w:1"}), clock.Now() + absl::Hours(1), out.For(3));
  out.Settle();
  a.Release("w:1");
  ASSERT_TRUE(out.WaitFor(3));
  out.Settle();
  EXPECT_TRUE(out.Has(3)) << "the newest waiter is served first under overload";
  EXPECT_TRUE(out.Get(3).ok());
  EXPECT_FALSE(out.Has(2));
}

TEST(AdmissionTest, TheLimitShrinksWhenTokensSlowDownAndGrowsWhileFullAndFast) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  AdmissionOptions o;
  o.initial_limit = 4;
  o.window = absl::Milliseconds(100);
  o.window_samples = 4;
  o.latency_tolerance = 2.0;
  o.decrease_factor = 0.5;
  o.increase_fraction = 0.0;             // one at a time, to read the steps
  o.tpot_target = absl::ZeroDuration();  // the tolerance alone
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  for (int i = 0; i < 4; ++i) a.Acquire(Ranked({"w:1"}), far, out.For(i));
  ASSERT_TRUE(out.WaitFor(4));
  auto limit = [&] { return a.Workers().at(0).limit; };
  auto window = [&](double seconds_per_token) {
    for (int i = 0; i < 4; ++i) a.ObserveTokens("w:1", 1, seconds_per_token);
    clock.Advance(absl::Milliseconds(100));
    a.ObserveTokens("w:1", 1, seconds_per_token);  // closes the window
  };
  window(0.010);  // the baseline: 10 ms a token, full (4 of 4 in flight)
  EXPECT_EQ(a.Workers().at(0).baseline_tpot, 0.010);
  EXPECT_EQ(limit(), 5) << "full and fast: one more";
  a.Acquire(Ranked({"w:1"}), far, out.For(4));  // fills the new room
  ASSERT_TRUE(out.WaitFor(5));
  window(0.015);  // within 2x: still grows while full
  EXPECT_EQ(limit(), 6);
  for (int i = 0; i < 5; ++i) a.Release("w:1");
  window(0.050);  // 5x the baseline: halves
  EXPECT_EQ(limit(), 3);
  window(0.010);  // fast but idle: no evidence that more would stay fast
  EXPECT_EQ(limit(), 3);
}

// A decrease says why in the log (the numbers an operator needs to read a refusal), at most one
// line per worker per 5 s with the count of decreases it stands for.
TEST(AdmissionTest, LimitDecreasesAreLoggedWithTheirReasonAndThrottled) {
  std::vector<std::string> lines;
  absl::Mutex lines_mu;
  common::SetLogSink([&](std::string_view line) {
    absl::MutexLock lock(&lines_mu);
    if (line.find("admission_limit_down") != std::string_view::npos) lines.emplace_back(line);
  });
  {
    Outcomes out;  // outlives `a`, whose destructor answers every waiter
    FakeClock clock;
    Admission a(RelativeOnly(64, 2, 2.0), [&] { return clock.Now(); });
    auto window = [&](double seconds_per_token) {
      clock.Advance(absl::Milliseconds(100));
      a.ObserveTokens("w:7", 1, seconds_per_token);
      a.ObserveTokens("w:7", 1, seconds_per_token);
    };
    a.Acquire(Ranked({"w:7"}), clock.Now() + absl::Hours(1), out.For(0));
    ASSERT_TRUE(out.WaitFor(1));
    window(0.002);  // unloaded: 2 ms a token
    window(0.010);  // 5x: down, logged
    window(0.010);  // down again within 5 s: counted, not logged
    clock.Advance(absl::Seconds(5));
    window(0.010);  // logged, standing for two decreases
    a.Release("w:7");
  }
  common::SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("w:7"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("median_tpot_ms"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("unloaded_tpot_ms"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("decreases=2"), std::string::npos) << lines[1];
}

// A GPU's time per token doubles with its batch long before it is full: under the target time
// per token the limit keeps growing while full, above it the limit shrinks.
TEST(AdmissionTest, TheLimitDoesNotShrinkWhileTokensComeFasterThanTheTarget) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  AdmissionOptions o;
  o.initial_limit = 2;
  o.window_samples = 2;
  o.latency_tolerance = 2.0;
  o.increase_fraction = 0.0;
  o.tpot_target = absl::Milliseconds(50);
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  auto window = [&](double seconds_per_token) {
    clock.Advance(absl::Milliseconds(100));
    a.ObserveTokens("w:1", 1, seconds_per_token);
    a.ObserveTokens("w:1", 1, seconds_per_token);
  };
  auto limit = [&] { return a.Workers().at(0).limit; };
  a.Acquire(Ranked({"w:1"}), far, out.For(0));
  a.Acquire(Ranked({"w:1"}), far, out.For(1));
  ASSERT_TRUE(out.WaitFor(2));
  window(0.003);  // unloaded 3 ms a token, full: grows
  EXPECT_EQ(limit(), 3);
  a.Acquire(Ranked({"w:1"}), far, out.For(2));
  ASSERT_TRUE(out.WaitFor(3));
  window(0.020);  // 6.7x the unloaded time but under 50 ms: still full and fast enough
  EXPECT_EQ(limit(), 4);
  window(0.080);  // past the target: shrinks
  EXPECT_EQ(limit(), 3);
  for (int i = 0; i < 3; ++i) a.Release("w:1");
}

TEST(AdmissionTest, PrefillSpikesDoNotShrinkTheLimitButSlowerDecodeDoes) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(RelativeOnly(8, 10, 1.5), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"w:1"}), far, out.For(0));
  ASSERT_TRUE(out.WaitFor(1));
  auto window = [&](std::vector<double> samples) {
    clock.Advance(absl::Milliseconds(100));
    for (double x : samples) a.ObserveTokens("w:1", 1, x);
  };
  window(std::vector<double>(10, 0.002));  // decode at 2 ms a token
  // 3 of 10 steps carry a 20 ms prefill: the mean is 4x the baseline, the median is not.
  window({0.002, 0.02, 0.002, 0.0021, 0.02, 0.002, 0.0022, 0.02, 0.002, 0.002});
  EXPECT_EQ(a.Workers().at(0).limit, 8) << "prefill spikes shrank the limit";
  window(std::vector<double>(10, 0.004));  // decode itself twice as slow
  EXPECT_EQ(a.Workers().at(0).limit, 6);
}

TEST(AdmissionTest, AWorkerMarkedDownGetsNoGrantsUntilItStreamsOrTheTimePasses) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  AdmissionOptions o = Fixed(4);
  o.down_for = absl::Seconds(2);
  Admission a(o, [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.MarkDown("dead:1");
  a.Acquire(Ranked({"dead:1", "live:1"}), far, out.For(0));
  ASSERT_TRUE(out.WaitFor(1));
  EXPECT_EQ(out.Get(0)->address, "live:1") << "a dead worker's room was handed out";
  clock.Advance(absl::Seconds(3));
  a.Acquire(Ranked({"dead:1", "live:1"}), far, out.For(1));
  ASSERT_TRUE(out.WaitFor(2));
  EXPECT_EQ(out.Get(1)->address, "dead:1") << "down for ever";
  a.MarkDown("dead:1");
  a.ObserveTokens("dead:1", 1, 0.01);  // it streams again: up
  a.Acquire(Ranked({"dead:1", "live:1"}), far, out.For(2));
  ASSERT_TRUE(out.WaitFor(3));
  EXPECT_EQ(out.Get(2)->address, "dead:1");
  // Every candidate down: the turn gets them anyway and reports what it finds.
  a.MarkDown("dead:1");
  a.MarkDown("live:1");
  a.Acquire(Ranked({"dead:1", "live:1"}), far, out.For(3));
  ASSERT_TRUE(out.WaitFor(4));
  EXPECT_TRUE(out.Get(3).ok());
}

TEST(AdmissionTest, ASlotMovesWithARequestThatFailsOver) {
  Outcomes out;  // outlives `a`, whose destructor answers every waiter
  FakeClock clock;
  Admission a(Fixed(1), [&] { return clock.Now(); });
  const absl::Time far = clock.Now() + absl::Hours(1);
  a.Acquire(Ranked({"a:1"}), far, out.For(0));
  a.Acquire(Ranked({"b:1"}), far, out.For(1));
  ASSERT_TRUE(out.WaitFor(2));
  a.Transfer("a:1", "b:1");  // request 0 resumed on b: b is over its limit, a is free
  a.Acquire(Ranked({"b:1"}), far, out.For(2));
  a.Acquire(Ranked({"a:1"}), far, out.For(3));
  ASSERT_TRUE(out.WaitFor(3));
  out.Settle();
  EXPECT_TRUE(out.Has(3));
  EXPECT_FALSE(out.Has(2)) << "b got a new request while over its limit";
  a.Release("b:1");  // request 0 ends where it moved
  out.Settle();
  EXPECT_FALSE(out.Has(2)) << "b still holds request 1";
  a.Release("b:1");
  ASSERT_TRUE(out.WaitFor(4));
  EXPECT_EQ(out.Get(2)->address, "b:1");
}

TEST(AdmissionTest, ShutdownAnswersEveryWaiter) {
  Outcomes out;
  {
    FakeClock clock;
    Admission a(Fixed(1), [&] { return clock.Now(); });
    const absl::Time far = clock.Now() + absl::Hours(1);
    for (int i = 0; i < 3; ++i) a.Acquire(Ranked({"w:1"}), far, out.For(i));
    ASSERT_TRUE(out.WaitFor(1));
  }
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(absl::IsUnavailable(out.Get(1).status()));
  EXPECT_TRUE(absl::IsUnavailable(out.Get(2).status()));
}

}  // namespace
}  // namespace cascade::gateway
