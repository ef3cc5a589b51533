// The registry's circuit breaker (breaker.h): closed until a failure, then every call skipped
// for the backoff, one probe when it ends (the others still skipped), the backoff doubling up to
// its cap while probes fail, closed again by a success.
#include "services/gateway/breaker.h"

#include <gtest/gtest.h>

namespace cascade::gateway {
namespace {

class BreakerTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  Breaker b_{"registry",
             {.initial_backoff = absl::Seconds(1), .max_backoff = absl::Seconds(4)},
             [this] { return now_; }};
};

TEST_F(BreakerTest, ClosedUntilAFailureThenSkipsForTheBackoff) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(b_.Allow());
    b_.Record(false);
  }
  EXPECT_FALSE(b_.open());
  ASSERT_TRUE(b_.Allow());
  b_.Record(true, "deadline exceeded");
  EXPECT_TRUE(b_.open());
  EXPECT_FALSE(b_.Allow());
  now_ += absl::Milliseconds(999);
  EXPECT_FALSE(b_.Allow());
  now_ += absl::Milliseconds(1);
  EXPECT_TRUE(b_.Allow()) << "the probe";
  EXPECT_FALSE(b_.Allow()) << "one probe at a time";
  b_.Record(false);
  EXPECT_FALSE(b_.open());
  EXPECT_TRUE(b_.Allow());
  EXPECT_TRUE(b_.Allow());
}

TEST_F(BreakerTest, CallsInFlightWhenItOpenedDoNotExtendTheBackoff) {
  ASSERT_TRUE(b_.Allow());
  ASSERT_TRUE(b_.Allow());
  ASSERT_TRUE(b_.Allow());
  b_.Record(true);  // open for 1 s
  b_.Record(true);  // the other two were sent before it opened
  b_.Record(true);
  now_ += absl::Seconds(1);
  EXPECT_TRUE(b_.Allow()) << "still the initial backoff";
  b_.Record(false);
  EXPECT_FALSE(b_.open());
}

TEST_F(BreakerTest, FailedProbesDoubleTheBackoffUpToItsCapAndASuccessResetsIt) {
  ASSERT_TRUE(b_.Allow());
  b_.Record(true);  // open for 1 s
  now_ += absl::Seconds(1);
  for (absl::Duration want : {absl::Seconds(2), absl::Seconds(4), absl::Seconds(4)}) {
    ASSERT_TRUE(b_.Allow()) << "the probe";
    b_.Record(true);  // it failed: open for `want`
    now_ += want - absl::Milliseconds(1);
    EXPECT_FALSE(b_.Allow());
    now_ += absl::Milliseconds(1);
  }
  ASSERT_TRUE(b_.Allow());
  b_.Record(false);  // closed
  ASSERT_TRUE(b_.Allow());
  b_.Record(true);  // a new failure after a success: the initial backoff again
  now_ += absl::Seconds(1);
  EXPECT_TRUE(b_.Allow());
}

}  // namespace
}  // namespace cascade::gateway
