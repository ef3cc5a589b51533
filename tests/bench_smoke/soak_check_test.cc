// The soak's verdict logic without servers: completed, cancelled, rejected, lost and wrong
// streams are told apart, so a broken stream cannot pass as a good one; and the kill schedule.
#include "bench/soak/soak_check.h"

#include <gtest/gtest.h>

#include "bench/soak/chaos.h"

namespace cascade::bench {
namespace {

RequestSample Sample(int64_t pool, bool ok, bool admitted, std::vector<int32_t> tokens,
                     std::string code = "") {
  RequestSample s;
  s.pool_index = pool;
  s.ok = ok;
  s.admitted = admitted;
  s.token_ids = std::move(tokens);
  s.error_code = std::move(code);
  s.ttft_ms = 10;
  s.e2e_ms = 100;
  return s;
}

const std::vector<std::vector<int32_t>> kRefs = {{1, 2, 3, 4}, {5, 6, 7, 8}};

TEST(SoakCheckTest, CompletedStreamsMustEqualTheirReference) {
  SoakTally t = TallySoak({Sample(0, true, true, {1, 2, 3, 4}), Sample(1, true, true, {5, 6, 7, 8}),
                           Sample(1, true, true, {5, 6, 0, 8})},
                          kRefs);
  EXPECT_EQ(t.requests, 3);
  EXPECT_EQ(t.completed, 2);
  EXPECT_EQ(t.wrong, 1);
  EXPECT_FALSE(t.clean());
  ASSERT_EQ(t.examples.size(), 1u);
  EXPECT_NE(t.examples[0].find("first difference at 2 (got 0, want 7)"), std::string::npos)
      << t.examples[0];
  EXPECT_EQ(t.e2e_ms.count, 2);
}

TEST(SoakCheckTest, ShortOrLongFinishedStreamsAreWrong) {
  SoakTally t =
      TallySoak({Sample(0, true, true, {1, 2, 3}), Sample(0, true, true, {1, 2, 3, 4, 9})}, kRefs);
  EXPECT_EQ(t.wrong, 2);
  EXPECT_EQ(t.completed, 0);
}

TEST(SoakCheckTest, CancelledStreamsNeedAPrefixOfTheReference) {
  RequestSample good = Sample(0, false, true, {1, 2}, "CANCELLED");
  good.cancelled = true;
  RequestSample bad = Sample(0, false, true, {1, 9}, "CANCELLED");
  bad.cancelled = true;
  SoakTally t = TallySoak({good, bad}, kRefs);
  EXPECT_EQ(t.cancelled, 1);
  EXPECT_EQ(t.wrong, 1);
  EXPECT_EQ(t.lost, 0);
}

TEST(SoakCheckTest, RefusedBeforeStartIsARejectionAndAdmittedThenFailedIsLost) {
  SoakTally t = TallySoak({Sample(0, false, false, {}, "RESOURCE_EXHAUSTED"),
                           Sample(1, false, false, {}, "RESOURCE_EXHAUSTED"),
                           Sample(1, false, true, {5, 6}, "FINISH_ERROR"),
                           Sample(0, false, true, {}, "DEADLINE_EXCEEDED")},
                          kRefs);
  EXPECT_EQ(t.rejected.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(t.lost, 2);
  EXPECT_EQ(t.lost_by.at("FINISH_ERROR"), 1);
  EXPECT_EQ(t.lost_by.at("DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(t.wrong, 0);
  EXPECT_EQ(t.admitted, 2);
  EXPECT_FALSE(t.clean());
}

TEST(SoakCheckTest, AStreamWithoutAReferenceIsWrong) {
  SoakTally t = TallySoak({Sample(7, true, true, {1}), Sample(-1, true, true, {1})}, kRefs);
  EXPECT_EQ(t.wrong, 2);
}

TEST(SoakCheckTest, ScheduleKillsWorkersInTurnAndTheRegistryOffset) {
  std::vector<ChaosEvent> events =
      ChaosSchedule(absl::Minutes(3), 2, absl::Minutes(1), absl::Minutes(1), absl::Seconds(30));
  std::vector<std::string> targets;
  std::vector<int64_t> seconds;
  for (const ChaosEvent& e : events) {
    targets.push_back(e.target);
    seconds.push_back(absl::ToInt64Seconds(e.at));
  }
  EXPECT_EQ(targets,
            (std::vector<std::string>{"registry", "worker-0", "registry", "worker-1", "registry"}));
  EXPECT_EQ(seconds, (std::vector<int64_t>{30, 60, 90, 120, 150}));
  EXPECT_TRUE(ChaosSchedule(absl::Minutes(3), 2, absl::ZeroDuration(), absl::ZeroDuration(),
                            absl::ZeroDuration())
                  .empty());
}

TEST(SoakCheckTest, SplitByKillsSeparatesStreamsAKillTouched) {
  auto at = [](double start_s, double e2e_ms) {
    RequestSample s = Sample(0, true, true, {1, 2, 3, 4});
    s.start_s = start_s;
    s.e2e_ms = e2e_ms;
    return s;
  };
  // A kill at 10 s, settling for 3 s.
  const std::vector<RequestSample> samples = {
      at(9.0, 500),   // ended before the kill: clear
      at(9.5, 1000),  // in flight at the kill: touched
      at(12.0, 100),  // sent while the stack recovers: touched
      at(13.5, 100),  // after recovery: clear
      at(-1, 100),    // no start time: touched (never counted as clear blindly)
  };
  KillSplit split = SplitByKills(samples, {10.0}, 3.0);
  ASSERT_EQ(split.clear.size(), 2u);
  EXPECT_DOUBLE_EQ(split.clear[0].start_s, 9.0);
  EXPECT_DOUBLE_EQ(split.clear[1].start_s, 13.5);
  ASSERT_EQ(split.touched.size(), 3u);
  EXPECT_EQ(SplitByKills(samples, {}, 3.0).clear.size(), 4u);
}

}  // namespace
}  // namespace cascade::bench
