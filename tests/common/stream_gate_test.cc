// StreamGate: a drain refuses new streams at once, waits for the ones in flight (then lingers),
// and gives up at its deadline when one never ends.
#include "common/stream_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"

namespace cascade::common {
namespace {

TEST(StreamGateTest, DrainRefusesNewStreamsAndWaitsForThoseInFlight) {
  StreamGate gate;
  ASSERT_TRUE(gate.Enter());
  ASSERT_TRUE(gate.Enter());
  std::atomic<bool> drained{false};
  const absl::Time start = absl::Now();
  std::thread drain([&] {
    gate.Drain(start + absl::Seconds(20), absl::Milliseconds(50), "test");
    drained = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(gate.Enter()) << "a new stream was let in while draining";
  gate.Leave();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(drained) << "the drain ended with a stream still in flight";
  gate.Leave();
  drain.join();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(10)) << "the drain waited for its deadline, not the streams";
  EXPECT_FALSE(gate.Enter());
}

TEST(StreamGateTest, DrainGivesUpAtItsDeadline) {
  StreamGate gate;
  ASSERT_TRUE(gate.Enter());  // never leaves
  const absl::Time start = absl::Now();
  gate.Drain(start + absl::Milliseconds(200), absl::Seconds(5), "test");
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(3)) << "lingered past the deadline";
}

TEST(StreamGateTest, DrainWithNothingInFlightReturnsAtOnce) {
  StreamGate gate;
  const absl::Time start = absl::Now();
  gate.Drain(start + absl::Seconds(10), absl::Seconds(5), "test");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "lingered with no stream to land";
}

}  // namespace
}  // namespace cascade::common
