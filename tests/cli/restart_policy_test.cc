// The restart policy of `cascade up`'s supervisor, driven with explicit times: exponential
// backoff capped at the maximum, reset after a stable run, and giving up on a crash loop.
#include "services/cli/restart_policy.h"

#include <gtest/gtest.h>

namespace cascade::cli {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

RestartOptions Options() {
  RestartOptions o;
  o.initial_backoff = absl::Milliseconds(100);
  o.max_backoff = absl::Milliseconds(500);
  o.multiplier = 2;
  o.stable_after = absl::Seconds(10);
  o.max_restarts = 5;
  return o;
}

TEST(RestartPolicyTest, BackoffDoublesPerQuickDeathAndIsCapped) {
  RestartPolicy policy(Options());
  absl::Time now = kT0;
  policy.OnReady(now);
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 5; ++i) {
    now += absl::Seconds(1);  // up 1 s each time: quicker than stable_after
    const absl::Time at = policy.OnDeath(now);
    ASSERT_NE(at, absl::InfiniteFuture()) << "death " << i + 1;
    waits.push_back(at - now);
    now = at;
    policy.OnReady(now);
  }
  EXPECT_EQ(waits, (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                                absl::Milliseconds(400), absl::Milliseconds(500),
                                                absl::Milliseconds(500)}));
}

TEST(RestartPolicyTest, GivesUpAfterMaxRestartsQuickDeathsInARow) {
  RestartPolicy policy(Options());
  absl::Time now = kT0;
  for (int i = 0; i < 5; ++i) {
    // Never becomes ready: a child that fails at startup.
    const absl::Time at = policy.OnDeath(now);
    ASSERT_NE(at, absl::InfiniteFuture()) << "death " << i + 1;
    now = at;
  }
  EXPECT_EQ(policy.OnDeath(now + absl::Seconds(30)), absl::InfiniteFuture())
      << "sixth death in a row without a stable run";
  EXPECT_EQ(policy.quick_deaths(), 6);
}

TEST(RestartPolicyTest, StableRunResetsTheBackoffAndTheCount) {
  RestartPolicy policy(Options());
  absl::Time now = kT0;
  for (int i = 0; i < 4; ++i) now = policy.OnDeath(now);  // 4 quick deaths
  EXPECT_EQ(policy.quick_deaths(), 4);
  policy.OnReady(now);
  now += absl::Seconds(10);  // exactly stable_after: healthy again
  const absl::Time at = policy.OnDeath(now);
  EXPECT_EQ(at - now, absl::Milliseconds(100));
  EXPECT_EQ(policy.quick_deaths(), 1);
  // A child killed every stable_after forever is restarted forever.
  for (int i = 0; i < 50; ++i) {
    now = policy.OnDeath(now + absl::Seconds(10));
    ASSERT_NE(now, absl::InfiniteFuture());
    policy.OnReady(now);
  }
}

TEST(RestartPolicyTest, ReadinessIsNeededForAStableRun) {
  RestartPolicy policy(Options());
  absl::Time now = kT0;
  now = policy.OnDeath(now);
  // Alive but never ready for a minute, then dies: still a quick death.
  now += absl::Minutes(1);
  policy.OnDeath(now);
  EXPECT_EQ(policy.quick_deaths(), 2);
}

TEST(RestartPolicyTest, ZeroMaxRestartsNeverRestarts) {
  RestartOptions o = Options();
  o.max_restarts = 0;
  RestartPolicy policy(o);
  policy.OnReady(kT0);
  EXPECT_EQ(policy.OnDeath(kT0 + absl::Hours(1)), absl::InfiniteFuture());
}

TEST(RestartPolicyTest, BadOptionsAreNamed) {
  EXPECT_EQ(ValidateRestartOptions(Options()), "");
  RestartOptions o = Options();
  o.max_backoff = absl::Milliseconds(50);
  EXPECT_NE(ValidateRestartOptions(o).find("--restart_backoff_max"), std::string::npos);
  o = Options();
  o.max_restarts = -1;
  EXPECT_NE(ValidateRestartOptions(o).find("--max_restarts"), std::string::npos);
  o = Options();
  o.stable_after = absl::ZeroDuration();
  EXPECT_NE(ValidateRestartOptions(o).find("--restart_stable_after"), std::string::npos);
  o = Options();
  o.initial_backoff = -absl::Seconds(1);
  EXPECT_NE(ValidateRestartOptions(o).find("--restart_backoff"), std::string::npos);
}

}  // namespace
}  // namespace cascade::cli
