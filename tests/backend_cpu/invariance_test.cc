// The properties the design's acceptance test rests on, at the backend level: a row's logits are
// bitwise the same alone or in any batch, with any thread count and block placement; a prefill
// split across steps (keys read back from the paged cache) equals the cold one-step prefill
// bitwise; and the two faults from DESIGN.md's root causes break that equality (so the test
// would catch them). Also batch validation and the tiny preset's decode speed.
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>

#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/model/config.h"
#include "gtest/gtest.h"
#include "tests/backend_cpu/test_util.h"

namespace cascade::cpu {
namespace {

using engine::ForwardBatch;
using testing_util::MakeBatch;
using testing_util::MakeModel;
using testing_util::SeqStep;
using testing_util::SmallVocab;
using testing_util::Tokens;

constexpr int kBlock = 4;

bool BitwiseEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class InvarianceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = SmallVocab("tiny", 1000);
    model_ = MakeModel(config_, 3);
    ASSERT_NE(model_, nullptr);
  }
  std::unique_ptr<engine::Backend> Backend(int threads = 2, DebugFault fault = DebugFault::kNone) {
    return NewCpuBackend(
        *model_,
        {.num_blocks = 64, .block_size = kBlock, .num_threads = threads, .debug_fault = fault});
  }
  std::vector<float> Run(engine::Backend& b, const std::vector<SeqStep>& seqs) {
    std::vector<float> logits;
    absl::Status s = b.Forward(MakeBatch(seqs, kBlock), &logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }
  // Last-row logits of `tokens` prefilled in steps starting at each of `splits` (cold: {0}).
  std::vector<float> Prefill(engine::Backend& b, const std::vector<int32_t>& tokens,
                             const std::vector<int>& splits, const std::vector<int32_t>& blocks) {
    std::vector<float> logits;
    for (size_t i = 0; i < splits.size(); ++i) {
      int end = i + 1 < splits.size() ? splits[i + 1] : static_cast<int>(tokens.size());
      std::vector<int32_t> part(tokens.begin() + splits[i], tokens.begin() + end);
      logits = Run(b, {{part, splits[i], blocks}});
    }
    return logits;
  }

  model::ModelConfig config_;
  std::unique_ptr<model::Model> model_;
};

TEST_F(InvarianceTest, RowLogitsAreBitwiseEqualAloneAndInsideABatch) {
  const int64_t v = config_.vocab_size;
  std::vector<int32_t> a = Tokens(13, v, 1), b = Tokens(7, v, 2), c = Tokens(21, v, 3);
  auto alone_backend = Backend(1);
  std::vector<float> alone = Run(*alone_backend, {{a, 0, {0, 1, 2, 3}, true}});
  // Same sequence between two others, in other physical blocks, with three threads.
  auto batch_backend = Backend(3);
  std::vector<float> batch = Run(*batch_backend, {{b, 0, {10, 11}, true},
                                                  {a, 0, {20, 5, 31, 8}, true},
                                                  {c, 0, {40, 41, 42, 43, 44, 45}, true}});
  ASSERT_EQ(batch.size(), (7 + 13 + 21) * v);
  EXPECT_TRUE(BitwiseEqual(alone.data(), batch.data() + 7 * v, 13 * v));

  // A decode step of `a` alone vs batched with decode steps of the others.
  std::vector<float> d_alone = Run(*alone_backend, {{{42}, 13, {0, 1, 2, 3}}});
  std::vector<float> d_batch =
      Run(*batch_backend,
          {{{7}, 7, {10, 11}}, {{42}, 13, {20, 5, 31, 8}}, {{9}, 21, {40, 41, 42, 43, 44, 45}}});
  EXPECT_TRUE(BitwiseEqual(d_alone.data(), d_batch.data() + v, v));
  // Sanity: the other rows really are different.
  EXPECT_FALSE(BitwiseEqual(d_batch.data(), d_batch.data() + v, v));
}

TEST_F(InvarianceTest, SplitPrefillWithCachedKeysEqualsColdPrefillBitwise) {
  const std::vector<int32_t> tokens = Tokens(19, config_.vocab_size, 4);
  const std::vector<int32_t> blocks = {3, 9, 1, 14, 6};
  std::vector<float> cold = Prefill(*Backend(), tokens, {0}, blocks);
  for (const std::vector<int>& splits :
       std::vector<std::vector<int>>{{0, 8}, {0, 5}, {0, 18}, {0, 3, 11, 12, 18}}) {
    std::vector<float> split = Prefill(*Backend(), tokens, splits, blocks);
    EXPECT_TRUE(BitwiseEqual(cold.data(), split.data(), cold.size())) << splits[1];
  }
  // Token-by-token decode of the whole sequence, the way generation fills the cache.
  std::vector<int> every(tokens.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
  std::vector<float> decoded = Prefill(*Backend(), tokens, every, blocks);
  EXPECT_TRUE(BitwiseEqual(cold.data(), decoded.data(), cold.size()));
}

TEST_F(InvarianceTest, DesignRootCauseFaultsBreakCachedEqualsCold) {
  const std::vector<int32_t> tokens = Tokens(19, config_.vocab_size, 4);
  const std::vector<int32_t> blocks = {3, 9, 1, 14, 6};
  std::vector<float> cold = Prefill(*Backend(), tokens, {0}, blocks);
  for (DebugFault fault : {DebugFault::kLocalPositions, DebugFault::kNoCausalOffset}) {
    // With start_pos 0 the faults change nothing, so the cold run still matches...
    std::vector<float> faulty_cold = Prefill(*Backend(2, fault), tokens, {0}, blocks);
    EXPECT_TRUE(BitwiseEqual(cold.data(), faulty_cold.data(), cold.size()));
    // ...but reading the first 8 tokens' keys from the cache exposes them.
    std::vector<float> faulty_split = Prefill(*Backend(2, fault), tokens, {0, 8}, blocks);
    double max_diff = 0;
    for (size_t i = 0; i < cold.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(cold[i] - faulty_split[i])));
    }
    EXPECT_GT(max_diff, 1e-2) << static_cast<int>(fault);
  }
}

TEST_F(InvarianceTest, MalformedBatchesAreInvalidArgument) {
  auto backend = Backend();
  auto check = [&](const std::function<void(ForwardBatch*)>& corrupt, const std::string& what) {
    ForwardBatch b = MakeBatch({{{1, 2, 3}, 0, {0}}, {{4, 5}, 0, {1}}}, kBlock);
    corrupt(&b);
    std::vector<float> logits;
    absl::Status s = backend->Forward(b, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  check([](ForwardBatch* b) { b->token_ids[1] = 1000; }, "token_ids[1]");
  check([](ForwardBatch* b) { b->block_ids[1] = 64; }, "block_ids[1]");
  check([](ForwardBatch* b) { b->positions[2] = 7; }, "positions[2]");
  check([](ForwardBatch* b) { b->slot_mapping[0] = 5; }, "slot_mapping[0]");
  check([](ForwardBatch* b) { b->positions.pop_back(); }, "positions");
  check([](ForwardBatch* b) { b->query_start[1] = 9; }, "query_start");
  check([](ForwardBatch* b) { b->block_table_start[2] = 5; }, "block_table_start");
  check([](ForwardBatch* b) { b->context_lens[0] = 5; }, "context_lens[0]");
  check([](ForwardBatch* b) { b->logits_rows = {4, 2}; }, "logits_rows");
  EXPECT_EQ(NewCpuBackend(*model_, {.num_blocks = 0}), nullptr);
}

// The host KV tier's backend half: blocks copied to host memory, their cache blocks overwritten,
// and the copies written back into other blocks give a tail prefill bitwise the cold logits; the
// same tail over the overwritten blocks does not (so the comparison sees the KV).
TEST_F(InvarianceTest, BlocksCopiedToHostAndBackGiveBitwiseTheColdLogits) {
  const std::vector<int32_t> tokens = Tokens(19, config_.vocab_size, 4);
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 16);
  const std::vector<int32_t> tail(tokens.begin() + 16, tokens.end());
  std::vector<float> cold = Prefill(*Backend(), tokens, {0}, {3, 9, 1, 14, 6});

  auto b = Backend();
  ASSERT_GT(b->KvBlockBytes(), 0);
  const std::vector<int32_t> first = {3, 9, 1, 14};
  Run(*b, {{head, 0, first}});
  auto host = b->AllocateHostKv(first.size() * b->KvBlockBytes());
  ASSERT_TRUE(host.ok()) << host.status();
  std::vector<engine::BlockCopy> out;
  for (size_t i = 0; i < first.size(); ++i) {
    out.push_back({first[i], host->get() + i * b->KvBlockBytes()});
  }
  ASSERT_TRUE(b->CopyBlocksToHost(out).ok());
  ASSERT_TRUE(b->WaitBlockCopies().ok());
  Run(*b, {{Tokens(16, config_.vocab_size, 9), 0, first}});  // overwrites the blocks
  std::vector<float> stale = Run(*b, {{tail, 16, {3, 9, 1, 14, 6}}});
  EXPECT_FALSE(BitwiseEqual(cold.data(), stale.data(), cold.size()));

  const std::vector<int32_t> second = {20, 21, 22, 23};
  std::vector<engine::BlockCopy> in;
  for (size_t i = 0; i < second.size(); ++i) in.push_back({second[i], out[i].host});
  ASSERT_TRUE(b->CopyBlocksFromHost(in).ok());
  std::vector<float> restored = Run(*b, {{tail, 16, {20, 21, 22, 23, 24}}});
  EXPECT_TRUE(BitwiseEqual(cold.data(), restored.data(), cold.size()));

  // Bad copies are refused before anything is copied.
  std::vector<engine::BlockCopy> bad = {{20, out[0].host}, {64, out[1].host}};
  absl::Status st = b->CopyBlocksFromHost(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 64"), std::string::npos) << st;
  bad = {{20, nullptr}};
  EXPECT_EQ(b->CopyBlocksToHost(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(InvarianceTest, Float32CheckpointGivesBitwiseTheSameLogitsAsBf16) {
  // Rewrite the bf16 weights as F32 (exact), so the backend takes its float32-weight path.
  test_support::ScratchDir scratch("cascade_f32");
  const std::string& dir = scratch.path();
  std::ofstream(dir + "/config.json") << model::ModelConfigToJson(config_);
  std::vector<model::TensorSpec> specs;
  for (const model::ExpectedTensor& e : model::ExpectedTensors(config_)) {
    specs.push_back({e.name, model::DType::kF32, e.shape});
  }
  ASSERT_TRUE(model::WriteSafetensors(dir + "/model.safetensors", specs,
                                      [&](size_t i, std::vector<uint8_t>* bytes) {
                                        const model::TensorView* t = model_->Find(specs[i].name);
                                        bytes->resize(t->numel() * 4);
                                        model::ToFloat32(*t,
                                                         reinterpret_cast<float*>(bytes->data()));
                                      })
                  .ok());
  absl::StatusOr<std::unique_ptr<model::Model>> f32 = model::LoadModel(dir);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_EQ((*f32)->Find("model.norm.weight")->dtype, model::DType::kF32);
  const std::vector<SeqStep> seqs = {{Tokens(9, config_.vocab_size, 6), 0, {2, 4, 6}, true}};
  std::vector<float> want = Run(*Backend(), seqs);
  auto f32_backend = NewCpuBackend(**f32, {.num_blocks = 64, .block_size = kBlock});
  std::vector<float> got = Run(*f32_backend, seqs);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(BitwiseEqual(got.data(), want.data(), want.size()));
}

TEST(CpuBackendTest, LlamaTinyWithRopeScalingRunsOnTheFullVocabulary) {
  std::unique_ptr<model::Model> m = MakeModel(model::PresetConfig("llama-tiny"), 9);
  ASSERT_NE(m, nullptr);
  auto backend = NewCpuBackend(*m, {.num_blocks = 8, .block_size = 16, .num_threads = 2});
  ASSERT_EQ(backend->VocabSize(), 151936);
  std::vector<float> logits;
  ASSERT_TRUE(backend->Forward(MakeBatch({{Tokens(20, 151936, 8), 0, {4, 6}}}, 16), &logits).ok());
  ASSERT_EQ(logits.size(), 151936u);
  float lo = logits[0], hi = logits[0];
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GT(hi - lo, 1.0f);
}

// Reports (does not assert) the tiny preset's single-sequence decode speed: the LM head over
// 151936 columns dominates it.
TEST(CpuBackendTest, TinyPresetDecodeSpeed) {
  std::unique_ptr<model::Model> m = MakeModel(model::PresetConfig("tiny"), 1);
  ASSERT_NE(m, nullptr);
  auto backend = NewCpuBackend(*m, {.num_blocks = 16, .block_size = 16, .num_threads = 2});
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> logits;
  ASSERT_TRUE(backend->Forward(MakeBatch({{Tokens(32, 151936, 1), 0, blocks}}, 16), &logits).ok());
  const int steps = 64;
  auto start = std::chrono::steady_clock::now();
  int32_t token = 0;
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(backend->Forward(MakeBatch({{{token}, 32 + i, blocks}}, 16), &logits).ok());
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "tiny preset decode, 2 threads: " << steps / secs << " tokens/s\n";
  RecordProperty("decode_tokens_per_s", static_cast<int>(steps / secs));
}

}  // namespace
}  // namespace cascade::cpu
