// Sampling: parameter validation names the field; greedy is argmax; seeded draws are a pure
// function of (seed, position); filters restrict the support; the empirical distribution
// matches softmax within a tolerance that a fixed-seed run of 20000 draws meets easily.
#include "gpu_worker/engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/penalty_list.h"
#include "gpu_worker/engine/row_sampler.h"

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
  EXPECT_TRUE(ValidateSampling(p, 100, 100).ok());
  p.temperature = NAN;
  EXPECT_FALSE(ValidateSampling(p, 10, 100).ok());
}

TEST(SamplerTest, GreedyIsArgmax) {
  auto l = Logits();
  SamplingParams p;
  EXPECT_EQ(Sample(l, p, 1, 0, {}, 0).token_id, 1);
}

TEST(SamplerTest, SeededDrawDependsOnlyOnSeedAndPosition) {
  SamplingParams p;
  p.temperature = 1.0f;
  for (int64_t pos = 0; pos < 50; ++pos) {
    auto a = Logits(), b = Logits();
    EXPECT_EQ(Sample(a, p, 42, pos, {}, 0).token_id, Sample(b, p, 42, pos, {}, 0).token_id);
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  for (int s = 0; s < 20; ++s) {
    auto l = Logits();
    EXPECT_EQ(Sample(l, p, s, 0, {}, 0).token_id, 1);
  }
  p.top_k = 0;
  p.top_p = 0.01f;
  for (int s = 0; s < 20; ++s) {
    auto l = Logits();
    EXPECT_EQ(Sample(l, p, s, 0, {}, 0).token_id, 1);
  }
}

TEST(SamplerTest, TopKTwoOnlyDrawsTheTwoBest) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 2;
  for (int s = 0; s < 200; ++s) {
    auto l = Logits();
    int t = Sample(l, p, s, 3, {}, 0).token_id;
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with prob >= half the best: ids 1 (3.0) and 4 (2.9), 2 (2.0)? no
  for (int s = 0; s < 200; ++s) {
    auto l = Logits();
    int t = Sample(l, p, s, 0, {}, 0).token_id;
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
    ++counts[Sample(l, p, 7, s, {}, 0).token_id];
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
  EXPECT_EQ(Sample(l, p, 0, 0, history, 0).token_id, 4);  // 3.0 / 2 = 1.5 < 2.9
}

TEST(SamplerTest, LogprobsComeFromRawLogits) {
  SamplingParams p;
  p.logprobs = 2;
  auto l = Logits();
  auto r = Sample(l, p, 0, 0, {}, 0);
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
    out.insert(
        SampleRowRule(logits.data(), static_cast<int>(logits.size()), spec, {}, {}, {}, nullptr));
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
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, {}, {}, {}, nullptr), 1);
  s.repetition_penalty = 2.0f;
  const std::vector<int32_t> seen = {1, 1, 2};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, seen, {}, {}, nullptr), 3) << "3.0 / 2 < 2.9";
}

TEST(SampleRuleTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  // Token 0 (-1.0) seen twice becomes -2.0, not -4.0: still above token 2 (-3.0) when greedy
  // over {0, 2} only; token 1 (4.0) becomes 2.0.
  const std::vector<float> l = {-1.0f, 4.0f, -3.0f, 1.9f};
  SampleSpec s;
  s.repetition_penalty = 2.0f;
  const std::vector<int32_t> seen = {0, 0, 1};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, seen, {}, {}, nullptr), 1) << "4.0 / 2 = 2.0 > 1.9";
  const std::vector<float> neg = {-1.0f, -1.9f, -3.0f};
  const std::vector<int32_t> seen0 = {0, 0};
  EXPECT_EQ(SampleRowRule(neg.data(), 3, s, seen0, {}, {}, nullptr), 1) << "-1.0 * 2 = -2.0 < -1.9";
  const std::vector<int32_t> outside = {-5, 99};
  EXPECT_EQ(SampleRowRule(neg.data(), 3, s, outside, {}, {}, nullptr), 0)
      << "ids outside are ignored";
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
  const int32_t token = SampleRowRule(l.data(), 5000, s, seen, {}, {}, &lp);
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

// A score row (a prompt token scored: vLLM's prompt_logprobs) draws nothing: its token is the
// scored one whatever the sampling options, its logprobs are step 5's of that token, and its rank
// vLLM's, the number of tokens whose logit is at least its own (ties count, NaN ranks last).
TEST(SampleRuleTest, ScoreRowsReturnTheScoredTokenWithItsLogprobsAndRank) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, NAN, 2.0f, 0.5f};
  SampleSpec s;
  s.temperature = 0.7f;  // ignored: nothing is drawn
  s.top_k = 1;
  s.logprobs = 3;
  const int32_t want_rank[] = {5, 2, 4, 2, 7, 8, 4, 6};
  for (int32_t t = 0; t < 8; ++t) {
    s.score_token = t;
    RowLogprobs got, want;
    EXPECT_EQ(SampleRowRule(l.data(), 8, s, {}, {}, {}, &got), t);
    RowLogprobsOf(l.data(), 8, t, 3, &want);
    EXPECT_EQ(got.rank, want_rank[t]) << "token " << t;
    EXPECT_EQ(TokenRank(l.data(), 8, t), want_rank[t]) << "token " << t;
    EXPECT_EQ(std::memcmp(&got.sampled, &want.sampled, 4), 0) << "token " << t;
    ASSERT_EQ(got.num_top, 3);
    EXPECT_EQ(got.top_ids[0], 1);  // 3.0 twice: the lower id first
    EXPECT_EQ(got.top_ids[1], 3);
    EXPECT_EQ(got.top_ids[2], 2);
  }
  // Logprobs 0: the scored token's alone (no top list), still with its rank.
  s.logprobs = 0;
  s.score_token = 7;
  RowLogprobs z;
  EXPECT_EQ(SampleRowRule(l.data(), 8, s, {}, {}, {}, &z), 7);
  EXPECT_EQ(z.num_top, 0);
  EXPECT_EQ(z.rank, 6);
  EXPECT_NEAR(z.sampled,
              0.5 - (3.0 + std::log(2.0 + 2 * std::exp(-1.0) + std::exp(-2.0) + std::exp(-2.5) +
                                    std::exp(-4.0))),
              2e-6);
  // Sampled rows carry no rank.
  s.score_token = -1;
  s.logprobs = 2;
  RowLogprobs d;
  SampleRowRule(l.data(), 8, s, {}, {}, {}, &d);
  EXPECT_EQ(d.rank, 0);
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
    ++counts[SampleRowRule(l.data(), 6, s, {}, {}, {}, nullptr)];
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

namespace cascade::engine {
namespace {

// OpenAI's penalties on the host rule: a listed token generated c times loses
// frequency_penalty * c, then presence_penalty once; a listed token generated 0 times (prompt)
// keeps its logit; after the repetition penalty, in that order.
TEST(SampleRuleTest, FrequencyAndPresencePenaltiesCountGeneratedTokens) {
  const std::vector<float> l = {1.0f, 2.9f, 3.0f, 0.5f};
  const std::vector<int32_t> listed = {2};
  SampleSpec s;  // greedy
  s.frequency_penalty = 0.08f;
  const std::vector<int32_t> once = {1}, twice = {2}, never = {0};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, once, {}, nullptr), 2) << "3.0 - 0.08 > 2.9";
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, twice, {}, nullptr), 1) << "3.0 - 0.16 < 2.9";
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, never, {}, nullptr), 2) << "a prompt token";
  s.frequency_penalty = 0.0f;
  s.presence_penalty = 0.05f;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, twice, {}, nullptr), 2) << "once: 3.0 - 0.05";
  s.presence_penalty = 0.2f;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, once, {}, nullptr), 1) << "3.0 - 0.2 < 2.9";
  // A negative penalty raises the token.
  const std::vector<int32_t> listed1 = {1};
  s.presence_penalty = -0.2f;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed1, once, {}, nullptr), 1) << "2.9 + 0.2 > 3.0";
  // Order: repetition (3.0 / 2 = 1.5), frequency (1.5 - 2 x 0.5 = 0.5), presence (0.5 - 0.25).
  const std::vector<float> m = {0.3f, 0.0f, 3.0f};
  s.repetition_penalty = 2.0f, s.frequency_penalty = 0.5f, s.presence_penalty = 0.25f;
  EXPECT_EQ(SampleRowRule(m.data(), 3, s, listed, twice, {}, nullptr), 0) << "0.25 < 0.3";
  const std::vector<float> m2 = {0.2f, 0.0f, 3.0f};
  EXPECT_EQ(SampleRowRule(m2.data(), 3, s, listed, twice, {}, nullptr), 2) << "0.25 > 0.2";
  EXPECT_FLOAT_EQ(PenalizedLogit(3.0f, 2, 0.0f, s), 0.25f);
  EXPECT_FLOAT_EQ(PenalizedLogit(3.0f, 0, 0.0f, s), 1.5f);
}

// Sample() counts only the history's tokens from output_start on for the frequency and presence
// penalties (the repetition penalty lists the prompt's as well).
TEST(SamplerTest, FrequencyPenaltyCountsOnlyGeneratedTokens) {
  std::vector<float> l = {1.0f, 2.9f, 3.0f, 0.5f};
  SamplingParams p;
  p.frequency_penalty = 0.08f;
  const std::vector<int32_t> history = {2, 0, 2, 2};
  EXPECT_EQ(Sample(l, p, 0, 4, history, 4).token_id, 2) << "all prompt";
  EXPECT_EQ(Sample(l, p, 0, 4, history, 3).token_id, 2) << "generated once";
  EXPECT_EQ(Sample(l, p, 0, 4, history, 2).token_id, 1) << "generated twice";
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.2f;
  EXPECT_EQ(Sample(l, p, 0, 4, history, 1).token_id, 1);
  EXPECT_EQ(Sample(l, p, 0, 4, history, 4).token_id, 2);
  for (float bad : {-2.5f, 2.01f, NAN}) {
    SamplingParams q;
    q.frequency_penalty = bad;
    absl::Status st = ValidateSampling(q, 4, 100);
    EXPECT_TRUE(absl::IsInvalidArgument(st));
    EXPECT_NE(st.message().find("sampling.frequency_penalty"), std::string::npos) << st;
    q.frequency_penalty = 0.0f;
    q.presence_penalty = bad;
    st = ValidateSampling(q, 4, 100);
    EXPECT_NE(st.message().find("sampling.presence_penalty"), std::string::npos) << st;
  }
}

// The listed tokens a sequence keeps for its penalties and logit bias, fed its tokens as a step
// loop sees them (a prompt at once, then a few at a time, some still pending), equal the list
// computed from scratch (and ListedOf's, what Sample() uses): distinct ids ascending, each with
// its count from output_start on, the prompt's listed only with a repetition penalty, biased
// tokens listed from the start with their bias (count -1 until they occur in the history); and
// a batch row's copy grown by the `added` callback equals it.
TEST(PenaltyListTest, IncrementalListEqualsTheListFromScratch) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 240; ++trial) {
    Sequence seq;
    const int vocab = trial % 3 == 0 ? 8 : 5000;  // many repeats, or few
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    const bool penalties = trial % 6 != 5;  // else a logit bias alone
    seq.sampling.repetition_penalty = penalties && trial % 2 ? 1.3f : 1.0f;
    seq.sampling.frequency_penalty = penalties ? 0.5f : 0.0f;
    if (trial % 3 != 0 || !penalties) {
      std::map<int32_t, float> bias;
      const int n = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) bias[tok(rng)] = static_cast<float>(i) - 5.5f;
      seq.sampling.logit_bias.assign(bias.begin(), bias.end());
    }
    const bool biased = !seq.sampling.logit_bias.empty();
    StartListed(seq.sampling, &seq.listed_tokens, &seq.listed_counts, &seq.listed_bias);
    const int prompt = 1 + static_cast<int>(rng() % (trial % 4 == 0 ? 300 : 40));
    for (int i = 0; i < prompt; ++i) seq.tokens.push_back(tok(rng));
    seq.output_start = static_cast<size_t>(prompt - static_cast<int>(rng() % (prompt / 2 + 1)));
    // A batch row's copy (what FillPenalties copies, then `added` grows in FillPending).
    std::vector<int32_t> row_tokens = seq.listed_tokens, row_counts = seq.listed_counts;
    std::vector<float> row_bias = seq.listed_bias;
    int32_t row_n = static_cast<int32_t>(row_tokens.size());
    auto add_to_row = [&](int32_t t, bool generated) {
      row_tokens.resize(static_cast<size_t>(row_n) + 1), row_counts.resize(row_tokens.size());
      row_bias.resize(row_tokens.size());
      AddListed(row_tokens.data(), row_counts.data(), biased ? row_bias.data() : nullptr, &row_n, t,
                generated);
    };
    AdvanceListed(&seq, add_to_row);
    for (int step = 0; step < 30; ++step) {
      // A pending token, then known: folded only once known.
      seq.tokens.push_back(kPendingToken);
      AdvanceListed(&seq, add_to_row);
      seq.tokens.back() = tok(rng);
      if (step % 7 == 3) {  // several at once, as after a preemption's recompute
        for (int j = 0; j < 70; ++j) seq.tokens.push_back(tok(rng));
      }
      AdvanceListed(&seq, add_to_row);
    }
    std::map<int32_t, std::pair<int32_t, float>> want;  // token -> (generated count, bias)
    for (const auto& [t, b] : seq.sampling.logit_bias) want[t] = {-1, b};
    for (size_t i = 0; i < seq.tokens.size() && penalties; ++i) {
      if (i >= seq.output_start) {
        int32_t& c = want.try_emplace(seq.tokens[i], -1, 0.0f).first->second.first;
        c = std::max(c, 0) + 1;
      } else if (seq.sampling.repetition_penalty != 1.0f) {
        int32_t& c = want.try_emplace(seq.tokens[i], -1, 0.0f).first->second.first;
        c = std::max(c, 0);
      }
    }
    std::vector<int32_t> want_tokens, want_counts;
    std::vector<float> want_bias;
    for (const auto& [t, e] : want) {
      want_tokens.push_back(t), want_counts.push_back(e.first);
      if (biased) want_bias.push_back(e.second);
    }
    ASSERT_EQ(seq.listed_tokens, want_tokens) << "trial " << trial;
    ASSERT_EQ(seq.listed_counts, want_counts) << "trial " << trial;
    ASSERT_EQ(seq.listed_bias, want_bias) << "trial " << trial;
    row_tokens.resize(static_cast<size_t>(row_n)), row_counts.resize(row_tokens.size());
    row_bias.resize(biased ? row_tokens.size() : 0);
    ASSERT_EQ(row_tokens, want_tokens) << "trial " << trial;
    ASSERT_EQ(row_counts, want_counts) << "trial " << trial;
    ASSERT_EQ(row_bias, want_bias) << "trial " << trial;
    std::vector<int32_t> from_tokens, from_counts;
    std::vector<float> from_bias;
    ListedOf(seq.sampling, seq.tokens, seq.output_start, &from_tokens, &from_counts, &from_bias);
    ASSERT_EQ(from_tokens, want_tokens) << "trial " << trial;
    ASSERT_EQ(from_counts, want_counts) << "trial " << trial;
    ASSERT_EQ(from_bias, want_bias) << "trial " << trial;
  }
}

// OpenAI's logit bias on the host rule (step 1): added to the logit first; a token listed for
// its bias alone (count -1) takes no penalty; a token of the history takes its bias, then the
// penalties; +-100 forces or bans a token; logprobs stay those of the unbiased logits.
TEST(SampleRuleTest, LogitBiasIsAddedBeforeThePenalties) {
  const std::vector<float> l = {1.0f, 2.9f, 3.0f, 0.5f};
  SampleSpec s;  // greedy
  s.biased = 1;
  const std::vector<int32_t> listed = {1};
  const std::vector<int32_t> bias_only = {-1};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, bias_only, std::vector<float>{0.2f}, nullptr), 1)
      << "2.9 + 0.2 > 3.0";
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, bias_only, std::vector<float>{0.05f}, nullptr), 2)
      << "2.9 + 0.05 < 3.0";
  const std::vector<int32_t> ban = {2}, force = {3};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, ban, bias_only, std::vector<float>{-100.0f}, nullptr), 1);
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, force, bias_only, std::vector<float>{100.0f}, nullptr),
            3);
  // With the repetition penalty: a bias-only token keeps its biased logit, a token of the
  // history (count 0: the prompt) is divided after the bias: (2.9 + 0.2) / 2 = 1.55 < 3.0.
  s.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0};
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, bias_only, std::vector<float>{0.2f}, nullptr), 1);
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, listed, prompt, std::vector<float>{0.2f}, nullptr), 2);
  // Order on one value: (3 + 1) / 2 = 2, then - 2 x 0.5, then - 0.25.
  s.frequency_penalty = 0.5f, s.presence_penalty = 0.25f;
  EXPECT_FLOAT_EQ(PenalizedLogit(3.0f, 2, 1.0f, s), 0.75f);
  EXPECT_FLOAT_EQ(PenalizedLogit(3.0f, -1, 1.0f, s), 4.0f);
  EXPECT_FLOAT_EQ(PenalizedLogit(-3.0f, 0, 1.0f, s), -4.0f);
  // Logprobs are the raw logits': the same with and without the bias; the sampled token differs.
  s = SampleSpec{};
  s.biased = 1;
  s.logprobs = 3;
  RowLogprobs with, without;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, force, bias_only, std::vector<float>{100.0f}, &with), 3);
  s.biased = 0;
  EXPECT_EQ(SampleRowRule(l.data(), 4, s, {}, {}, {}, &without), 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(with.top_ids[i], without.top_ids[i]);
    EXPECT_EQ(with.top[i], without.top[i]);
  }
  EXPECT_EQ(with.top_ids[0], 2);
  EXPECT_LT(with.sampled, without.sampled) << "the forced token's logprob is its raw one";
}

// Sample() (the engine's host path) applies the request's logit_bias, and ValidateSampling
// bounds it: ids in the vocabulary, distinct and ascending, biases in [-100, 100], at most
// kMaxLogitBias entries.
TEST(SamplerTest, LogitBiasIsAppliedAndValidated) {
  std::vector<float> l = {1.0f, 2.9f, 3.0f, 0.5f};
  SamplingParams p;
  p.logit_bias = {{0, 1.95f}, {2, -0.5f}};
  EXPECT_EQ(Sample(l, p, 0, 4, std::vector<int32_t>{2, 2}, 2).token_id, 0) << "1 + 1.95 > 2.9";
  p.repetition_penalty = 2.0f;  // the prompt's 0 is now penalized after its bias: 2.95 / 2
  EXPECT_EQ(Sample(l, p, 0, 4, std::vector<int32_t>{0, 3}, 2).token_id, 1);
  EXPECT_TRUE(ValidateSampling(p, 4, 100).ok());
  auto bad = [&](std::vector<std::pair<int32_t, float>> bias, const std::string& says) {
    SamplingParams q;
    q.logit_bias = std::move(bias);
    const absl::Status st = ValidateSampling(q, 4, 100);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << says;
    EXPECT_NE(st.message().find(says), std::string::npos) << st;
  };
  bad({{4, 1.0f}}, "outside the vocabulary");
  bad({{-1, 1.0f}}, "outside the vocabulary");
  bad({{2, 1.0f}, {1, 1.0f}}, "distinct and ascending");
  bad({{1, 1.0f}, {1, 2.0f}}, "distinct and ascending");
  bad({{1, 100.5f}}, "[-100, 100]");
  bad({{1, NAN}}, "[-100, 100]");
  std::vector<std::pair<int32_t, float>> many;
  for (int32_t i = 0; i <= static_cast<int32_t>(kMaxLogitBias); ++i) many.emplace_back(i, 1.0f);
  SamplingParams q;
  q.logit_bias = many;
  EXPECT_NE(ValidateSampling(q, 1 << 20, 100).message().find("at most"), std::string::npos);
}

// min_tokens' ban (penalty_list.h): the banned ids are the EOS ids (unless ignore_eos) and the
// stop ids, within the vocabulary, listed among the biased tokens from the start (a logit_bias
// of their own kept); a banning step's -inf bias makes a token unsampleable, greedy or drawn.
TEST(SamplerTest, MinTokensBansStopIdsWithMinusInfinity) {
  SamplingParams p;
  p.max_tokens = 8;
  p.stop_token_ids = {7, 2, 99};
  const std::vector<int32_t> eos = {5, 2};
  EXPECT_TRUE(StopBanOf(p, eos, 10).empty()) << "min_tokens 0: no ban";
  p.min_tokens = 3;
  EXPECT_EQ(StopBanOf(p, eos, 10), (std::vector<int32_t>{2, 5, 7}));
  p.ignore_eos = true;
  EXPECT_EQ(StopBanOf(p, eos, 10), (std::vector<int32_t>{2, 7}));
  p.ignore_eos = false;
  p.logit_bias = {{1, 0.5f}, {5, 2.0f}, {9, -1.0f}};
  const std::vector<int32_t> ban = StopBanOf(p, eos, 10);
  ListBanned(ban, &p);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<int32_t, float>>{
                              {1, 0.5f}, {2, 0.0f}, {5, 2.0f}, {7, 0.0f}, {9, -1.0f}}));
  EXPECT_TRUE(ValidateSampling(p, 100, 100).ok());
  const SamplingParams banned = BannedParams(p, ban);
  EXPECT_EQ(banned.logit_bias[1].second, -INFINITY);
  EXPECT_EQ(banned.logit_bias[2].second, -INFINITY);
  EXPECT_EQ(banned.logit_bias[0].second, 0.5f);
  std::vector<int32_t> tokens = {1, 2, 5, 7, 9};
  std::vector<float> bias = {0.5f, 0.0f, 2.0f, 0.0f, -1.0f};
  ApplyBan(ban, tokens.data(), bias.data(), 5);
  EXPECT_EQ(bias, (std::vector<float>{0.5f, -INFINITY, -INFINITY, -INFINITY, -1.0f}));

  // Greedy: the best token (7) is banned, so the next best (3).
  std::vector<float> l = {0.0f, 1.0f, 2.5f, 3.0f, 0.0f, 2.9f, 0.0f, 9.0f, 0.0f, 0.0f};
  SamplingParams g;
  g.logit_bias = {{2, 0.0f}, {5, 0.0f}, {7, 0.0f}};
  EXPECT_EQ(Sample(l, g, 0, 4, std::vector<int32_t>{1}, 1).token_id, 7);
  EXPECT_EQ(Sample(l, BannedParams(g, ban), 0, 4, std::vector<int32_t>{1}, 1).token_id, 3);
  // Drawn with top-k and top-p (and logprobs): never a banned id over many seeds, though 7 holds
  // nearly all the mass unbanned; logprobs stay the raw logits' (7 the likeliest).
  SamplingParams t = g;
  t.temperature = 1.0f, t.top_k = 6, t.top_p = 0.95f, t.logprobs = 2;
  std::set<int32_t> drawn;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const SampleResult b = Sample(l, BannedParams(t, ban), seed, 4, std::vector<int32_t>{1}, 1);
    EXPECT_FALSE(std::binary_search(ban.begin(), ban.end(), b.token_id)) << "seed " << seed;
    drawn.insert(b.token_id);
    ASSERT_EQ(b.logprobs.top.size(), 2u);
    EXPECT_EQ(b.logprobs.top[0].token_id, 7);
  }
  EXPECT_GT(drawn.size(), 1u) << "a draw, not the argmax";
}

}  // namespace
}  // namespace cascade::engine
