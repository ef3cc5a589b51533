// The design's acceptance test on the product backend: the engine over the CUDA backend (tiny
// model, deterministic mode) gives bitwise-identical logits and identical tokens whether a
// prompt's chunks are all, some or none cached, batched with cold sequences, preempted, or
// decoded as a cascade group sharing a long prefix; and its greedy tokens mostly agree with the
// float32 CPU backend's through the same engine.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/cuda_backend.h"
#include "gpu_worker/engine/engine.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/model.h"
#include "gtest/gtest.h"
#include "tests/backend_cpu/test_util.h"
#include "tests/engine/engine_test_util.h"
#include "tests/gpu/test_util.h"

namespace cascade::cuda {
namespace {

using engine::testing::Result;
using engine::testing::RunAll;
using engine::testing::RunOne;
using engine::testing::StopAtFourthToken;

constexpr int kBs = 16;
constexpr int kMaxBatchedTokens = 1024;

// Forwards to the CUDA backend and plans each batch's attention the way it does, so a test can
// see that the cascade path (groups of decode rows sharing prefix tiles) actually ran.
class PlanCountingBackend : public engine::Backend {
 public:
  struct Counts {
    int64_t forwards = 0;
    int64_t cascade_groups = 0;
    int64_t cascade_shared_tiles = 0;
  };
  PlanCountingBackend(std::unique_ptr<engine::Backend> inner, AttentionConfig config,
                      Counts* counts)
      : inner_(std::move(inner)), config_(config), counts_(counts) {}
  std::string Name() const override { return inner_->Name(); }
  std::string KvNumerics() const override { return inner_->KvNumerics(); }
  int64_t NumBlocks() const override { return inner_->NumBlocks(); }
  int BlockSize() const override { return inner_->BlockSize(); }
  int VocabSize() const override { return inner_->VocabSize(); }
  absl::Status Forward(const engine::ForwardBatch& b, std::vector<float>* logits) override {
    AttentionBatch ab{
        b.positions.data(),         b.num_tokens(),     b.query_start.data(), b.context_lens.data(),
        b.block_table_start.data(), b.block_ids.data(), b.num_seqs()};
    AttentionPlan plan;
    if (PlanAttention(config_, ab, &plan).ok()) {
      counts_->cascade_groups += plan.cascade_groups;
      counts_->cascade_shared_tiles += plan.cascade_shared_tiles;
    }
    ++counts_->forwards;
    return inner_->Forward(b, logits);
  }

 private:
  std::unique_ptr<engine::Backend> inner_;
  AttentionConfig config_;
  Counts* counts_;
};

class EngineCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (DeviceCount() == 0) return;
    model_ = cpu::testing_util::MakeModel(model::PresetConfig("tiny"), 21).release();
    ASSERT_NE(model_, nullptr);
  }
  static void TearDownTestSuite() {
    shared_.reset();
    delete model_;
    model_ = nullptr;
  }

  static std::unique_ptr<engine::Engine> MakeEngine(int64_t blocks, bool cascade = true,
                                                    PlanCountingBackend::Counts* counts = nullptr,
                                                    engine::EngineOptions opts = {}) {
    CudaBackendOptions go;
    go.num_blocks = blocks;
    go.block_size = kBs;
    go.max_num_tokens = kMaxBatchedTokens;
    go.cascade = cascade;
    go.cuda_graphs = graphs_;
    go.speculative_launch = speculative_;
    auto gpu = NewCudaBackend(*model_, go);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    if (!gpu.ok()) return nullptr;
    std::unique_ptr<engine::Backend> backend = std::move(*gpu);
    last_backend_ = backend.get();
    if (counts != nullptr) {
      const model::ModelConfig& c = model_->config();
      AttentionConfig ac{static_cast<int>(c.num_attention_heads),
                         static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim), kBs,
                         cascade};
      backend = std::make_unique<PlanCountingBackend>(std::move(backend), ac, counts);
    }
    opts.model_name = "tiny";
    opts.debug_capture_logits = capture_logits_;
    opts.max_num_batched_tokens = kMaxBatchedTokens;
    opts.max_num_seqs = 64;
    return engine::NewEngine(opts, std::move(backend));
  }

  // One engine for the tests that isolate their requests by cache salt (salts share nothing).
  static engine::Engine* Shared() {
    if (!shared_) shared_ = MakeEngine(2048);
    return shared_.get();
  }

  static int Vocab() { return static_cast<int>(model_->config().vocab_size); }

  static model::Model* model_;
  static std::unique_ptr<engine::Engine> shared_;
  static inline bool capture_logits_ = true;
  static inline bool graphs_ = true;                       // CudaBackendOptions::cuda_graphs
  static inline bool speculative_ = false;                 // CudaBackendOptions::speculative_launch
  static inline engine::Backend* last_backend_ = nullptr;  // the CUDA backend MakeEngine made last
};
model::Model* EngineCudaTest::model_ = nullptr;
std::unique_ptr<engine::Engine> EngineCudaTest::shared_;

#define REQUIRE_GPU_AND_MODEL() \
  CASCADE_REQUIRE_GPU();        \
  ASSERT_NE(model_, nullptr)

engine::Request Prefix(const engine::Request& r, size_t chunks) {
  engine::Request p = r;
  p.chunks.resize(chunks);
  p.sampling.max_tokens = 1;
  return p;
}

engine::Request Salted(engine::Request r, const std::string& salt) {
  r.cache_salt = salt;
  return r;
}

// Bitwise: the logits vectors compare with ==, element by element (no NaN in valid logits).
void ExpectSame(const Result& want, const Result& got, const std::string& what) {
  EXPECT_TRUE(got.status.ok()) << what << ": " << got.status;
  EXPECT_EQ(want.tokens, got.tokens) << what;
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    ASSERT_EQ(want.logits[i].size(), got.logits[i].size()) << what;
    EXPECT_EQ(0, std::memcmp(want.logits[i].data(), got.logits[i].data(),
                             want.logits[i].size() * sizeof(float)))
        << what << ": logits of generated token " << i << " differ";
  }
  EXPECT_EQ(want.finish, got.finish) << what;
}

// All, some and none of a chunked prompt's chunks cached (chunks of random length, so most end
// mid-block; prompts up to ~360 tokens, so prefixes cross 64-token attention tiles), greedy and
// seeded sampling: the same tokens and the same logits bits as the prompt served cold.
TEST_F(EngineCudaTest, CachedEqualsColdForRandomChunkedPromptsBitwise) {
  REQUIRE_GPU_AND_MODEL();
  engine::Engine& e = *Shared();
  std::mt19937 rng(1);
  int64_t cached_runs = 0;
  for (int trial = 0; trial < 10; ++trial) {
    engine::Request req = engine::testing::RandomRequest(rng, Vocab(), 1 + trial % 4, 90, 8);
    if (trial % 2) {
      req.sampling.temperature = 0.8f;
      req.sampling.top_p = 0.95f;
      req.sampling.seed = 1000 + trial;
    }
    const std::string tag = "t" + std::to_string(trial);
    Result cold = RunOne(e, Salted(req, tag + "-cold"));
    ASSERT_TRUE(cold.status.ok()) << cold.status;
    EXPECT_EQ(cold.cached_tokens, 0);
    ASSERT_EQ(cold.logits.size(), 8u);
    for (size_t k = 1; k <= req.chunks.size(); ++k) {
      const std::string salt = tag + "-k" + std::to_string(k);
      RunOne(e, Salted(Prefix(req, k), salt));  // caches the first k chunks' full blocks
      Result hot = RunOne(e, Salted(req, salt));
      ExpectSame(cold, hot, tag + " cached chunks " + std::to_string(k));
      int64_t prefix_len = 0;
      for (size_t c = 0; c < k; ++c) prefix_len += req.chunks[c].tokens.size();
      const int64_t expect = std::min(prefix_len / kBs, (cold.prompt_tokens - 1) / kBs) * kBs;
      EXPECT_EQ(hot.cached_tokens, expect) << tag << " k " << k;
      cached_runs += hot.cached_tokens > 0;
    }
  }
  EXPECT_GT(cached_runs, 10);
}

// Greedy rows without logits capture take the device argmax path (ForwardSampled copies 4 bytes
// per row instead of the whole vocabulary): the same tokens as sampling on the host from the
// full logits, cached or cold, alone or batched.
TEST_F(EngineCudaTest, DeviceArgmaxPathGivesTheHostSamplersTokens) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(7);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 12; ++i)
    reqs.push_back(engine::testing::RandomRequest(rng, Vocab(), 2, 80, 16));
  auto host = MakeEngine(2048);
  capture_logits_ = false;
  auto device = MakeEngine(2048);
  capture_logits_ = true;
  std::vector<Result> want = RunAll(*host, reqs);
  std::vector<Result> got = RunAll(*device, reqs);
  std::vector<Result> again = RunAll(*device, reqs);  // now with cached prefixes
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(want[i].tokens, got[i].tokens) << "request " << i;
    EXPECT_EQ(want[i].tokens, again[i].tokens) << "request " << i << " cached";
    EXPECT_TRUE(got[i].logits.empty()) << "the greedy rows should not have come back whole";
  }
}

// Prompt logprobs on the GPU: a prompt extended by the tokens a request generated (logprobs
// drawn on the device) scores those tokens with the same logprobs and top tokens, bitwise (a
// prompt-logprob row is a score row the device scores by the rule's step 5), cold and with the
// prompt cached; many rows a step (more than the LM head's 256 a pass) and few; and the engine
// scoring the same prompt from whole rows on the host (capture) gets the same bits and ranks.
TEST_F(EngineCudaTest, PromptLogprobsEqualTheDeviceSamplersLogprobsOfThoseTokens) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(17);
  capture_logits_ = false;
  for (int rows : {512, 5}) {
    SCOPED_TRACE(absl::StrCat("rows a step ", rows));
    engine::EngineOptions opts;
    opts.max_prompt_logprob_rows = rows;
    auto engine = MakeEngine(2048, true, nullptr, opts);
    engine::Request gen = engine::testing::RandomRequest(rng, Vocab(), 3, 150, 6);
    gen.sampling.temperature = 0.8f;
    gen.sampling.seed = 3;
    gen.sampling.logprobs = 3;
    gen.sampling.ignore_eos = true;
    const Result a = RunOne(*engine, gen);
    ASSERT_EQ(a.tokens.size(), 6u);
    ASSERT_EQ(a.logprobs.size(), 6u);
    int64_t prompt = 0;
    for (const auto& c : gen.chunks) prompt += static_cast<int64_t>(c.tokens.size());
    engine::Request score = gen;
    score.chunks.push_back({4, a.tokens, ""});
    score.sampling.prompt_logprobs = 3;
    score.sampling.max_tokens = 1;
    for (int round = 0; round < 2; ++round) {  // the second with every block cached
      const Result b = RunOne(*engine, score);
      ASSERT_EQ(static_cast<int64_t>(b.prompt_logprobs.size()), prompt + 5);
      EXPECT_EQ(b.cached_tokens, 0);
      for (size_t i = 0; i < 6; ++i) {
        const engine::LogprobEntry& want = a.logprobs[i];
        const engine::LogprobEntry& got = b.prompt_logprobs[prompt - 1 + i];
        EXPECT_EQ(got.sampled.token_id, a.tokens[i]);
        EXPECT_EQ(got.sampled.logprob, want.sampled.logprob) << "token " << i;
        ASSERT_EQ(got.top.size(), want.top.size());
        for (size_t j = 0; j < got.top.size(); ++j) {
          EXPECT_EQ(got.top[j].token_id, want.top[j].token_id);
          EXPECT_EQ(got.top[j].logprob, want.top[j].logprob);
        }
      }
    }
    // The device's score rows equal the engine's scoring of whole rows (capture), rank included.
    capture_logits_ = true;
    auto host = MakeEngine(2048, true, nullptr, opts);
    capture_logits_ = false;
    const Result h = RunOne(*host, score);
    const Result d = RunOne(*engine, score);
    ASSERT_EQ(h.prompt_logprobs.size(), d.prompt_logprobs.size());
    int top_ranked = 0;
    for (size_t p = 0; p < h.prompt_logprobs.size(); ++p) {
      const engine::LogprobEntry& x = h.prompt_logprobs[p];
      const engine::LogprobEntry& y = d.prompt_logprobs[p];
      EXPECT_EQ(x.sampled.token_id, y.sampled.token_id) << "position " << p;
      EXPECT_EQ(x.sampled.logprob, y.sampled.logprob) << "position " << p;
      EXPECT_EQ(x.rank, y.rank) << "position " << p;
      EXPECT_GE(y.rank, 1) << "position " << p;
      top_ranked += y.rank == 1;
      ASSERT_EQ(x.top.size(), y.top.size());
      for (size_t j = 0; j < x.top.size(); ++j) {
        EXPECT_EQ(x.top[j].token_id, y.top[j].token_id) << "position " << p;
        EXPECT_EQ(x.top[j].logprob, y.top[j].logprob) << "position " << p;
      }
    }
    std::printf("score rows == host scoring: %zu positions, %d ranked first\n",
                d.prompt_logprobs.size(), top_ranked);
  }
  capture_logits_ = true;
}

// Every row is drawn on the device by sample_rule.h's rule (temperature, min-p, top-k, top-p,
// repetition, frequency and presence penalties, logit bias, min_tokens' ban of stop ids,
// logprobs): alone or batched, cached or cold, a seeded request gets the same tokens and
// logprobs; and the host applying the rule to the whole logits rows (capture mode) gets the same
// bits.
TEST_F(EngineCudaTest, DeviceSamplingOfEveryOptionIsBatchInvariantAndEqualsTheHostRule) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(8);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 14; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 80, 16);
    engine::SamplingParams& p = r.sampling;
    p.temperature = i % 7 == 6 ? 0.0f : 0.9f;
    p.seed = 900 + i;
    if (i % 7 == 1 || i % 7 == 5) p.top_k = 40;
    if (i % 7 == 2 || i % 7 == 5) p.top_p = 0.9f;
    if (i % 7 == 3 || i % 7 == 5) p.min_p = 0.05f;
    if (i % 7 == 4 || i % 7 == 5 || i % 7 == 6) p.repetition_penalty = 1.3f;
    if (i == 5 || i == 6) p.frequency_penalty = 0.8f, p.presence_penalty = 0.4f;
    if (i == 10) p.frequency_penalty = -0.6f;  // no repetition penalty: generated tokens only
    if (i == 13) p.presence_penalty = 1.7f;
    if (i == 3 || i == 5 || i == 12)
      p.logit_bias = engine::testing::RandomLogitBias(rng, Vocab(), r, 7);
    if (i % 2 == 1) p.logprobs = 1 + i;
    reqs.push_back(r);
  }
  capture_logits_ = false;
  auto device = MakeEngine(2048);
  {
    // min_tokens: the stop ids are tokens these requests generate (the third and the sixth), so
    // the ban (-inf biases while the first 12 are sampled) decides tokens on the device.
    auto probe = MakeEngine(2048);  // (not `device`: its first run stays the cold one)
    const std::vector<Result> first = RunAll(*probe, reqs);
    for (int i : {1, 6, 12}) {
      ASSERT_GE(first[i].tokens.size(), 6u);
      reqs[i].sampling.stop_token_ids = {first[i].tokens[2], first[i].tokens[5]};
      reqs[i].sampling.min_tokens = 12;
    }
  }
  auto device_alone = MakeEngine(2048);
  capture_logits_ = true;
  auto host = MakeEngine(2048);
  std::vector<Result> batched = RunAll(*device, reqs);
  std::vector<Result> again = RunAll(*device, reqs);  // cached prefixes now
  std::vector<Result> on_host = RunAll(*host, reqs);
  auto same_logprobs = [](const Result& a, const Result& b) {
    if (a.logprobs.size() != b.logprobs.size()) return false;
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      const auto &x = a.logprobs[t], &y = b.logprobs[t];
      if (x.sampled.token_id != y.sampled.token_id ||
          std::memcmp(&x.sampled.logprob, &y.sampled.logprob, 4) != 0 ||
          x.top.size() != y.top.size()) {
        return false;
      }
      for (size_t j = 0; j < x.top.size(); ++j) {
        if (x.top[j].token_id != y.top[j].token_id ||
            std::memcmp(&x.top[j].logprob, &y.top[j].logprob, 4) != 0) {
          return false;
        }
      }
    }
    return true;
  };
  for (size_t i = 0; i < reqs.size(); ++i) {
    Result alone = RunOne(*device_alone, reqs[i]);
    EXPECT_EQ(alone.tokens, batched[i].tokens) << "request " << i << " batched vs alone";
    EXPECT_EQ(again[i].tokens, batched[i].tokens) << "request " << i << " cached vs cold";
    EXPECT_EQ(on_host[i].tokens, batched[i].tokens) << "request " << i << " host vs device";
    EXPECT_TRUE(batched[i].logits.empty()) << "rows came back whole";
    EXPECT_EQ(batched[i].logprobs.size(),
              reqs[i].sampling.logprobs > 0 ? batched[i].tokens.size() : 0u);
    EXPECT_TRUE(same_logprobs(alone, batched[i])) << "request " << i;
    EXPECT_TRUE(same_logprobs(again[i], batched[i])) << "request " << i;
    EXPECT_TRUE(same_logprobs(on_host[i], batched[i])) << "request " << i << " host vs device";
    const auto& stops = reqs[i].sampling.stop_token_ids;
    const size_t held = static_cast<size_t>(reqs[i].sampling.min_tokens);
    ASSERT_GE(batched[i].tokens.size(), held) << "request " << i;
    for (size_t t = 0; t < held; ++t) {
      EXPECT_EQ(std::find(stops.begin(), stops.end(), batched[i].tokens[t]), stops.end())
          << "request " << i << " token " << t << " is a stop id within min_tokens";
    }
  }
}

// The overlapped schedule on the CUDA backend (decode steps replayed from graphs return before
// they finish; the next step is scheduled and built meanwhile) shows every request the tokens,
// logprobs and finish of the plain engine: every sampling option on the device, stop tokens, a
// cancel, requests added mid-run, a small KV cache (preemption itself: EngineCpuTest's test).
TEST_F(EngineCudaTest, OverlappedScheduleGivesThePlainEnginesOutputs) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(12);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 12; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 60, 10 + i % 6);
    engine::SamplingParams& p = r.sampling;
    p.temperature = i % 6 == 5 ? 0.0f : 0.9f;
    p.seed = 700 + i;
    if (i % 6 == 1) p.top_k = 40, p.repetition_penalty = 1.3f;
    if (i == 7) p.frequency_penalty = 0.7f, p.presence_penalty = 0.2f;
    if (i == 4) p.presence_penalty = -0.9f;
    if (i == 1 || i == 4) p.logit_bias = engine::testing::RandomLogitBias(rng, Vocab(), r, 5);
    if (i % 6 == 2) p.top_p = 0.9f, p.logprobs = 4;
    if (i % 6 == 3) p.min_p = 0.05f, p.logprobs = 1;
    reqs.push_back(r);
  }
  capture_logits_ = false;
  ASSERT_NO_FATAL_FAILURE(StopAtFourthToken(*MakeEngine(2048), reqs, {2, 7, 9}));
  engine::EngineOptions overlap_opts;
  overlap_opts.overlap_schedule = true;
  // 20 blocks of 16 tokens for up to twelve sequences of up to 135.
  auto plain = MakeEngine(20);
  auto overlap = MakeEngine(20, true, nullptr, overlap_opts);
  engine::Backend* overlap_backend = last_backend_;
  capture_logits_ = true;
  const std::vector<engine::testing::Seen> a = engine::testing::RunScripted(*plain, reqs);
  const std::vector<engine::testing::Seen> b = engine::testing::RunScripted(*overlap, reqs);
  int stops = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(a[i] == b[i]) << "request " << i << ": " << a[i].tokens.size() << " vs "
                              << b[i].tokens.size() << " tokens";
    stops += a[i].finish == engine::FinishReason::kStop;
  }
  EXPECT_EQ(stops, 3);
  EXPECT_EQ(a[1].finish, engine::FinishReason::kCancelled);
  // Preemption counts may differ: the overlapped schedule plans as if every sequence in flight
  // went on, so it can preempt where the plain one finds a block freed by a stop token.
  EXPECT_GT(GetCudaGraphStats(*overlap_backend).replays, 0) << "no decode step ran overlapped";
  std::printf(
      "overlap == plain: %zu requests (%d stops, 1 cancel, %lld preemptions), %lld graph "
      "replays\n",
      reqs.size(), stops, static_cast<long long>(plain->Stats().preemptions),
      static_cast<long long>(GetCudaGraphStats(*overlap_backend).replays));
}

// Speculated launches (CudaBackendOptions::speculative_launch: the overlapped engine's next decode
// step enqueued behind the one in flight, its inputs fed on the device, adopted with the rows of
// sequences that ended meanwhile dropped) show every request what the plain engine shows: stop
// tokens, a cancel, sequences added mid-run, preemption in a KV cache too small; greedy,
// temperature, top-k / top-p / min-p and logprobs rows, every one sampled on the device.
TEST_F(EngineCudaTest, SpeculatedLaunchesGiveThePlainEnginesOutputs) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(13);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 12; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 60, 10 + i % 6);
    engine::SamplingParams& p = r.sampling;
    p.temperature = i % 4 == 3 ? 0.0f : 0.9f;
    p.seed = 900 + i;
    if (i % 6 == 1) p.top_k = 40;
    if (i % 6 == 2) p.top_p = 0.9f, p.logprobs = 4;
    if (i % 6 == 3) p.min_p = 0.05f, p.logprobs = 1;
    reqs.push_back(r);
  }
  capture_logits_ = false;
  ASSERT_NO_FATAL_FAILURE(StopAtFourthToken(*MakeEngine(2048), reqs, {2, 5, 9}));
  engine::EngineOptions overlap_opts;
  overlap_opts.overlap_schedule = true;
  auto plain = MakeEngine(20);
  speculative_ = true;
  auto spec = MakeEngine(20, true, nullptr, overlap_opts);
  speculative_ = false;
  engine::Backend* spec_backend = last_backend_;
  const std::vector<engine::testing::Seen> a = engine::testing::RunScripted(*plain, reqs);
  const std::vector<engine::testing::Seen> b = engine::testing::RunScripted(*spec, reqs);
  capture_logits_ = true;
  int stops = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(a[i] == b[i]) << "request " << i << ": " << a[i].tokens.size() << " vs "
                              << b[i].tokens.size() << " tokens";
    stops += a[i].finish == engine::FinishReason::kStop;
  }
  EXPECT_EQ(stops, 3);
  EXPECT_EQ(a[1].finish, engine::FinishReason::kCancelled);
  const engine::EngineStats st = spec->Stats();
  const CudaGraphStats gs = GetCudaGraphStats(*spec_backend);
  std::printf(
      "speculated == plain: %lld of %lld steps speculated, %lld rows dropped; backend "
      "%lld adopted, %lld dropped; %lld eager steps left in flight, %lld steps started behind "
      "one\n",
      static_cast<long long>(st.speculated_steps), static_cast<long long>(st.steps),
      static_cast<long long>(st.speculated_rows_dropped),
      static_cast<long long>(gs.speculated_adopted), static_cast<long long>(gs.speculated_dropped),
      static_cast<long long>(gs.eager_deferred), static_cast<long long>(gs.speculated_after_eager));
  EXPECT_GT(st.speculated_steps, 0);
  EXPECT_EQ(st.speculated_steps, gs.speculated_adopted);
  // The scripted arrivals' prefills run beside decode rows: eager steps (defer_eager_steps, on by
  // default) left in flight, and decode steps enqueued behind them.
  EXPECT_GT(gs.eager_deferred, 0);
  EXPECT_GT(gs.speculated_after_eager, 0);
  EXPECT_FALSE(spec->HasWork());
}

// The host KV tier on the product backend, under the worker's schedule (overlapped, speculated
// launches): 16 tenants cycle through a GPU cache that holds about a third of them, one after
// another and then all at once, with the blocks eviction takes next copied to the host ahead of
// it on the copy stream while later steps run (EngineOptions::host_offload_ahead_blocks).
// Every output, restored from the host or not, has the logits bits of a cache with room for all.
TEST_F(EngineCudaTest, HostTierWithCopiesAheadOfEvictionGivesTheRoomyEnginesOutputsBitwise) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(14);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 16; ++i)
    reqs.push_back(engine::testing::OneChunkRequest(rng, Vocab(), 70, 6));
  auto roomy = MakeEngine(2048);
  std::vector<Result> want;
  for (const engine::Request& r : reqs) want.push_back(RunOne(*roomy, Salted(r, "roomy")));
  const model::ModelConfig& c = model_->config();
  const int64_t block_bytes =
      int64_t{2} * c.num_hidden_layers * c.num_key_value_heads * kBs * c.head_dim * 2;
  engine::EngineOptions o;
  o.overlap_schedule = true;
  o.host_kv_bytes = 256 * block_bytes;
  o.host_offload_ahead_blocks = 16;
  speculative_ = true;
  auto e = MakeEngine(32, true, nullptr, o);
  speculative_ = false;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Result got = RunOne(*e, reqs[i]);
      ExpectSame(want[i], got, absl::StrCat("round ", round, " tenant ", i));
      if (round > 0) {
        EXPECT_EQ(got.cached_tokens, 64) << "tenant " << i;
      }
    }
  }
  const std::vector<Result> together = RunAll(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) ExpectSame(want[i], together[i], "all at once");
  const engine::EngineStats st = e->Stats();
  std::printf(
      "host tier: %lld blocks offloaded, %lld of them ahead; %lld restored; %lld steps "
      "waited for offloads\n",
      static_cast<long long>(st.host_offloaded_blocks),
      static_cast<long long>(st.host_offloaded_ahead_blocks),
      static_cast<long long>(st.host_restored_blocks),
      static_cast<long long>(st.host_offload_waits));
  EXPECT_GT(st.host_offloaded_ahead_blocks, 0);
  EXPECT_EQ(st.host_offloaded_blocks, st.host_offloaded_ahead_blocks);
  EXPECT_GE(st.prefix_cache_hits_host, 16 * 64);
  EXPECT_EQ(st.host_copy_failures, 0);
  EXPECT_EQ(st.used_blocks, 0);
}

// One step batch holds cached and cold sequences of different lengths: each gets exactly what it
// gets alone (cold, unbatched).
TEST_F(EngineCudaTest, BatchMixingCachedAndColdSequencesMatchesEachAloneBitwise) {
  REQUIRE_GPU_AND_MODEL();
  engine::Engine& e = *Shared();
  std::mt19937 rng(2);
  engine::Request shared = engine::testing::RandomRequest(rng, Vocab(), 1, 150, 1);
  shared.chunks[0].tokens.resize(std::max<size_t>(shared.chunks[0].tokens.size(), 70));
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 10; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 60, 6);
    if (i % 2 == 0) r.chunks.insert(r.chunks.begin(), shared.chunks[0]);
    if (i % 3 == 0) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 77 + i;
    }
    reqs.push_back(r);
  }
  std::vector<Result> alone;
  for (size_t i = 0; i < reqs.size(); ++i) {
    alone.push_back(RunOne(e, Salted(reqs[i], "alone" + std::to_string(i))));
  }
  std::vector<engine::Request> batch;
  for (const engine::Request& r : reqs) batch.push_back(Salted(r, "mixed"));
  RunOne(e, Prefix(batch[0], 1));  // warm the shared chunk
  std::vector<Result> together = RunAll(e, batch);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpectSame(alone[i], together[i], "request " + std::to_string(i));
  }
  EXPECT_GT(together[0].cached_tokens, 0);
  EXPECT_EQ(together[1].cached_tokens, 0);
}

// A KV cache too small for the batch: sequences are preempted and recomputed (their generated
// tokens then come back through prefill rows instead of decode rows); nothing changes.
TEST_F(EngineCudaTest, PreemptionNeverChangesOutputBitwise) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(6);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 10; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 40, 40);
    if (i % 3 == 0) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = i;
    }
    reqs.push_back(r);
  }
  engine::Engine& big = *Shared();
  std::vector<Result> alone;
  for (size_t i = 0; i < reqs.size(); ++i) {
    alone.push_back(RunOne(big, Salted(reqs[i], "pre-alone" + std::to_string(i))));
  }
  auto small = MakeEngine(24);  // 384 tokens of KV for 10 sequences of up to 120
  ASSERT_NE(small, nullptr);
  std::vector<Result> together = RunAll(*small, reqs);
  EXPECT_GT(small->Stats().preemptions, 0);
  std::printf("preemptions: %lld\n", static_cast<long long>(small->Stats().preemptions));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpectSame(alone[i], together[i], "preempted " + std::to_string(i));
  }
}

// The cascade path: 40 sequences share a 300-token system chunk (4 full 64-token tiles, cached
// and so the same blocks for all) and are decoded together, the shared tiles computed once per
// group. Each sequence's tokens and logits equal its run alone, and the whole batch equals the
// same batch on a backend with cascade off.
TEST_F(EngineCudaTest, CascadeGroupDecodeEqualsEachAloneAndNonCascadeBitwise) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(9);
  engine::ChunkInput system;
  system.kind = 1;
  for (int i = 0; i < 300; ++i) system.tokens.push_back(rng() % Vocab());
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 40; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 1, 40, 10);
    r.chunks.insert(r.chunks.begin(), system);
    if (i % 4 == 1) {
      r.sampling.temperature = 0.7f;
      r.sampling.seed = 500 + i;
    }
    reqs.push_back(r);
  }
  PlanCountingBackend::Counts on_counts, off_counts, alone_counts;
  auto alone_engine = MakeEngine(1024, /*cascade=*/true, &alone_counts);
  ASSERT_NE(alone_engine, nullptr);
  std::vector<Result> alone;
  for (const engine::Request& r : reqs) alone.push_back(RunOne(*alone_engine, r));
  EXPECT_EQ(alone_counts.cascade_groups, 0) << "a sequence alone has no group";

  auto on = MakeEngine(1024, /*cascade=*/true, &on_counts);
  auto off = MakeEngine(1024, /*cascade=*/false, &off_counts);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  RunOne(*on, Prefix(reqs[0], 1));  // cache the system chunk: every request maps the same blocks
  RunOne(*off, Prefix(reqs[0], 1));
  std::vector<Result> with_cascade = RunAll(*on, reqs);
  std::vector<Result> without = RunAll(*off, reqs);
  std::printf("cascade: %lld groups, %lld shared tiles over %lld forwards\n",
              static_cast<long long>(on_counts.cascade_groups),
              static_cast<long long>(on_counts.cascade_shared_tiles),
              static_cast<long long>(on_counts.forwards));
  EXPECT_GT(on_counts.cascade_groups, 0) << "the cascade path never ran";
  EXPECT_GE(on_counts.cascade_shared_tiles, 4 * on_counts.cascade_groups);
  EXPECT_EQ(off_counts.cascade_groups, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(with_cascade[i].cached_tokens, 288) << i;
    ExpectSame(alone[i], with_cascade[i], "cascade vs alone " + std::to_string(i));
    ExpectSame(without[i], with_cascade[i], "cascade vs flat " + std::to_string(i));
  }
}

// Decode graphs change no bit: 24 requests (greedy and seeded temperature, different lengths,
// so the decode batch shrinks through the graph buckets) through an engine with decode graphs
// and one without give the same tokens and, with logits captured (whole rows back from the
// graph), the same logits bits; with logits not captured, the rows sampled on the device inside
// the graph give the same tokens as the eager step.
TEST_F(EngineCudaTest, DecodeGraphsGiveEagerTokensAndLogitsBitwise) {
  REQUIRE_GPU_AND_MODEL();
  std::mt19937 rng(12);
  std::vector<engine::Request> reqs;
  for (int i = 0; i < 24; ++i) {
    engine::Request r = engine::testing::RandomRequest(rng, Vocab(), 2, 90, 4 + i % 7 * 6);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 700 + i;
    }
    reqs.push_back(r);
  }
  for (bool capture : {true, false}) {
    capture_logits_ = capture;
    graphs_ = false;
    auto eager = MakeEngine(2048);
    graphs_ = true;
    auto graphed = MakeEngine(2048);
    engine::Backend* graph_backend = last_backend_;
    capture_logits_ = true;
    ASSERT_NE(eager, nullptr);
    ASSERT_NE(graphed, nullptr);
    std::vector<Result> want = RunAll(*eager, reqs);
    std::vector<Result> got = RunAll(*graphed, reqs);
    const CudaGraphStats stats = GetCudaGraphStats(*graph_backend);
    std::printf("engine, logits %s: %lld graph captures, %lld replays\n",
                capture ? "captured" : "sampled on the device",
                static_cast<long long>(stats.captures), static_cast<long long>(stats.replays));
    EXPECT_GT(stats.replays, 10) << "the decode graphs were not used";
    for (size_t i = 0; i < reqs.size(); ++i) {
      ExpectSame(want[i], got[i], (capture ? "logits " : "device ") + std::to_string(i));
    }
  }
}

// Greedy generation through the engine on the CUDA backend (bf16) and the CPU backend (float32).
// Random-weight logits have close runners-up, so the two may part after a few tokens; once they
// part the continuations are unrelated. Measured: the first generated token and the common
// prefix of the token streams.
TEST_F(EngineCudaTest, GreedyTokensMostlyAgreeWithCpuBackend) {
  REQUIRE_GPU_AND_MODEL();
  cpu::CpuBackendOptions co;
  co.num_blocks = 512;
  co.block_size = kBs;
  engine::EngineOptions eo;
  eo.model_name = "tiny";
  eo.max_num_batched_tokens = kMaxBatchedTokens;
  auto cpu_engine = engine::NewEngine(eo, cpu::NewCpuBackend(*model_, co));
  engine::Engine& gpu_engine = *Shared();
  std::mt19937 rng(12);
  constexpr int kPrompts = 16, kTokens = 24;
  std::vector<engine::Request> reqs;
  for (int i = 0; i < kPrompts; ++i) {
    reqs.push_back(Salted(engine::testing::RandomRequest(rng, Vocab(), 2, 60, kTokens), "vs-cpu"));
  }
  std::vector<Result> c = RunAll(*cpu_engine, reqs);
  std::vector<Result> g = RunAll(gpu_engine, reqs);
  int first_equal = 0, common = 0, all_equal = 0;
  for (int i = 0; i < kPrompts; ++i) {
    ASSERT_EQ(c[i].tokens.size(), static_cast<size_t>(kTokens));
    ASSERT_EQ(g[i].tokens.size(), static_cast<size_t>(kTokens));
    first_equal += c[i].tokens[0] == g[i].tokens[0];
    int n = 0;
    while (n < kTokens && c[i].tokens[n] == g[i].tokens[n]) ++n;
    common += n;
    all_equal += n == kTokens;
  }
  std::printf(
      "CUDA vs CPU greedy through the engine: first token equal %d/%d, common prefix %d/%d "
      "tokens (%.1f%%), identical streams %d/%d\n",
      first_equal, kPrompts, common, kPrompts * kTokens, 100.0 * common / (kPrompts * kTokens),
      all_equal, kPrompts);
  EXPECT_GE(first_equal, kPrompts * 3 / 4);
  EXPECT_GE(common, kPrompts * kTokens / 2);
}

}  // namespace
}  // namespace cascade::cuda
