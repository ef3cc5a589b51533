// Sampling: parameter validation names the field; greedy is argmax; seeded draws are a pure
// function of (seed, position); filters restrict the support; the empirical distribution
// matches softmax within a tolerance that a fixed-seed run of 20000 draws meets easily.
#include "gpu_worker/engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gpu_worker/engine/backend.h"

namespace cascade::engine {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

TEST(SamplerTest, ValidationNamesTheField) {
  SamplingParams p;
  p.temperature = 2.5f;
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(), ::testing::HasSubstr("sampling.temperature"));
  p = {};
  p.top_p = 0.0f;
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(), ::testing::HasSubstr("sampling.top_p"));
  p = {};
  p.top_k = -2;
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(), ::testing::HasSubstr("sampling.top_k"));
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(),
              ::testing::HasSubstr("sampling.repetition_penalty"));
  p = {};
  p.max_tokens = 0;
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(), ::testing::HasSubstr("sampling.max_tokens"));
  p.max_tokens = 101;
  EXPECT_FALSE(ValidateSampling(p, 10, 100).ok());
  p = {};
  p.stop_token_ids = {10};
  EXPECT_THAT(ValidateSampling(p, 10, 100).message(), ::testing::HasSubstr("stop_token_ids"));
  p = {};
  p.top_k = -1;
  EXPECT_TRUE(ValidateSampling(p, 10, 100).ok());
  p.temperature = NAN;
  EXPECT_FALSE(ValidateSampling(p, 10, 100).ok());
}

TEST(SamplerTest, GreedyIsArgmax) {
  auto l = Logits();
  SamplingParams p;
  EXPECT_EQ(Sample(l, p, 1, 0, {}).token_id, 1);
}

TEST(SamplerTest, SeededDrawDependsOnlyOnSeedAndPosition) {
  SamplingParams p;
  p.temperature = 1.0f;
  for (int64_t pos = 0; pos < 50; ++pos) {
    auto a = Logits(), b = Logits();
    EXPECT_EQ(Sample(a, p, 42, pos, {}).token_id, Sample(b, p, 42, pos, {}).token_id);
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  for (int s = 0; s < 20; ++s) {
    auto l = Logits();
    EXPECT_EQ(Sample(l, p, s, 0, {}).token_id, 1);
  }
  p.top_k = 0;
  p.top_p = 0.01f;
  for (int s = 0; s < 20; ++s) {
    auto l = Logits();
    EXPECT_EQ(Sample(l, p, s, 0, {}).token_id, 1);
  }
}

TEST(SamplerTest, TopKTwoOnlyDrawsTheTwoBest) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 2;
  for (int s = 0; s < 200; ++s) {
    auto l = Logits();
    int t = Sample(l, p, s, 3, {}).token_id;
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with prob >= half the best: ids 1 (3.0) and 4 (2.9), 2 (2.0)? no
  for (int s = 0; s < 200; ++s) {
    auto l = Logits();
    int t = Sample(l, p, s, 0, {}).token_id;
    EXPECT_TRUE(t == 1 || t == 4) << t;  // e^(2-3) = 0.37 < 0.5
  }
}

TEST(SamplerTest, EmpiricalDistributionMatchesSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  std::map<int, int> counts;
  const int n = 20000;
  for (int s = 0; s < n; ++s) {
    auto l = Logits();
    ++counts[Sample(l, p, 7, s, {}).token_id];
  }
  auto l = Logits();
  double z = 0;
  for (float v : l) z += std::exp(v / 0.7);
  for (int i = 0; i < 5; ++i) {
    double expect = std::exp(l[i] / 0.7) / z;
    // 4 standard deviations of a binomial proportion at n = 20000 is below 0.015.
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expect, 0.015) << "token " << i;
  }
}

TEST(SamplerTest, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  auto l = Logits();
  std::vector<int32_t> history = {1};
  EXPECT_EQ(Sample(l, p, 0, 0, history).token_id, 4);  // 3.0 / 2 = 1.5 < 2.9
}

TEST(SamplerTest, LogprobsComeFromRawLogits) {
  SamplingParams p;
  p.logprobs = 2;
  auto l = Logits();
  auto r = Sample(l, p, 0, 0, {});
  ASSERT_EQ(r.logprobs.top.size(), 2u);
  EXPECT_EQ(r.logprobs.top[0].token_id, 1);
  EXPECT_EQ(r.logprobs.top[1].token_id, 4);
  double z = 0;
  for (float v : Logits()) z += std::exp(v);
  EXPECT_NEAR(r.logprobs.sampled.logprob, 3.0 - std::log(z), 1e-5);
}

// The tokens a spec can draw from `logits`, found by drawing with many seeds (temperature high
// enough that every kept token shows up).
std::set<int32_t> Drawn(const std::vector<float>& logits, SampleSpec spec, int draws = 3000) {
  std::set<int32_t> out;
  for (int s = 0; s < draws; ++s) {
    spec.seed = 1000 + s;
    spec.position = s % 7;
    out.insert(SampleRowRule(logits.data(), static_cast<int>(logits.size()), spec, {}, nullptr));
  }
  return out;
}

std::vector<float> LogsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(SampleRuleTest, TopKKeepsExactlyTheKBestAndEveryTieAtTheThreshold) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 0.3f);
  std::vector<float> l(64);
  for (float& v : l) v = g(rng);
  std::vector<int32_t> order(64);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  SampleSpec s;
  s.temperature = 1.5f;
  s.top_k = 5;
  EXPECT_EQ(Drawn(l, s), std::set<int32_t>(order.begin(), order.begin() + 5));
  // Ties at the k-th value are all kept (vLLM's threshold rule): k = 2 of {5, 4, 4, 4, ...}.
  std::vector<float> t = {4.0f, 5.0f, 1.0f, 4.0f, 4.0f, 0.0f};
  s.top_k = 2;
  EXPECT_EQ(Drawn(t, s), (std::set<int32_t>{0, 1, 3, 4}));
  s.top_k = 6;  // == vocab: off
  EXPECT_EQ(Drawn(t, s).size(), 6u);
}

TEST(SampleRuleTest, TopPKeepsTheSmallestTopSetReachingP) {
  const std::vector<float> l = LogsOf({0.125, 0.5, 0.125, 0.25});
  SampleSpec s;
  s.temperature = 1.0f;
  s.top_p = 0.45f;  // 0.5 alone reaches it
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{1}));
  s.top_p = 0.7f;  // 0.5 + 0.25
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{1, 3}));
  s.top_p = 0.8f;  // needs a 0.125: both equal ones are kept (a threshold keeps ties)
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SampleRuleTest, TopPCountsMassWithinWhatTopKKept) {
  const std::vector<float> l = LogsOf({0.4, 0.3, 0.2, 0.1});
  SampleSpec s;
  s.temperature = 1.0f;
  s.top_p = 0.5f;
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{0, 1})) << "0.4 < 0.5 of the whole";
  s.top_k = 2;
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{0})) << "0.4 / 0.7 >= 0.5 of the top 2";
}

TEST(SampleRuleTest, MinPKeepsTokensAtLeastMinPTimesTheBest) {
  const std::vector<float> l = LogsOf({0.3, 0.06, 0.16, 0.48});
  SampleSpec s;
  s.temperature = 1.0f;
  s.min_p = 0.3f;  // 0.3 * 0.48 = 0.144
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{0, 2, 3}));
  s.min_p = 0.5f;  // 0.24
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{0, 3}));
  s.min_p = 1.0f;
  EXPECT_EQ(Drawn(l, s), (std::set<int32_t>{3}));
}

TEST(SampleRuleTest, GreedyIgnoresFiltersButNotThePenalty) {
  const std::vector<float> l = {1.0f, 3.0f, -0.5f, 2.9f};
  SampleSpec s;
  s.top_k = 3;
  s.top_p = 0.1f;
  s.min_p = 0.9f;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, {}, nullptr), 1);
  s.repetition_penalty = 2.0f;
  const std::vector<int32_t> seen = {1, 1, 2};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, seen, nullptr), 3) << "3.0 / 2 < 2.9";
}

TEST(SampleRuleTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  // Token 0 (-1.0) seen twice becomes -2.0, not -4.0: still above token 2 (-3.0) when greedy
  // over {0, 2} only; token 1 (4.0) becomes 2.0.
  const std::vector<float> l = {-1.0f, 4.0f, -3.0f, 1.9f};
  SampleSpec s;
  s.repetition_penalty = 2.0f;
  const std::vector<int32_t> seen = {0, 0, 1};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, seen, nullptr), 1) << "4.0 / 2 = 2.0 > 1.9";
  const std::vector<float> neg = {-1.0f, -1.9f, -3.0f};
  const std::vector<int32_t> seen0 = {0, 0};
  EXPECT_EQ(SampleRowRule(neg.data(), 3, s, seen0, nullptr), 1) << "-1.0 * 2 = -2.0 < -1.9";
  const std::vector<int32_t> outside = {-5, 99};
  EXPECT_EQ(SampleRowRule(neg.data(), 3, s, outside, nullptr), 0) << "ids outside are ignored";
}

TEST(SampleRuleTest, LogprobsAreSortedNormalisedAndAccurate) {
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.0f, 3.0f);
  std::vector<float> l(5000);
  for (float& v : l) v = g(rng);
  l[17] = l[4000] = 15.0f;  // a tie at the top: lower id first
  SampleSpec s;
  s.temperature = 0.8f;
  s.top_k = 50;
  s.logprobs = 20;
  s.repetition_penalty = 1.5f;  // logprobs are of the raw logits all the same
  const std::vector<int32_t> seen = {17, 3};
  RowLogprobs lp;
  const int32_t token = SampleRowRule(l.data(), 5000, s, seen, &lp);
  double mx = -INFINITY, sum = 0.0;
  for (float v : l) mx = std::max(mx, static_cast<double>(v));
  for (float v : l) sum += std::exp(v - mx);
  const double lse = mx + std::log(sum);
  ASSERT_EQ(lp.num_top, 20);
  EXPECT_EQ(lp.top_ids[0], 17);
  EXPECT_EQ(lp.top_ids[1], 4000);
  for (int i = 0; i < 20; ++i) {
    EXPECT_NEAR(lp.top[i], l[lp.top_ids[i]] - lse, 2e-6) << i;
    if (i > 0) {
      EXPECT_GE(lp.top[i - 1], lp.top[i]) << i;
    }
  }
  EXPECT_NEAR(lp.sampled, l[token] - lse, 2e-6);
  // Normalised: exp of every token's logprob sums to 1.
  double total = 0.0;
  for (float v : l) total += std::exp(static_cast<double>(v) - (l[17] - lp.top[0]));
  EXPECT_NEAR(total, 1.0, 1e-5);
}

TEST(SampleRuleTest, FilteredDrawsFollowTheRenormalisedSoftmax) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};
  SampleSpec s;
  s.temperature = 0.9f;
  s.top_k = 4;     // drops 3 and 5
  s.min_p = 0.2f;  // e^((1 - 3) / 0.9) = 0.108 < 0.2: drops 0
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    s.seed = 3;
    s.position = i;
    ++counts[SampleRowRule(l.data(), 6, s, {}, nullptr)];
  }
  double z = 0;
  for (int i : {1, 2, 4}) z += std::exp(l[i] / 0.9);
  for (int i = 0; i < 6; ++i) {
    const double expect = (i == 1 || i == 2 || i == 4) ? std::exp(l[i] / 0.9) / z : 0.0;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expect, 0.015) << "token " << i;
  }
}

// The rule's own ln and exp (sample_noise.h), built from rounded operations so host and device
// agree bitwise, stay close to the true functions.
TEST(SampleRuleTest, DeterministicLnAndExpAreAccurate) {
  for (double d = -28.0; d <= 0.0; d += 0.01) {
    const float f = static_cast<float>(d);
    const double want = std::ldexp(std::exp(static_cast<double>(f)), kWeightBits);
    // Relative error 1e-6, plus the truncation to an integer where the weight is tiny.
    EXPECT_NEAR(static_cast<double>(FixedWeight(f)), want, 1e-6 * want + 1.0) << d;
  }
  EXPECT_EQ(FixedWeight(0.0f), uint64_t{1} << kWeightBits);
  EXPECT_EQ(FixedWeight(-40.0f), 0u);
  EXPECT_EQ(FixedWeight(-INFINITY), 0u);
  for (float x : {1e-30f, 1e-7f, 0.3f, 0.70710677f, 0.9999999f, 1.0f, 1.0000001f, 2.0f, 1e20f}) {
    const double want = std::log(static_cast<double>(x));
    const double scale = std::max(1.0, std::fabs(want));
    EXPECT_NEAR(DetLn(x), want, 3e-7 * scale) << x;
    EXPECT_NEAR(DetLnD(x), want, 1e-15 * scale) << x;
  }
  // The noise at the extremes of the 24-bit uniform is finite.
  EXPECT_TRUE(std::isfinite(GumbelNoise(0.5f / 16777216.0f)));
  EXPECT_TRUE(std::isfinite(GumbelNoise((16777215.0f + 0.5f) / 16777216.0f)));
}

}  // namespace
}  // namespace cascade::engine
