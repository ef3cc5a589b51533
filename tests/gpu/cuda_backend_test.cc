// The whole CUDA backend on generated models: against the float32 CPU backend (logits close,
// teacher-forced greedy tokens mostly equal), and cached == cold bitwise on the GPU (deterministic
// mode): a prompt served from cached KV blocks gives the same logits bits as the same prompt
// prefilled cold, alone or batched with other sequences, by prefill or by a decode step.
#include "gpu_worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/ops.h"
#include "gpu_worker/engine/sampler.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/model.h"
#include "gtest/gtest.h"
#include "tests/backend_cpu/test_util.h"
#include "tests/gpu/test_util.h"

namespace cascade::cuda {
namespace {

constexpr int kBs = 16;

struct SeqStep {
  std::vector<int32_t> tokens;  // new tokens of this step
  int start_pos = 0;            // tokens already in the KV cache
  std::vector<int32_t> blocks;  // block table covering start_pos + tokens.size()
};

// One step over several sequences; logits wanted for the last token of each.
engine::ForwardBatch MakeBatch(const std::vector<SeqStep>& seqs) {
  engine::ForwardBatch b;
  b.query_start.push_back(0);
  b.block_table_start.push_back(0);
  for (const SeqStep& s : seqs) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int p = s.start_pos + static_cast<int>(i);
      b.token_ids.push_back(s.tokens[i]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(s.blocks[p / kBs] * kBs + p % kBs);
    }
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(s.start_pos + static_cast<int>(s.tokens.size()));
    b.block_ids.insert(b.block_ids.end(), s.blocks.begin(), s.blocks.end());
    b.block_table_start.push_back(static_cast<int32_t>(b.block_ids.size()));
    b.logits_rows.push_back(b.num_tokens() - 1);
  }
  return b;
}

std::vector<int32_t> Blocks(int first, int count) {
  std::vector<int32_t> v(count);
  for (int i = 0; i < count; ++i) v[i] = first + i;
  return v;
}

std::unique_ptr<model::Model> MakeModel(const std::string& preset, uint64_t seed) {
  return cpu::testing_util::MakeModel(model::PresetConfig(preset), seed);
}

int Argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

class CudaVsCpu : public ::testing::TestWithParam<std::string> {};

// Prefill two prompts (one with a cached prefix: start_pos > 0), then 24 teacher-forced decode
// steps on both backends. Tolerance: bf16 weights/activations vs float32: relative L2 of the
// logits < 5e-2 per row; greedy tokens equal in >= 90% of the steps.
TEST_P(CudaVsCpu, LogitsCloseAndGreedyTokensAgree) {
  CASCADE_REQUIRE_GPU();
  auto model = MakeModel(GetParam(), 7);
  cpu::CpuBackendOptions co;
  co.num_blocks = 64;
  co.block_size = kBs;
  auto cpu = cpu::NewCpuBackend(*model, co);
  ASSERT_NE(cpu, nullptr);
  CudaBackendOptions go;
  go.num_blocks = 64;
  go.block_size = kBs;
  go.max_num_tokens = 512;
  auto gpu = NewCudaBackend(*model, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int vocab = cpu->VocabSize();
  std::mt19937 rng(11);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = rng() % vocab;
    return t;
  };
  // Sequence A: 70 tokens cold. Sequence B: 40 tokens, then 33 more at start_pos 40.
  SeqStep a{random_tokens(70), 0, Blocks(0, 8)};
  SeqStep b0{random_tokens(40), 0, Blocks(8, 8)};
  std::vector<float> lc, lg;
  ASSERT_TRUE(cpu->Forward(MakeBatch({b0}), &lc).ok());
  ASSERT_TRUE((*gpu)->Forward(MakeBatch({b0}), &lg).ok());
  SeqStep b{random_tokens(33), 40, Blocks(8, 8)};
  int agree = 0, steps = 0;
  double worst = 0;
  std::vector<SeqStep> step = {a, b};
  for (int it = 0; it < 25; ++it) {
    engine::ForwardBatch batch = MakeBatch(step);
    ASSERT_TRUE(cpu->Forward(batch, &lc).ok());
    absl::Status st = (*gpu)->Forward(batch, &lg);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t s = 0; s < step.size(); ++s) {
      const float* c = lc.data() + s * vocab;
      const float* g = lg.data() + s * vocab;
      double num = 0, den = 0;
      for (int i = 0; i < vocab; ++i) {
        ASSERT_FALSE(std::isnan(g[i]));
        num += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
        den += double(c[i]) * c[i];
      }
      worst = std::max(worst, std::sqrt(num / den));
      const int tc = Argmax(c, vocab), tg = Argmax(g, vocab);
      agree += tc == tg;
      ++steps;
      // Teacher forcing: both continue with the CPU's token.
      step[s].start_pos += static_cast<int>(step[s].tokens.size());
      step[s].tokens = {tc};
    }
  }
  std::printf("%s: worst logits rel L2 %.3g, greedy agreement %d/%d\n", GetParam().c_str(), worst,
              agree, steps);
  EXPECT_LT(worst, 5e-2);
  EXPECT_GE(agree, steps * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaVsCpu, ::testing::Values("tiny", "llama-tiny"));

// Cached == cold, bitwise: the logits of a prompt's last token are the same bits whether the
// prompt is prefilled in one step, or its first 96 tokens come from earlier steps (prefix cache),
// or its last token is a decode step, with or without other sequences in the batch.
// The bitwise backend tests run without and with the batch-invariant split-K (CudaBackendOptions::
// split_k: 1 = off; 0 = the built-in rule, the default, which cuts every GEMM of the tiny model
// but the LM head into 2 k slices, through both the fused-norm and the SplitReduce paths), and
// on the tiny model with head_dim 128, whose attention on Hopper takes the two-level fold order
// (super-tiles, attention.h) through the backend's plans and decode graphs.
struct BackendCase {
  int split_k;
  int head_dim;
};
class CudaBackendSplitK : public ::testing::TestWithParam<BackendCase> {
 protected:
  int SplitK() const { return GetParam().split_k; }
  // The tiny preset, with the case's head_dim.
  std::unique_ptr<model::Model> Tiny(uint64_t seed) const {
    model::ModelConfig c = model::PresetConfig("tiny");
    c.head_dim = GetParam().head_dim;
    return cpu::testing_util::MakeModel(c, seed);
  }
  // The graph tests' backend: the case's split-K, `num_blocks` blocks of kBs tokens, steps of up
  // to 1024 tokens and 64 logits rows (decode graph buckets up to 64).
  CudaBackendOptions GraphOptions(int64_t num_blocks) const {
    CudaBackendOptions go;
    go.split_k = SplitK();
    go.num_blocks = num_blocks;
    go.block_size = kBs;
    go.max_num_tokens = 1024;
    go.max_logits_rows = 64;
    return go;
  }
};
INSTANTIATE_TEST_SUITE_P(SplitK, CudaBackendSplitK,
                         ::testing::Values(BackendCase{1, 32}, BackendCase{0, 32},
                                           BackendCase{1, 128}),
                         [](const ::testing::TestParamInfo<BackendCase>& i) {
                           return std::string(i.param.split_k == 1 ? "Off" : "Rule") + "Hd" +
                                  std::to_string(i.param.head_dim);
                         });

TEST_P(CudaBackendSplitK, CachedEqualsColdBitwise) {
  CASCADE_REQUIRE_GPU();
  auto model = Tiny(3);
  CudaBackendOptions go;
  go.split_k = SplitK();
  go.num_blocks = 128;
  go.block_size = kBs;
  go.max_num_tokens = 1024;
  auto gpu_or = NewCudaBackend(*model, go);
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  engine::Backend& gpu = **gpu_or;
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(150);
  for (auto& x : prompt) x = rng() % gpu.VocabSize();
  const int vocab = gpu.VocabSize();
  auto tail = [&](int from) { return std::vector<int32_t>(prompt.begin() + from, prompt.end()); };
  auto head = [&](int to) { return std::vector<int32_t>(prompt.begin(), prompt.begin() + to); };

  std::vector<float> cold, got, scratch;
  ASSERT_TRUE(gpu.Forward(MakeBatch({{prompt, 0, Blocks(0, 10)}}), &cold).ok());

  // Prefix 96 tokens in another set of blocks, then the rest at start_pos 96.
  ASSERT_TRUE(gpu.Forward(MakeBatch({{head(96), 0, Blocks(10, 10)}}), &scratch).ok());
  ASSERT_TRUE(gpu.Forward(MakeBatch({{tail(96), 96, Blocks(10, 10)}}), &got).ok());
  EXPECT_EQ(0, std::memcmp(cold.data(), got.data(), vocab * 4)) << "cached prefill != cold";

  // The same, batched with an unrelated sequence (different batch size for every GEMM).
  std::vector<int32_t> other(77);
  for (auto& x : other) x = rng() % vocab;
  ASSERT_TRUE(
      gpu.Forward(MakeBatch({{other, 0, Blocks(40, 5)}, {tail(96), 96, Blocks(10, 10)}}), &got)
          .ok());
  EXPECT_EQ(0, std::memcmp(cold.data(), got.data() + vocab, vocab * 4)) << "batched != cold";

  // Last token as a decode step over a 149-token cache.
  ASSERT_TRUE(gpu.Forward(MakeBatch({{head(149), 0, Blocks(20, 10)}}), &scratch).ok());
  ASSERT_TRUE(gpu.Forward(MakeBatch({{tail(149), 149, Blocks(20, 10)}}), &got).ok());
  EXPECT_EQ(0, std::memcmp(cold.data(), got.data(), vocab * 4)) << "decode step != cold";
}

// The host KV tier tests' common start: a tiny model's CUDA backend of 320 blocks, a prompt of
// n = 150 blocks (more than one staging launch of kMaxKvBlocksPerCopy) and 5 tokens, its cold
// logits, pinned host memory for 2 n blocks filled with 0xA5, the prompt's first n blocks
// prefilled into blocks [0, n), and `out` listing those blocks with host slots [0, n).
struct HostTierCase {
  static constexpr int n = 150;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<engine::Backend> backend;
  int vocab = 0;
  int64_t bb = 0;                    // KvBlockBytes
  std::vector<int32_t> tail, other;  // the prompt's last 5 tokens; n blocks of other tokens
  std::vector<float> cold, scratch;
  engine::HostKvMemory host;
  std::vector<engine::BlockCopy> out;
};
void MakeHostTierCase(uint32_t seed, HostTierCase* c) {
  constexpr int n = HostTierCase::n;
  c->model = MakeModel("tiny", 3);
  CudaBackendOptions go;
  go.num_blocks = 320;
  go.block_size = kBs;
  go.max_num_tokens = 4096;
  auto gpu_or = NewCudaBackend(*c->model, go);
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  c->backend = std::move(*gpu_or);
  engine::Backend& gpu = *c->backend;
  c->vocab = gpu.VocabSize();
  const int len = n * kBs + 5;
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(len);
  c->other.resize(n * kBs);
  for (auto& x : prompt) x = rng() % c->vocab;
  for (auto& x : c->other) x = rng() % c->vocab;
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + n * kBs);
  c->tail.assign(prompt.begin() + n * kBs, prompt.end());
  ASSERT_TRUE(gpu.Forward(MakeBatch({{prompt, 0, Blocks(0, n + 1)}}), &c->cold).ok());

  c->bb = gpu.KvBlockBytes();
  ASSERT_GT(c->bb, 0);
  auto host = gpu.AllocateHostKv(2 * n * c->bb);
  ASSERT_TRUE(host.ok()) << host.status();
  c->host = std::move(*host);
  std::memset(c->host.get(), 0xA5, 2 * n * c->bb);
  ASSERT_TRUE(gpu.Forward(MakeBatch({{head, 0, Blocks(0, n)}}), &c->scratch).ok());
  for (int i = 0; i < n; ++i) c->out.push_back({i, c->host.get() + i * c->bb});
}

// The host copies in `out`'s slots restored into blocks [160, 160 + n), and the prompt's tail
// prefilled over them (a fresh block 310 for its partial block): the cold logits bitwise.
void RestoreAndExpectCold(HostTierCase* c) {
  constexpr int n = HostTierCase::n;
  std::vector<engine::BlockCopy> in;
  for (int i = 0; i < n; ++i) in.push_back({160 + i, c->out[i].host});
  ASSERT_TRUE(c->backend->CopyBlocksFromHost(in).ok());
  std::vector<int32_t> table = Blocks(160, n);
  table.push_back(310);
  std::vector<float> got;
  ASSERT_TRUE(c->backend->Forward(MakeBatch({{c->tail, n * kBs, table}}), &got).ok());
  EXPECT_EQ(0, std::memcmp(c->cold.data(), got.data(), c->vocab * 4)) << "restored != cold";
}

// Host KV tier, CUDA half: the n blocks copied to pinned host memory on the copy stream, their
// cache blocks then overwritten by a Forward issued right after the copy (the compute stream
// must wait for it), and written back into other blocks: a tail prefill over the restored
// blocks gives the cold logits bitwise, a second read of the restored blocks gives the same host
// bytes, and over the overwritten blocks the logits differ.
TEST(CudaBackend, BlocksCopiedToHostAndBackGiveBitwiseTheColdLogits) {
  CASCADE_REQUIRE_GPU();
  HostTierCase c;
  ASSERT_NO_FATAL_FAILURE(MakeHostTierCase(11, &c));
  constexpr int n = HostTierCase::n;
  engine::Backend& gpu = *c.backend;
  std::vector<float> got;
  std::vector<engine::BlockCopy> again;
  ASSERT_TRUE(gpu.CopyBlocksToHost(c.out).ok());
  // Overwrite the same blocks at once: this Forward must run after the copies.
  ASSERT_TRUE(gpu.Forward(MakeBatch({{c.other, 0, Blocks(0, n)}}), &c.scratch).ok());
  ASSERT_TRUE(gpu.Forward(MakeBatch({{c.tail, n * kBs, Blocks(0, n + 1)}}), &got).ok());
  EXPECT_NE(0, std::memcmp(c.cold.data(), got.data(), c.vocab * 4)) << "overwrite had no effect";

  ASSERT_NO_FATAL_FAILURE(RestoreAndExpectCold(&c));

  for (int i = 0; i < n; ++i) again.push_back({160 + i, c.host.get() + (n + i) * c.bb});
  ASSERT_TRUE(gpu.CopyBlocksToHost(again).ok());
  ASSERT_TRUE(gpu.WaitBlockCopies().ok());
  EXPECT_EQ(0, std::memcmp(c.host.get(), c.host.get() + n * c.bb, n * c.bb));

  std::vector<engine::BlockCopy> bad = {{320, c.host.get()}};
  EXPECT_EQ(gpu.CopyBlocksToHost(bad).code(), absl::StatusCode::kInvalidArgument);
}

// Copies ahead of eviction (CopyBlocksToHostAhead): the next Forward does not wait for them, so
// one that rewrites their blocks is ordered after them (OrderAfterAheadCopies) and must still
// leave the host the blocks' bytes from before: restored into other blocks, a tail prefill over
// them gives the cold logits bitwise. A second ahead copy of the restored blocks carries the same
// bytes, and its ticket is reported done once the copy stream has run it.
TEST(CudaBackend, BlocksCopiedAheadReachTheHostBitwiseBeforeAnOrderedStepRewritesThem) {
  CASCADE_REQUIRE_GPU();
  HostTierCase c;
  ASSERT_NO_FATAL_FAILURE(MakeHostTierCase(12, &c));
  constexpr int n = HostTierCase::n;
  engine::Backend& gpu = *c.backend;
  std::vector<engine::BlockCopy> again;
  const absl::StatusOr<uint64_t> t1 = gpu.CopyBlocksToHostAhead(c.out);
  ASSERT_TRUE(t1.ok()) << t1.status();
  ASSERT_TRUE(gpu.OrderAfterAheadCopies(*t1).ok());
  ASSERT_TRUE(gpu.Forward(MakeBatch({{c.other, 0, Blocks(0, n)}}), &c.scratch).ok());
  EXPECT_GE(gpu.AheadCopiesDone(), *t1);  // the Forward waited for it, and returned

  ASSERT_NO_FATAL_FAILURE(RestoreAndExpectCold(&c));

  for (int i = 0; i < n; ++i) again.push_back({160 + i, c.host.get() + (n + i) * c.bb});
  const absl::StatusOr<uint64_t> t2 = gpu.CopyBlocksToHostAhead(again);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(*t2, *t1 + 1);
  ASSERT_TRUE(gpu.WaitBlockCopies().ok());
  EXPECT_EQ(gpu.AheadCopiesDone(), *t2);
  EXPECT_EQ(0, std::memcmp(c.host.get(), c.host.get() + n * c.bb, n * c.bb));
  std::vector<engine::BlockCopy> bad = {{320, c.host.get()}};
  EXPECT_EQ(gpu.CopyBlocksToHostAhead(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Decode graphs captured at load (CudaBackendOptions::capture_graphs_at_load, over scratch rows)
// serve later decode steps with no capture of their own, and their rows are bitwise those of
// graphs captured on first use: plain decode steps (no shared blocks) at buckets 1-64 over
// contexts of short rows, rows of a few tiles and rows long enough to be split over CTAs.
TEST_P(CudaBackendSplitK, GraphsCapturedAtLoadServeDecodeStepsBitwise) {
  CASCADE_REQUIRE_GPU();
  auto model = Tiny(6);
  CudaBackendOptions go = GraphOptions(2048);
  go.capture_graphs_at_load = false;
  auto lazy_or = NewCudaBackend(*model, go);
  go.capture_graphs_at_load = true;
  auto early_or = NewCudaBackend(*model, go);
  ASSERT_TRUE(lazy_or.ok()) << lazy_or.status();
  ASSERT_TRUE(early_or.ok()) << early_or.status();
  engine::Backend& lazy = **lazy_or;
  engine::Backend& early = **early_or;
  const CudaGraphStats loaded = GetCudaGraphStats(early);
  std::printf("captured at load: %lld graphs in %.1f ms\n",
              static_cast<long long>(loaded.captured_at_load), loaded.load_capture_ms);
  EXPECT_GE(loaded.captured_at_load, 11) << "buckets 1, 2, 4, 8, ..., 64";
  EXPECT_EQ(loaded.captures, 0) << "the load's captures are not the serving counters'";
  EXPECT_EQ(loaded.replays, 0);
  EXPECT_EQ(GetCudaGraphStats(lazy).captured_at_load, 0);

  const int vocab = lazy.VocabSize();
  std::mt19937 rng(5);
  std::vector<float> a, b, scratch;
  int steps = 0;
  // (rows, context before the step): every row its own blocks, no cascade.
  for (const auto& [rows, ctx] : std::vector<std::pair<int, int>>{
           {1, 6}, {1, 150}, {1, 900}, {3, 140}, {8, 5}, {8, 700}, {20, 160}, {64, 3}, {64, 20}}) {
    const int blocks_per_row = (ctx + 1 + kBs - 1) / kBs;
    ASSERT_LE(rows * blocks_per_row, go.num_blocks);
    std::vector<SeqStep> prefill, decode;
    for (int r = 0; r < rows; ++r) {
      std::vector<int32_t> t(ctx + 1);
      for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
      const std::vector<int32_t> blocks = Blocks(r * blocks_per_row, blocks_per_row);
      prefill.push_back({std::vector<int32_t>(t.begin(), t.begin() + ctx), 0, blocks});
      decode.push_back({{t[ctx]}, ctx, blocks});
    }
    for (engine::Backend* be : {&lazy, &early}) {  // prefills (eager on both), at most 1024 tokens
      for (size_t i = 0; i < prefill.size();) {
        std::vector<SeqStep> chunk;
        int tokens = 0;
        while (i < prefill.size() && (chunk.empty() || tokens + ctx <= 1024)) {
          chunk.push_back(prefill[i++]);
          tokens += ctx;
        }
        ASSERT_TRUE(be->Forward(MakeBatch(chunk), &scratch).ok());
      }
    }
    ASSERT_TRUE(lazy.Forward(MakeBatch(decode), &a).ok());
    ASSERT_TRUE(early.Forward(MakeBatch(decode), &b).ok());
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << rows << " rows of " << ctx << " tokens: graphs captured at load != on first use";
    ++steps;
  }
  const CudaGraphStats served = GetCudaGraphStats(early);
  std::printf(
      "%d decode steps: captured at load %lld captures then, %lld replays; on first use "
      "%lld captures\n",
      steps, static_cast<long long>(served.captures), static_cast<long long>(served.replays),
      static_cast<long long>(GetCudaGraphStats(lazy).captures));
  EXPECT_EQ(served.captures, 0) << "a decode step's graph was not captured at load";
  EXPECT_EQ(served.replays, steps);
  EXPECT_GT(GetCudaGraphStats(lazy).captures, 0);
}

// Speculated steps (CudaBackendOptions::speculative_launch, engine::Backend::PrepareSampled):
// step k + 1 enqueued behind step k with its inputs fed on the device from step k's sampled ids,
// then adopted by the launch of the same batch, gives the ids and logprobs of the plain launch
// after the collect, bitwise, step after step (greedy, seeded temperature, top-k / top-p and
// logprobs rows). Steps where the next launch is another batch (a row fewer) drop the started
// step and still match; steps with penalty lists are not started.
TEST_P(CudaBackendSplitK, SpeculatedDecodeStepsEqualPlainLaunchesBitwise) {
  CASCADE_REQUIRE_GPU();
  auto model = Tiny(8);
  CudaBackendOptions go = GraphOptions(512);
  auto plain_or = NewCudaBackend(*model, go);
  go.speculative_launch = true;
  auto spec_or = NewCudaBackend(*model, go);
  ASSERT_TRUE(plain_or.ok()) << plain_or.status();
  ASSERT_TRUE(spec_or.ok()) << spec_or.status();
  engine::Backend& plain = **plain_or;
  engine::Backend& spec = **spec_or;
  const int vocab = plain.VocabSize();
  std::mt19937 rng(17);
  constexpr int kSeqs = 12, kPrompt = 40;
  std::vector<std::vector<int32_t>> blocks(kSeqs);
  std::vector<int> len(kSeqs, kPrompt);
  std::vector<int32_t> last(kSeqs);
  std::vector<float> scratch;
  for (int i = 0; i < kSeqs; ++i) {
    blocks[i] = Blocks(i * 8, 8);  // 128 tokens each
    std::vector<int32_t> t(kPrompt);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
    for (engine::Backend* be : {&plain, &spec}) {
      ASSERT_TRUE(
          be->Forward(MakeBatch({{std::vector<int32_t>(t.begin(), t.end() - 1), 0, blocks[i]}}),
                      &scratch)
              .ok());
    }
    last[i] = t.back();
    len[i] = kPrompt - 1;
  }
  // Step k's batch: every live sequence's last token at its next position, sampled on the device.
  auto step_batch = [&](int rows, bool penalties) {
    std::vector<SeqStep> steps;
    for (int i = 0; i < rows; ++i) steps.push_back({{last[i]}, len[i], blocks[i]});
    engine::ForwardBatch fb = MakeBatch(steps);
    for (int i = 0; i < rows; ++i) {
      engine::RowSample rs;
      rs.on_device = true;
      rs.spec.temperature = i % 3 == 1 ? 0.8f : 0.0f;
      rs.spec.seed = 300 + i;
      rs.spec.position = len[i] + 1;
      if (i % 4 == 3) rs.spec.top_k = 30, rs.spec.top_p = 0.9f, rs.spec.logprobs = 4;
      if (penalties && i == 0) {
        rs.spec.repetition_penalty = 1.2f;
        rs.spec.penalty_start = 0;
        rs.spec.penalty_count = 1;
        fb.penalty_tokens.push_back(last[0]);
        fb.penalty_counts.push_back(1);
      }
      fb.row_samples.push_back(rs);
    }
    return fb;
  };
  std::vector<float> la, lb;
  std::vector<int32_t> ta, tb;
  std::vector<engine::RowLogprobs> pa, pb;
  int rows = kSeqs, started = 0, adopted_steps = 0;
  engine::ForwardBatch cur = step_batch(rows, false);
  ASSERT_TRUE(spec.LaunchSampled(cur).ok());
  for (int step = 0; step < 24; ++step) {
    // The plain backend: launch, collect.
    ASSERT_TRUE(plain.LaunchSampled(cur).ok());
    ASSERT_TRUE(plain.FinishSampled(&la, &ta, &pa).ok());
    // What follows this step: every row on (feed i <- row i), a row fewer at steps 7 and 15
    // (launched unannounced: the started step is dropped), penalty lists at step 11.
    for (int i = 0; i < rows; ++i) ++len[i];
    const bool fewer = step == 7 || step == 15, penalties = step == 11;
    engine::ForwardBatch next = step_batch(rows, penalties);  // (last[] is step k's input here)
    std::vector<int32_t> feed(next.token_ids.size());
    std::iota(feed.begin(), feed.end(), 0);
    const bool did = spec.PrepareSampled(next, feed);
    if (penalties) {
      EXPECT_FALSE(did) << "step " << step << ": penalty lists were started";
    }
    started += did ? 1 : 0;
    ASSERT_TRUE(spec.FinishSampled(&lb, &tb, &pb).ok());
    ASSERT_EQ(ta, tb) << "step " << step;
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t r = 0; r < pa.size(); ++r) {
      EXPECT_EQ(0, std::memcmp(&pa[r], &pb[r], sizeof(engine::RowLogprobs)))
          << "step " << step << " row " << r;
    }
    for (int i = 0; i < rows; ++i) last[i] = ta[i];
    if (fewer) --rows;
    cur = step_batch(rows, penalties);  // the launch: tokens now known
    if (!fewer && did) ++adopted_steps;
    ASSERT_TRUE(spec.LaunchSampled(cur).ok());
  }
  ASSERT_TRUE(spec.FinishSampled(&lb, &tb, &pb).ok());
  const CudaGraphStats st = GetCudaGraphStats(spec);
  std::printf("speculated: %d started, %lld adopted, %lld dropped\n", started,
              static_cast<long long>(st.speculated_adopted),
              static_cast<long long>(st.speculated_dropped));
  EXPECT_GT(st.speculated_adopted, 15);
  EXPECT_EQ(st.speculated_adopted, adopted_steps);
  EXPECT_EQ(st.speculated_dropped, 2);
}

// Graph replay == eager, bitwise: two backends over the same model (decode graphs on and off)
// run the same steps: prefills, then decode steps over changing subsets of 24 sequences (batch
// sizes across the graph buckets, so most replays carry padding rows), 20 of them sharing 8
// prefix blocks (cascade groups; more rows than a split CTA holds, so on Hopper at head_dim 128
// wide cascade items, in graphs and eagerly), contexts crossing 64-token tiles and new blocks.
// Whole logits rows (Forward, and ForwardSampled rows left to the host) are bitwise equal, and rows
// sampled on the device (greedy and seeded temperature) give the same tokens.
TEST_P(CudaBackendSplitK, DecodeGraphReplayEqualsEagerBitwise) {
  CASCADE_REQUIRE_GPU();
  auto model = Tiny(6);
  CudaBackendOptions go = GraphOptions(512);
  go.cuda_graphs = false;
  go.prefetch_weights_max_rows = 0;  // the graph backend prefetches weights into L2: same bits
  go.decode_gemm_lm_head = false;
  auto eager_or = NewCudaBackend(*model, go);
  go.cuda_graphs = true;
  go.prefetch_weights_max_rows = CudaBackendOptions{}.prefetch_weights_max_rows;
  // Without split-K the graphs also run GEMMs tuned at their buckets (gemm.h SetTuneSizes; the
  // eager backend runs the pinned algorithms): the same bits either way.
  go.gemm_tune = SplitK() == 1;
  // And the graph backend's LM head takes the decode choice at 17-64 rows (the steps of 18-24
  // rows below; the eager one runs the pinned kernel there): the same bits.
  go.decode_gemm_lm_head = true;
  auto graph_or = NewCudaBackend(*model, go);
  ASSERT_TRUE(eager_or.ok()) << eager_or.status();
  ASSERT_TRUE(graph_or.ok()) << graph_or.status();
  engine::Backend& eager = **eager_or;
  engine::Backend& graph = **graph_or;
  // Tuning happens at load time (gemm.h PrepareTune), not on a request's first step of a bucket.
  const int tuned_at_load = GetCudaGraphStats(graph).gemm_tuned;
  // Each backend chose its decode-sized GEMM kernels at load time by timing (gemm.h): the two may
  // differ, and the bits must not.
  for (const engine::Backend* b : {&eager, &graph}) {
    for (const std::string& line : GetCudaGraphStats(*b).gemm_decode_log) {
      std::printf("%s: decode GEMM %s\n", b == &eager ? "eager" : "graph", line.c_str());
    }
  }
  const int vocab = eager.VocabSize();
  const std::string head = absl::StrCat("(bucket 24) n=", vocab, " ");
  auto chose_head = [&](const engine::Backend& b) {
    const std::vector<std::string>& log = GetCudaGraphStats(b).gemm_decode_log;
    return std::any_of(log.begin(), log.end(),
                       [&](const std::string& l) { return l.find(head) != std::string::npos; });
  };
  EXPECT_TRUE(chose_head(graph)) << "no decode choice for the LM head at bucket 24";
  EXPECT_FALSE(chose_head(eager));
  std::mt19937 rng(11);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = rng() % vocab;
    return t;
  };

  constexpr int kSeqs = 24, kSharing = 20, kShared = 8;  // shared prefix: 8 blocks = 128 tokens
  struct Seq {
    std::vector<int32_t> blocks;
    int len = 0;  // tokens in the KV cache
  };
  std::vector<Seq> seqs(kSeqs);
  const std::vector<int32_t> prefix = random_tokens(kShared * kBs);
  std::vector<float> a, b, scratch;
  // Prefill (eager on both): sequences 0..19 share the prefix blocks 0..7.
  ASSERT_TRUE(eager.Forward(MakeBatch({{prefix, 0, Blocks(0, kShared)}}), &scratch).ok());
  ASSERT_TRUE(graph.Forward(MakeBatch({{prefix, 0, Blocks(0, kShared)}}), &scratch).ok());
  for (int i = 0; i < kSeqs; ++i) {
    Seq& s = seqs[i];
    const std::vector<int32_t> own = Blocks(kShared + 16 * i, 16);
    int start = 0;
    if (i < kSharing) {
      s.blocks = Blocks(0, kShared);
      start = kShared * kBs;
    }
    s.blocks.insert(s.blocks.end(), own.begin(), own.end());
    const std::vector<int32_t> tail = random_tokens(1 + rng() % 60);
    ASSERT_TRUE(eager.Forward(MakeBatch({{tail, start, s.blocks}}), &a).ok());
    ASSERT_TRUE(graph.Forward(MakeBatch({{tail, start, s.blocks}}), &b).ok());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), vocab * 4)) << "prefill of sequence " << i;
    s.len = start + static_cast<int>(tail.size());
  }

  const int sizes[] = {24, 9, 5, 1, 2, 3, 24, 7, 20, 4, 8, 18};
  int compared_rows = 0, compared_tokens = 0;
  for (int step = 0; step < 72; ++step) {
    const int n = sizes[step % 12];
    std::vector<SeqStep> batch;
    std::vector<int> which;
    for (int k = 0; k < n; ++k) {
      const int i = (step + 5 * k) % kSeqs;
      if (std::find(which.begin(), which.end(), i) != which.end()) continue;
      which.push_back(i);
      batch.push_back({random_tokens(1), seqs[i].len, seqs[i].blocks});
      ++seqs[i].len;
    }
    engine::ForwardBatch fb = MakeBatch(batch);
    if (step % 2 == 0) {
      ASSERT_TRUE(eager.Forward(fb, &a).ok());
      ASSERT_TRUE(graph.Forward(fb, &b).ok());
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "step " << step;
      compared_rows += static_cast<int>(which.size());
      continue;
    }
    // Sampled: row r greedy on the device, seeded temperature on the device, or whole.
    for (size_t r = 0; r < which.size(); ++r) {
      engine::RowSample rs;
      rs.on_device = r % 3 != 2;
      rs.spec.temperature = r % 3 == 1 ? 0.8f : 0.0f;
      rs.spec.seed = 100 + which[r];
      rs.spec.position = seqs[which[r]].len;
      if (r % 4 == 1) {  // filters, a penalty and logprobs: the whole rule through the graph
        rs.spec.top_k = 40;
        rs.spec.top_p = 0.9f;
        rs.spec.min_p = 0.01f;
        rs.spec.repetition_penalty = 1.3f;
        rs.spec.logprobs = 5;
        if (r % 8 == 5) rs.spec.frequency_penalty = 0.4f, rs.spec.presence_penalty = 0.6f;
        rs.spec.penalty_start = static_cast<int32_t>(fb.penalty_tokens.size());
        rs.spec.penalty_count = 3;
        for (int t = 0; t < 3; ++t) {  // ascending, with generated counts 0 (prompt), 1, 2
          fb.penalty_tokens.push_back((which[r] * 7) % 200 + t * 13);
          fb.penalty_counts.push_back(t);
        }
        if (r % 8 == 5) {  // and a logit bias: the first token listed for its bias alone
          rs.spec.biased = 1;
          fb.penalty_counts[static_cast<size_t>(rs.spec.penalty_start)] = -1;
          fb.penalty_bias.resize(static_cast<size_t>(rs.spec.penalty_start));
          for (const float b : {3.0f, -2.0f, 0.5f}) fb.penalty_bias.push_back(b);
        }
      }
      fb.row_samples.push_back(rs);
    }
    if (!fb.penalty_bias.empty()) fb.penalty_bias.resize(fb.penalty_tokens.size());
    std::vector<int32_t> ta, tb;
    std::vector<engine::RowLogprobs> la, lb;
    ASSERT_TRUE(eager.ForwardSampled(fb, &a, &ta, &la).ok());
    ASSERT_TRUE(graph.ForwardSampled(fb, &b, &tb, &lb).ok());
    EXPECT_EQ(ta, tb) << "step " << step;
    ASSERT_EQ(la.size(), lb.size());
    for (size_t r = 0; r < la.size(); ++r) {
      EXPECT_EQ(0, std::memcmp(&la[r], &lb[r], sizeof(la[r]))) << "step " << step << " row " << r;
    }
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "step " << step;
    compared_tokens += static_cast<int>(which.size());
  }
  const CudaGraphStats stats = GetCudaGraphStats(graph);
  std::printf(
      "graph == eager: %d whole rows, %d sampled rows; %lld captures, %lld replays; small-m GEMM "
      "shapes verified %d, rejected %d\n",
      compared_rows, compared_tokens, static_cast<long long>(stats.captures),
      static_cast<long long>(stats.replays), stats.small_gemm_verified, stats.small_gemm_rejected);
  // The decode rows here ran the small-m GEMMs and the prefills the pinned cuBLASLt algorithm;
  // both backends agree and the cached == cold test below relies on it.
  EXPECT_GT(stats.small_gemm_verified, 0);
  EXPECT_EQ(stats.small_gemm_rejected, 0) << "small-m GEMM bits differ from cuBLASLt here";
  EXPECT_GT(stats.replays, 40) << "the decode graphs were not replayed";
  absl::StatusOr<int> wide = WideCascadeRows(model->config().head_dim, 2, kBs);
  ASSERT_TRUE(wide.ok()) << wide.status();
  if (*wide > 0) {  // Hopper, head_dim 128: the shared prefix ran as wide cascade items
    EXPECT_GT(stats.wide_cascade_steps, 0) << "no graph replay with wide cascade items";
    EXPECT_GT(GetCudaGraphStats(eager).wide_cascade_steps, 0) << "no eager step with them";
  } else {
    EXPECT_EQ(stats.wide_cascade_steps, 0);
  }
  if (SplitK() == 0) {
    EXPECT_EQ(stats.o_proj_splits, 2) << "tiny's o_proj was not split";
  } else {
    EXPECT_GT(tuned_at_load, 0) << "no GEMM was tuned at a decode bucket at load time";
    EXPECT_EQ(stats.gemm_tuned, tuned_at_load) << "a step tuned a GEMM that load time did not";
    std::printf("tuned GEMMs: %d, %d replaced; graphs kept %d, dropped %d\n", stats.gemm_tuned,
                stats.gemm_replaced, stats.graphs_tuned_kept, stats.graphs_tuned_dropped);
  }
  EXPECT_EQ(GetCudaGraphStats(eager).replays, 0);
}

// The sampling kernel (SampleRows, what ForwardSampled runs) against the host's rule
// (engine::SampleRowRule) on full-size rows (vocab 151936): every option alone and combined
// (temperature, min-p, top-k, top-p, logit bias, repetition / frequency / presence penalties,
// logprobs), many seeds and positions,
// rows of several shapes (narrow and wide logits, exact ties, all-equal, NaN and -inf entries).
// Token and logprobs must be bitwise equal.
TEST(CudaBackend, DeviceSamplerEqualsHostRuleBitwiseForEveryOption) {
  CASCADE_REQUIRE_GPU();
  constexpr int kVocab = 151936, kRows = 120;
  std::mt19937 rng(2024);
  std::vector<float> logits(static_cast<size_t>(kRows) * kVocab);
  std::vector<engine::SampleSpec> specs(kRows);
  std::vector<int32_t> penalty, counts;
  std::vector<float> bias;
  int biased_rows = 0;
  const float temps[] = {0.3f, 0.7f, 1.0f, 1.6f};
  const int top_ks[] = {1, 20, 50, 1000, 100000};
  const float top_ps[] = {0.05f, 0.5f, 0.9f, 0.999f};
  const float min_ps[] = {0.001f, 0.05f, 0.5f};
  const int logprob_ns[] = {1, 5, 20};
  for (int r = 0; r < kRows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * kVocab;
    const float sigma = r % 3 == 0 ? 0.5f : r % 3 == 1 ? 2.0f : 6.0f;
    std::normal_distribution<float> g(0.0f, sigma);
    for (int v = 0; v < kVocab; ++v) row[v] = g(rng);
    if (r % 10 == 3) {  // coarse values: many exact ties everywhere
      for (int v = 0; v < kVocab; ++v) row[v] = std::round(row[v] * 4.0f) / 4.0f;
    }
    if (r % 10 == 7) {
      row[11] = NAN, row[12] = -INFINITY, row[13] = -0.0f, row[14] = 0.0f;
    }
    if (r == 9 || r == 19) std::fill(row, row + kVocab, 1.5f);  // one value: ties everywhere
    // Rows whose first values say little of the rest: the likeliest tokens at the row's end, far
    // above the others, or the values rising along the row (top-p alone where r % 8 == 2).
    if (r % 16 == 10) {
      for (int v = kVocab - 64; v < kVocab; ++v) row[v] = 8.0f * sigma + static_cast<float>(v % 7);
    }
    if (r % 16 == 2) {
      for (int v = 0; v < kVocab; ++v) row[v] += 4.0f * sigma * static_cast<float>(v) / kVocab;
    }
    engine::SampleSpec& s = specs[r];
    const int mode = r % 8;  // which options this row combines
    bool counted = false;    // the row's listed tokens carry counts
    std::uniform_int_distribution<int> tok(0, kVocab - 1);
    s.temperature = r % 11 == 0 ? 0.0f : temps[r % 4];
    if (mode == 1 || mode == 5 || mode == 7) s.top_k = top_ks[(r / 8) % 5];
    if (mode == 2 || mode == 5 || mode == 6 || mode == 7) s.top_p = top_ps[(r / 8) % 4];
    if (mode == 3 || mode == 6 || mode == 7) s.min_p = min_ps[(r / 8) % 3];
    if (mode == 4 || mode == 6 || mode == 7 || r % 5 == 0) {
      // Which penalties: repetition alone, with frequency and presence, or those two alone (a
      // counted row's tokens ascend, distinct, with their generated counts, some 0: prompt).
      const int kind = (r / 4) % 3;
      s.repetition_penalty = kind == 2 ? 1.0f : r % 2 ? 1.3f : 0.8f;
      s.penalty_start = static_cast<int32_t>(penalty.size());
      int n = 1 + r * 3;
      for (int i = 0; i < n; ++i) penalty.push_back(i % 4 == 0 ? tok(rng) % 64 : tok(rng));
      counts.resize(penalty.size(), 0);
      if (kind > 0) {
        const float freqs[] = {0.5f, -0.25f, 2.0f, 0.0f}, presences[] = {0.75f, 0.0f, -2.0f, 1.5f};
        s.frequency_penalty = freqs[r % 4];
        s.presence_penalty = presences[(r / 3) % 4];
        if (s.frequency_penalty == 0.0f && s.presence_penalty == 0.0f) s.presence_penalty = 0.5f;
        auto first = penalty.begin() + s.penalty_start;
        std::sort(first, penalty.end());
        penalty.erase(std::unique(first, penalty.end()), penalty.end());
        n = static_cast<int>(penalty.end() - first);
        counts.resize(penalty.size());
        for (int i = 0; i < n; ++i) counts[s.penalty_start + i] = i % 5 == 0 ? 0 : 1 + tok(rng) % 9;
        counted = true;
      }
      s.penalty_count = n;
      // The penalized tokens include the likeliest ones, so the penalty decides tokens.
      for (int i = 0; i < 4; ++i) row[penalty[s.penalty_start + i]] += 3.0f * sigma;
    }
    if (r % 7 == 2 || r % 7 == 5) {
      // A logit bias (OpenAI's), alone or with the penalties: the row's listed tokens become
      // entries (ascending, distinct), the biased ones not in the history with count -1; some
      // biased tokens are penalized ones too, some biases decide the token (+-100, or several
      // sigma, or -inf: min_tokens' ban of stop ids, here on the likeliest tokens too), some are
      // small.
      std::map<int32_t, std::pair<int32_t, float>> entries;  // token -> (count, bias)
      if (s.penalty_count == 0) s.penalty_start = static_cast<int32_t>(penalty.size());
      for (int i = 0; i < s.penalty_count; ++i) {
        const size_t at = static_cast<size_t>(s.penalty_start + i);
        entries[penalty[at]] = {counted ? counts[at] : 0, 0.0f};
      }
      const float biases[] = {2.0f * sigma, r % 4 == 1 ? -INFINITY : -100.0f,
                              0.5f * sigma, r % 3 == 0 ? -INFINITY : -1.5f * sigma,
                              0.25f,        r % 13 == 2 ? 100.0f : 6.0f * sigma};
      const int nb = 2 + r % 9;
      for (int i = 0; i < nb; ++i) {
        const int32_t t = i % 3 == 0 && s.penalty_count > 0
                              ? penalty[static_cast<size_t>(s.penalty_start + i % s.penalty_count)]
                              : tok(rng);
        entries.try_emplace(t, -1, 0.0f).first->second.second = biases[(r + i) % 6];
      }
      penalty.resize(static_cast<size_t>(s.penalty_start));
      counts.resize(penalty.size());
      for (const auto& [t, e] : entries) penalty.push_back(t), counts.push_back(e.first);
      bias.resize(static_cast<size_t>(s.penalty_start));
      for (const auto& [t, e] : entries) bias.push_back(e.second);
      s.penalty_count = static_cast<int32_t>(entries.size());
      s.biased = 1;
      ++biased_rows;
    }
    counts.resize(penalty.size());
    bias.resize(penalty.size());
    if (r % 3 != 1 || r == 19) s.logprobs = logprob_ns[r % 3 == 0 ? (r / 3) % 3 : 2];
    if (r == 9) s.logprobs = 20;  // 20 of 151936 equal values: the lowest ids
    s.seed = 0x9e3779b97f4a7c15ULL * (r + 1);
    s.position = 17 * r + (r % 5) * 100000;
  }
  // The rows twice over, so that launches of 1, 40, 120 and 240 rows split a row over 8, 4, 2
  // and 1 CTAs on an H100 (132 SMs): every split must give the host's bits.
  std::vector<float> logits2(logits);
  logits2.insert(logits2.end(), logits.begin(), logits.end());
  std::vector<engine::SampleSpec> specs2(specs);
  specs2.insert(specs2.end(), specs.begin(), specs.end());
  DeviceBuffer d_logits = testing::Upload(logits2), d_specs = testing::Upload(specs2);
  DeviceBuffer d_pen = testing::Upload(penalty), d_counts = testing::Upload(counts);
  DeviceBuffer d_bias = testing::Upload(bias);
  std::vector<int32_t> want_tokens(kRows);
  std::vector<engine::RowLogprobs> want_lps(kRows);
  int with_logprobs = 0, not_argmax = 0;
  for (int r = 0; r < kRows; ++r) {
    const engine::SampleSpec& s = specs[r];
    const float* row = logits.data() + static_cast<size_t>(r) * kVocab;
    want_tokens[r] = engine::SampleRowRule(
        row, kVocab, s, std::span<const int32_t>(penalty.data() + s.penalty_start, s.penalty_count),
        std::span<const int32_t>(counts.data() + s.penalty_start, s.penalty_count),
        std::span<const float>(bias.data() + s.penalty_start, s.penalty_count), &want_lps[r]);
    not_argmax += want_tokens[r] != Argmax(row, kVocab);
    with_logprobs += s.logprobs > 0;
  }
  for (const int per_launch : {1, 40, kRows, 2 * kRows}) {
    const int total = per_launch == 2 * kRows ? 2 * kRows : kRows;
    DeviceBuffer d_tok = testing::Poisoned<int32_t>(total);
    DeviceBuffer d_lp = testing::Poisoned<engine::RowLogprobs>(total);
    for (int r0 = 0; r0 < total; r0 += per_launch) {
      ASSERT_TRUE(SampleRows(d_logits.as<float>() + static_cast<size_t>(r0) * kVocab, per_launch,
                             kVocab, d_specs.as<engine::SampleSpec>() + r0, d_pen.as<int32_t>(),
                             d_counts.as<int32_t>(), d_bias.as<float>(), d_tok.as<int32_t>() + r0,
                             d_lp.as<engine::RowLogprobs>() + r0, nullptr)
                      .ok());
    }
    const auto tokens = testing::Download<int32_t>(d_tok, total);
    const auto lps = testing::Download<engine::RowLogprobs>(d_lp, total);
    for (int i = 0; i < total; ++i) {
      const int r = i % kRows;
      const engine::SampleSpec& s = specs[r];
      EXPECT_EQ(tokens[i], want_tokens[r])
          << "rows per launch " << per_launch << " row " << r << " T " << s.temperature << " k "
          << s.top_k << " p " << s.top_p << " min_p " << s.min_p << " penalty "
          << s.repetition_penalty << " frequency " << s.frequency_penalty << " presence "
          << s.presence_penalty << " biased " << s.biased;
      if (s.logprobs == 0) continue;
      const engine::RowLogprobs& got = lps[i];
      const engine::RowLogprobs& want = want_lps[r];
      ASSERT_EQ(got.num_top, want.num_top) << "row " << r;
      EXPECT_EQ(std::memcmp(&got.sampled, &want.sampled, 4), 0)
          << "rows per launch " << per_launch << " row " << r << " " << got.sampled << " vs "
          << want.sampled;
      for (int k = 0; k < want.num_top; ++k) {
        EXPECT_EQ(got.top_ids[k], want.top_ids[k]) << "row " << r << " rank " << k;
        EXPECT_EQ(std::memcmp(&got.top[k], &want.top[k], 4), 0)
            << "rows per launch " << per_launch << " row " << r << " rank " << k << " "
            << got.top[k] << " vs " << want.top[k];
      }
    }
  }
  std::printf(
      "device == host sampler: %d rows (%d with logprobs, %d biased, %d not the argmax), launched "
      "1, 40, 120 and 240 rows at a time\n",
      kRows, with_logprobs, biased_rows, not_argmax);
  EXPECT_GT(not_argmax, kRows / 3) << "the rows should exercise the random draw";
}

// Score rows (SampleSpec::score_token: a prompt token scored, vLLM's prompt_logprobs) on the
// device against the host's rule, bitwise: the token is the scored one, its logprob, rank and top
// list the host's, on full-size rows of several shapes (exact ties, one value everywhere, NaN and
// -inf entries, the scored token the argmax, tied, NaN or anywhere), 0-20 top logprobs, mixed in
// one launch with drawn rows (each instance of the kernel runs only its own), launched 1, 16 and
// all rows at a time (a row split over 8 down to 1 CTAs). A launch told there are no score rows
// leaves theirs unwritten.
TEST(CudaBackend, DeviceScoreRowsEqualHostRuleBitwise) {
  CASCADE_REQUIRE_GPU();
  constexpr int kVocab = 151936, kRows = 48;
  std::mt19937 rng(46);
  std::vector<float> logits(static_cast<size_t>(kRows) * kVocab);
  std::vector<engine::SampleSpec> specs(kRows);
  std::uniform_int_distribution<int> tok(0, kVocab - 1);
  const int logprob_ns[] = {0, 1, 5, 20};
  int score_rows = 0;
  for (int r = 0; r < kRows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * kVocab;
    std::normal_distribution<float> g(0.0f, r % 2 ? 1.0f : 5.0f);
    for (int v = 0; v < kVocab; ++v) row[v] = g(rng);
    if (r % 6 == 1) {  // coarse values: many exact ties
      for (int v = 0; v < kVocab; ++v) row[v] = std::round(row[v] * 2.0f) / 2.0f;
    }
    if (r == 5) std::fill(row, row + kVocab, -2.5f);  // one value: every token ranks last
    if (r % 6 == 3) row[101] = NAN, row[102] = -INFINITY, row[103] = -0.0f, row[104] = 0.0f;
    engine::SampleSpec& s = specs[r];
    s.seed = 77 + r;
    s.position = 1000 + r;
    if (r % 4 == 3) {  // a drawn row between score rows
      s.temperature = 0.8f;
      s.top_p = 0.9f;
      s.logprobs = 4;
      continue;
    }
    ++score_rows;
    s.logprobs = logprob_ns[r % 4 == 2 ? 3 : (r / 4) % 4];
    s.temperature = r % 5 == 0 ? 1.3f : 0.0f;  // (ignored by score rows)
    int32_t t = tok(rng);
    if ((r / 3) % 2 == 0) t = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
    if (r % 6 == 1 && (r / 12) % 2 == 0) {  // a token tied with many others
      for (int v = 0; v < kVocab; ++v)
        if (row[v] == 0.5f) t = v;
    }
    if (r % 6 == 3) t = 101 + (r / 12) % 4;  // NaN, -inf, -0, +0
    s.score_token = t;
  }
  DeviceBuffer d_logits = testing::Upload(logits), d_specs = testing::Upload(specs);
  std::vector<int32_t> want_tokens(kRows);
  std::vector<engine::RowLogprobs> want(kRows);
  for (int r = 0; r < kRows; ++r) {
    want_tokens[r] = engine::SampleRowRule(logits.data() + static_cast<size_t>(r) * kVocab, kVocab,
                                           specs[r], {}, {}, {}, &want[r]);
  }
  for (const int per_launch : {1, 16, kRows}) {
    DeviceBuffer d_tok = testing::Poisoned<int32_t>(kRows);
    DeviceBuffer d_lp = testing::Poisoned<engine::RowLogprobs>(kRows);
    for (int r0 = 0; r0 < kRows; r0 += per_launch) {
      ASSERT_TRUE(SampleRows(d_logits.as<float>() + static_cast<size_t>(r0) * kVocab, per_launch,
                             kVocab, d_specs.as<engine::SampleSpec>() + r0, nullptr, nullptr,
                             nullptr, d_tok.as<int32_t>() + r0, d_lp.as<engine::RowLogprobs>() + r0,
                             nullptr, /*score_rows=*/true)
                      .ok());
    }
    const auto tokens = testing::Download<int32_t>(d_tok, kRows);
    const auto lps = testing::Download<engine::RowLogprobs>(d_lp, kRows);
    for (int r = 0; r < kRows; ++r) {
      SCOPED_TRACE(absl::StrCat("rows per launch ", per_launch, " row ", r, " token ",
                                specs[r].score_token, " logprobs ", specs[r].logprobs));
      EXPECT_EQ(tokens[r], want_tokens[r]);
      const engine::RowLogprobs& got = lps[r];
      ASSERT_EQ(got.num_top, want[r].num_top);
      EXPECT_EQ(got.rank, want[r].rank);
      EXPECT_EQ(std::memcmp(&got.sampled, &want[r].sampled, 4), 0)
          << got.sampled << " vs " << want[r].sampled;
      for (int k = 0; k < want[r].num_top; ++k) {
        EXPECT_EQ(got.top_ids[k], want[r].top_ids[k]) << "top " << k;
        EXPECT_EQ(std::memcmp(&got.top[k], &want[r].top[k], 4), 0) << "top " << k;
      }
    }
  }
  // Without the score rows' launch their rows stay as they were (poisoned: -1), the others drawn.
  DeviceBuffer d_tok = testing::Poisoned<int32_t>(kRows);
  DeviceBuffer d_lp = testing::Poisoned<engine::RowLogprobs>(kRows);
  ASSERT_TRUE(SampleRows(d_logits.as<float>(), kRows, kVocab, d_specs.as<engine::SampleSpec>(),
                         nullptr, nullptr, nullptr, d_tok.as<int32_t>(),
                         d_lp.as<engine::RowLogprobs>(), nullptr)
                  .ok());
  const auto tokens = testing::Download<int32_t>(d_tok, kRows);
  for (int r = 0; r < kRows; ++r) {
    EXPECT_EQ(tokens[r], specs[r].score_token >= 0 ? -1 : want_tokens[r]) << "row " << r;
  }
  std::printf(
      "device == host score rows: %d score rows among %d, launched 1, 16 and %d at a time\n",
      score_rows, kRows, kRows);
}

// The sampling kernel's draw skips a token's exact Gumbel noise when a bound shows it cannot win;
// the bounds must hold for every value the random stream can give (2^24 of them, checked on this
// device: the bound uses the GPU's fast logarithm). A violation would make SampleRows differ
// from the host rule for some seed.
TEST(CudaBackend, GumbelBoundsHoldForEveryUniform) {
  CASCADE_REQUIRE_GPU();
  DeviceBuffer d_count = testing::Poisoned<unsigned long long>(1);
  ASSERT_TRUE(CountGumbelBoundViolations(d_count.as<unsigned long long>(), nullptr).ok());
  EXPECT_EQ(testing::Download<unsigned long long>(d_count, 1)[0], 0u);
}

// Options are checked before any device work, so this runs without a GPU: out-of-range values
// are refused with InvalidArgument, the defaults pass.
TEST(CudaBackend, OutOfRangeOptionsAreRefused) {
  EXPECT_TRUE(ValidateCudaBackendOptions(CudaBackendOptions{}).ok());
  auto refused = [](auto change) {
    CudaBackendOptions o;
    change(o);
    return absl::IsInvalidArgument(ValidateCudaBackendOptions(o));
  };
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.split_k = -1; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.gemm_reference_m = 0; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.gemm_reference_m = -256; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.block_size = 7; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.kv_cache_fraction = 1.5; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.device = -1; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.decode_gemm_early_chunks = -1; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.gemm_tune_min_hidden = -1; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.prefetch_weights_max_rows = -1; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.prefetch_weights_ctas = 0; }));
  EXPECT_TRUE(refused([](CudaBackendOptions& o) { o.prefetch_weights_ctas = 1025; }));
  // The fold order: 1, kSuperTiles or 0 (automatic); nothing else has kernels.
  for (int g : {-1, 2, 3, 8}) {
    EXPECT_TRUE(refused([g](CudaBackendOptions& o) { o.attention_super_tiles = g; })) << g;
  }
  for (int g : {0, 1, kSuperTiles}) {
    CudaBackendOptions o;
    o.attention_super_tiles = g;
    EXPECT_TRUE(ValidateCudaBackendOptions(o).ok()) << g;
  }
}

// KvNumerics names what fixes a KV block's bits: equal for two backends of the same settings,
// different where the projections' pinned kernels (split-K) or the attention's fold order
// (super-tiles, where the device runs them) differ, and marked in heuristic mode, so workers
// exchange blocks only when a block carries the bits the receiver would compute.
TEST(CudaBackend, KvNumericsNamesWhatFixesTheBits) {
  CASCADE_REQUIRE_GPU();
  model::ModelConfig c = model::PresetConfig("tiny");
  c.head_dim = 128;  // super-tiles run at head_dim 128 (SuperTilesFor)
  auto model = cpu::testing_util::MakeModel(c, 2);
  auto numerics = [&](auto change) {
    CudaBackendOptions o;
    o.num_blocks = 64;
    o.block_size = kBs;
    o.max_num_tokens = 256;
    o.max_logits_rows = 8;
    o.tune_prefill_attention = false;
    change(o);
    auto b = NewCudaBackend(*model, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? (*b)->KvNumerics() : std::string();
  };
  const std::string base = numerics([](CudaBackendOptions&) {});
  std::printf("KvNumerics: %s\n", base.c_str());
  EXPECT_EQ(base.rfind("cuda/v", 0), 0u) << base;
  EXPECT_EQ(base, numerics([](CudaBackendOptions& o) { o.cuda_graphs = false; }));
  EXPECT_NE(base, numerics([](CudaBackendOptions& o) { o.split_k = 1; }));  // the rule: 0
  EXPECT_NE(numerics([](CudaBackendOptions& o) { o.batch_invariant = false; }).find("heuristic"),
            std::string::npos);
  absl::StatusOr<int> g = SuperTilesFor(128, kBs);
  ASSERT_TRUE(g.ok()) << g.status();
  if (*g > 1) {
    EXPECT_NE(base, numerics([](CudaBackendOptions& o) { o.attention_super_tiles = 0; }));
  }
}

TEST(CudaBackend, RejectsMalformedBatches) {
  CASCADE_REQUIRE_GPU();
  auto model = MakeModel("tiny", 4);
  CudaBackendOptions go;
  go.num_blocks = 8;
  go.max_num_tokens = 64;
  auto gpu = NewCudaBackend(*model, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> logits;
  engine::ForwardBatch b = MakeBatch({{{1, 2, 3}, 0, Blocks(0, 1)}});
  b.token_ids[1] = (*gpu)->VocabSize();
  EXPECT_EQ((*gpu)->Forward(b, &logits).code(), absl::StatusCode::kInvalidArgument);
  b = MakeBatch({{{1, 2, 3}, 0, Blocks(0, 1)}});
  b.block_ids[0] = 8;
  EXPECT_EQ((*gpu)->Forward(b, &logits).code(), absl::StatusCode::kInvalidArgument);
  b = MakeBatch({{std::vector<int32_t>(65, 1), 0, Blocks(0, 5)}});
  EXPECT_EQ((*gpu)->Forward(b, &logits).code(), absl::StatusCode::kInvalidArgument);
  b = MakeBatch({{{1, 2, 3}, 0, Blocks(0, 1)}});
  EXPECT_TRUE((*gpu)->Forward(b, &logits).ok());
}

}  // namespace
}  // namespace cascade::cuda
