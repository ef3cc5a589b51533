// Sampling: parameter validation names the field; greedy is argmax; seeded draws are a pure
// function of (seed, position); filters restrict the support; the empirical distribution
// matches softmax within a tolerance that a fixed-seed run of 20000 draws meets easily.
#include "gpu_worker/engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

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
  EXPECT_NE(UniformAt(1, 5), UniformAt(2, 5));
  EXPECT_NE(UniformAt(1, 5), UniformAt(1, 6));
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

TEST(SamplerTest, SampleableOnDeviceOnlyForGreedyOrPlainTemperatureWithNothingElse) {
  SamplingParams p;
  EXPECT_TRUE(SampleableOnDevice(p)) << "greedy";
  p.top_k = 5;
  p.top_p = 0.5f;
  p.min_p = 0.2f;
  EXPECT_TRUE(SampleableOnDevice(p)) << "greedy ignores truncation";
  p = {};
  p.temperature = 0.7f;
  EXPECT_TRUE(SampleableOnDevice(p)) << "plain temperature";
  p.top_k = -1;
  EXPECT_TRUE(SampleableOnDevice(p)) << "top_k -1 is disabled";
  for (auto change : std::vector<std::function<void(SamplingParams&)>>{
           [](SamplingParams& q) { q.top_k = 3; }, [](SamplingParams& q) { q.top_p = 0.9f; },
           [](SamplingParams& q) { q.min_p = 0.1f; }}) {
    SamplingParams q = p;
    change(q);
    EXPECT_FALSE(DrawsByRowRule(q));
    EXPECT_FALSE(SampleableOnDevice(q));
  }
  for (float t : {0.0f, 0.7f}) {
    SamplingParams q;
    q.temperature = t;
    q.repetition_penalty = 1.1f;
    EXPECT_TRUE(DrawsByRowRule(q));
    EXPECT_FALSE(SampleableOnDevice(q)) << "the penalty needs the history, on the host";
    q = {};
    q.temperature = t;
    q.logprobs = 2;
    EXPECT_FALSE(SampleableOnDevice(q)) << "logprobs need the whole row";
  }
}

// The property the predicate exists for: a row the backend samples (SampleRow, the device's rule)
// gets exactly the token the host sampler would draw for it.
TEST(SamplerTest, DeviceSampleableRowsDrawTheHostSamplersToken) {
  std::mt19937 rng(3);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(64);
    for (float& v : row) v = logit(rng);
    if (trial % 7 == 0) row[trial % 64] = row[(trial + 1) % 64];  // ties
    SamplingParams p;
    p.temperature = trial % 3 == 0 ? 0.0f : 0.2f + 0.01f * static_cast<float>(trial % 150);
    if (trial % 5 == 1) p.top_k = -1;
    ASSERT_TRUE(SampleableOnDevice(p));
    const uint64_t seed = 77 + trial;
    const int64_t position = 10 + trial;
    std::vector<float> scratch = row;
    const int32_t host = Sample(scratch, p, seed, position, {}).token_id;
    const int32_t device = SampleRow(row.data(), static_cast<int>(row.size()),
                                     RowSample{true, p.temperature, seed, position});
    EXPECT_EQ(host, device) << "trial " << trial;
    ++checked;
  }
  EXPECT_EQ(checked, 200);
}

}  // namespace
}  // namespace cascade::engine
