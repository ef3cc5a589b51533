// ValidateForwardBatch, the one check every backend runs on a batch: a well-formed batch passes,
// and breaking any one rule gives INVALID_ARGUMENT naming that rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "gpu_worker/engine/backend.h"

namespace cascade::engine {
namespace {

using ::testing::HasSubstr;

constexpr BatchLimits kLimits{
    .vocab_size = 50, .num_blocks = 6, .block_size = 4, .max_num_tokens = 16};

// Two sequences: one with 5 cached tokens computing positions 5..6 (blocks 2, 0), one new
// prefilling positions 0..2 (block 5). Logits for each sequence's last row.
ForwardBatch Valid() {
  ForwardBatch b;
  b.token_ids = {7, 8, 1, 2, 3};
  b.positions = {5, 6, 0, 1, 2};
  b.slot_mapping = {0 * 4 + 1, 0 * 4 + 2, 5 * 4 + 0, 5 * 4 + 1, 5 * 4 + 2};
  b.query_start = {0, 2, 5};
  b.context_lens = {7, 3};
  b.block_table_start = {0, 2, 3};
  b.block_ids = {2, 0, 5};
  b.logits_rows = {1, 4};
  RowSample sampled{true, {}};
  sampled.spec.temperature = 0.5f;
  sampled.spec.top_k = 3;
  sampled.spec.repetition_penalty = 1.2f;
  sampled.spec.penalty_start = 1;
  sampled.spec.penalty_count = 2;
  sampled.spec.logprobs = 20;
  b.row_samples = {RowSample{}, sampled};
  b.penalty_tokens = {4, 9, 49};
  return b;
}

struct Case {
  std::string name;
  std::function<void(ForwardBatch&)> breaks;
  std::string message;  // part of the error
};

TEST(ValidateForwardBatch, AcceptsAWellFormedBatch) {
  EXPECT_TRUE(ValidateForwardBatch(Valid(), kLimits).ok())
      << ValidateForwardBatch(Valid(), kLimits);
  ForwardBatch no_samples = Valid();
  no_samples.row_samples.clear();
  EXPECT_TRUE(ValidateForwardBatch(no_samples, kLimits).ok());
  EXPECT_TRUE(
      ValidateForwardBatch(ForwardBatch{.query_start = {0}, .block_table_start = {0}}, kLimits)
          .ok())
      << "an empty batch is well formed";
}

TEST(ValidateForwardBatch, RejectsEachBrokenRuleByName) {
  const std::vector<Case> cases = {
      {"too many tokens", [](ForwardBatch& b) { b.token_ids.assign(17, 1); },
       "17 tokens exceed max_num_tokens 16"},
      {"positions short", [](ForwardBatch& b) { b.positions.pop_back(); }, "positions (4)"},
      {"slot_mapping long", [](ForwardBatch& b) { b.slot_mapping.push_back(3); },
       "slot_mapping (6)"},
      {"query_start not ending at num_tokens", [](ForwardBatch& b) { b.query_start[2] = 4; },
       "query_start"},
      {"query_start decreasing",
       [](ForwardBatch& b) {
         b.query_start = {0, 6, 5};
       },
       "query_start"},
      {"query_start missing its end", [](ForwardBatch& b) { b.query_start.pop_back(); },
       "query_start"},
      {"block_table_start not from 0", [](ForwardBatch& b) { b.block_table_start[0] = 1; },
       "block_table_start"},
      {"block_table_start past block_ids", [](ForwardBatch& b) { b.block_table_start[2] = 4; },
       "block_table_start"},
      {"block id past the cache", [](ForwardBatch& b) { b.block_ids[1] = 6; },
       "block_ids[1] = 6 outside [0, 6)"},
      {"negative block id", [](ForwardBatch& b) { b.block_ids[2] = -1; }, "block_ids[2] = -1"},
      {"context longer than the block table", [](ForwardBatch& b) { b.context_lens[1] = 5; },
       "context_lens[1] = 5 does not fit its 1 blocks"},
      {"token id outside the vocabulary", [](ForwardBatch& b) { b.token_ids[3] = 50; },
       "token_ids[3] = 50 outside [0, 50)"},
      {"negative token id", [](ForwardBatch& b) { b.token_ids[0] = -2; }, "token_ids[0] = -2"},
      {"position at the context length", [](ForwardBatch& b) { b.positions[1] = 7; },
       "positions[1] = 7 outside [0, context_lens[0] = 7)"},
      {"negative position", [](ForwardBatch& b) { b.positions[2] = -1; }, "positions[2] = -1"},
      {"slot not where the block table puts the position",
       [](ForwardBatch& b) { b.slot_mapping[4] = 5 * 4 + 3; },
       "slot_mapping[4] = 23 but the block table puts position 2 at slot 22"},
      {"logits row past the batch", [](ForwardBatch& b) { b.logits_rows[1] = 5; }, "logits_rows"},
      {"logits rows not ascending",
       [](ForwardBatch& b) {
         b.logits_rows = {4, 1};
       },
       "logits_rows"},
      {"logits row repeated",
       [](ForwardBatch& b) {
         b.logits_rows = {1, 1};
       },
       "logits_rows"},
      {"row_samples not one per logits row", [](ForwardBatch& b) { b.row_samples.pop_back(); },
       "row_samples (1)"},
      {"too many logprobs", [](ForwardBatch& b) { b.row_samples[1].spec.logprobs = 21; },
       "row_samples[1]: logprobs 21 outside [0, 20]"},
      {"score token outside the vocabulary",
       [](ForwardBatch& b) { b.row_samples[1].spec.score_token = 50; },
       "row_samples[1]: score_token 50 outside [-1, 50)"},
      {"score token below -1", [](ForwardBatch& b) { b.row_samples[0].spec.score_token = -2; },
       "row_samples[0]: score_token -2 outside [-1, 50)"},
      {"top_p of 0", [](ForwardBatch& b) { b.row_samples[1].spec.top_p = 0.0f; },
       "row_samples[1]: temperature 0.5, top_p 0"},
      {"negative temperature", [](ForwardBatch& b) { b.row_samples[0].spec.temperature = -1.0f; },
       "row_samples[0]: temperature -1"},
      {"penalty range past penalty_tokens",
       [](ForwardBatch& b) { b.row_samples[1].spec.penalty_count = 3; },
       "row_samples[1]: penalty tokens [1, +3) outside penalty_tokens (3)"},
      {"penalty token outside the vocabulary", [](ForwardBatch& b) { b.penalty_tokens[2] = 50; },
       "penalty_tokens[2] = 50 outside [0, 50)"},
      {"negative penalty token in a long list (the blocked check)",
       [](ForwardBatch& b) {
         b.penalty_tokens.resize(40, 7);
         b.penalty_tokens[21] = -3;
       },
       "penalty_tokens[21] = -3 outside [0, 50)"},
      {"penalty token past the vocabulary in a long list's last block",
       [](ForwardBatch& b) {
         b.penalty_tokens.resize(32, 7);
         b.penalty_tokens[31] = 1 << 30;
       },
       "penalty_tokens[31] = 1073741824 outside [0, 50)"},
      {"logit bias without penalty_counts",
       [](ForwardBatch& b) { b.row_samples[1].spec.biased = 1; }, "without penalty_counts (0"},
      {"logit bias without penalty_bias",
       [](ForwardBatch& b) {
         b.row_samples[1].spec.biased = 1;
         b.penalty_counts = {0, -1, 0};
       },
       "logit bias without penalty_bias (0 for 3 tokens)"},
      {"penalty_bias not parallel", [](ForwardBatch& b) { b.penalty_bias = {1.0f}; },
       "penalty_bias (1) must be empty or parallel"},
      {"a bias-only count in a row that is not biased",
       [](ForwardBatch& b) {
         b.row_samples[1].spec.frequency_penalty = 0.5f;
         b.penalty_counts = {0, -1, 0};
       },
       "must be ascending with counts >= 0 (at 1)"},
      {"a bias of +inf",
       [](ForwardBatch& b) {
         b.row_samples[1].spec.biased = 1;
         b.penalty_counts = {0, -1, 0};
         b.penalty_bias = {0.0f, 0.0f, INFINITY};
       },
       "counts >= -1 and finite or -inf biases (at 2)"},
      {"a bias that is NaN",
       [](ForwardBatch& b) {
         b.row_samples[1].spec.biased = 1;
         b.penalty_counts = {0, -1, 0};
         b.penalty_bias = {0.0f, NAN, 0.0f};
       },
       "counts >= -1 and finite or -inf biases (at 1)"},
      {"biased neither 0 nor 1", [](ForwardBatch& b) { b.row_samples[1].spec.biased = 2; },
       "biased 2"},
  };
  for (const Case& c : cases) {
    ForwardBatch b = Valid();
    c.breaks(b);
    const absl::Status s = ValidateForwardBatch(b, kLimits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
  }
}

// A biased row's entries: ascending tokens, counts from -1 (a bias alone), finite biases or
// -inf (min_tokens' ban of the stop ids).
TEST(ValidateForwardBatch, ABiasedRowWithEntriesIsValid) {
  ForwardBatch b = Valid();
  b.row_samples[1].spec.biased = 1;
  b.penalty_counts = {0, -1, 3};
  b.penalty_bias = {-INFINITY, -100.0f, 2.5f};
  EXPECT_TRUE(ValidateForwardBatch(b, kLimits).ok()) << ValidateForwardBatch(b, kLimits);
}

TEST(ValidateForwardBatch, NoTokenLimitWhenMaxNumTokensIsZero) {
  BatchLimits limits = kLimits;
  limits.max_num_tokens = 0;
  ForwardBatch b;
  b.query_start = {0, 20};
  b.block_table_start = {0, 5};
  b.block_ids = {0, 1, 2, 3, 4};
  b.context_lens = {20};
  for (int p = 0; p < 20; ++p) {
    b.token_ids.push_back(1);
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);
  }
  EXPECT_TRUE(ValidateForwardBatch(b, limits).ok()) << ValidateForwardBatch(b, limits);
  EXPECT_FALSE(ValidateForwardBatch(b, kLimits).ok());
}

}  // namespace
}  // namespace cascade::engine
