// The design's acceptance test on the real (CPU reference) model: for random chunked prompts,
// generation with all, some or none of the chunks cached gives bitwise-identical logits and
// identical tokens, greedy and seeded; batches mixing cached and cold sequences; eviction and
// preemption. And the root causes of DESIGN.md (local positions, a causal mask without offset)
// injected into the backend are caught by exactly these comparisons.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/engine/row_sampler.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/model.h"
#include "tests/backend_cpu/test_util.h"
#include "tests/engine/engine_test_util.h"

namespace cascade::engine::testing {
namespace {

constexpr int kBlock = 16;

const model::Model& Tiny() {
  static const model::Model* m =
      cpu::testing_util::MakeModel(model::PresetConfig("tiny"), 11).release();
  return *m;
}

std::unique_ptr<Engine> MakeEngine(int64_t blocks, cpu::DebugFault fault = cpu::DebugFault::kNone,
                                   int max_batched_tokens = 2048, bool capture_logits = true,
                                   int64_t host_kv_blocks = 0, bool overlap = false,
                                   int64_t import_bytes_per_step = 0, int overlap_min_rows = 0,
                                   bool speculative = false) {
  cpu::CpuBackendOptions o;
  o.num_blocks = blocks;
  o.block_size = kBlock;
  o.num_threads = 2;
  o.debug_fault = fault;
  o.speculative_launch = speculative;
  EngineOptions eo;
  eo.model_name = "tiny";
  eo.debug_capture_logits = capture_logits;
  eo.max_num_batched_tokens = max_batched_tokens;
  eo.eos_token_ids = Tiny().config().eos_token_ids;
  eo.overlap_schedule = overlap;
  eo.overlap_min_rows = overlap_min_rows;
  if (import_bytes_per_step > 0) eo.import_bytes_per_step = import_bytes_per_step;
  std::unique_ptr<Backend> backend = cpu::NewCpuBackend(Tiny(), o);
  eo.host_kv_bytes = host_kv_blocks * backend->KvBlockBytes();
  auto engine = NewEngine(eo, std::move(backend));
  EXPECT_TRUE(engine->HostTierStatus().ok()) << engine->HostTierStatus();
  return engine;
}

// An engine of 64 blocks with the options `tweak` sets (beside the tiny model's name).
std::unique_ptr<Engine> EngineWith(const std::function<void(EngineOptions*)>& tweak) {
  cpu::CpuBackendOptions o;
  o.num_blocks = 64;
  o.block_size = kBlock;
  o.num_threads = 2;
  EngineOptions eo;
  eo.model_name = "tiny";
  tweak(&eo);
  return NewEngine(eo, cpu::NewCpuBackend(Tiny(), o));
}

// An engine with `gpu_blocks` of KV and a host tier of `host_blocks`.
std::unique_ptr<Engine> MakeTieredEngine(int64_t gpu_blocks, int64_t host_blocks) {
  return MakeEngine(gpu_blocks, cpu::DebugFault::kNone, 2048, true, host_blocks);
}

// A request of one chunk of `len` random tokens.
Request OneChunk(std::mt19937& rng, int len, int max_tokens) {
  return OneChunkRequest(rng, static_cast<int>(Tiny().config().vocab_size), len, max_tokens);
}

Request Prefix(const Request& r, size_t chunks) {
  Request p = r;
  p.chunks.resize(chunks);
  p.sampling.max_tokens = 1;
  return p;
}

bool Same(const Result& a, const Result& b) { return a.tokens == b.tokens && a.logits == b.logits; }

TEST(EngineCpuTest, CachedEqualsColdBitwiseForRandomChunkedPrompts) {
  std::mt19937 rng(21);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  for (int trial = 0; trial < 6; ++trial) {
    Request req = RandomRequest(rng, vocab, 2 + trial % 3, 37, 4);
    if (trial % 2) {
      req.sampling.temperature = 0.8f;
      req.sampling.seed = 500 + trial;
    }
    auto cold_engine = MakeEngine(128);
    Result cold = RunOne(*cold_engine, req);
    ASSERT_EQ(cold.logits.size(), 4u);
    for (size_t k = 1; k <= req.chunks.size(); ++k) {
      auto warm = MakeEngine(128);
      RunOne(*warm, Prefix(req, k));
      Result hot = RunOne(*warm, req);
      EXPECT_EQ(hot.tokens, cold.tokens) << "trial " << trial << " k " << k;
      EXPECT_TRUE(hot.logits == cold.logits) << "logits not bitwise equal, trial " << trial;
      int64_t prefix_len = 0;
      for (size_t c = 0; c < k; ++c) prefix_len += req.chunks[c].tokens.size();
      EXPECT_EQ(hot.cached_tokens,
                std::min(prefix_len / kBlock, (cold.prompt_tokens - 1) / kBlock) * kBlock);
    }
  }
}

TEST(EngineCpuTest, BatchMixingCachedAndColdSequencesIsBitwiseEqualToEachAlone) {
  std::mt19937 rng(22);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  Request shared = RandomRequest(rng, vocab, 1, 60, 1);
  shared.chunks[0].tokens.resize(48, 3);  // three full blocks to share
  std::vector<Request> reqs;
  for (int i = 0; i < 5; ++i) {
    Request r = RandomRequest(rng, vocab, 2, 25, 3);
    if (i % 2 == 0) r.chunks.insert(r.chunks.begin(), shared.chunks[0]);
    reqs.push_back(r);
  }
  std::vector<Result> alone;
  for (const Request& r : reqs) {
    auto e = MakeEngine(128);
    alone.push_back(RunOne(*e, r));
  }
  auto e = MakeEngine(128);
  RunOne(*e, Prefix(reqs[0], 1));
  std::vector<Result> together = RunAll(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(Same(alone[i], together[i])) << "request " << i;
  }
  EXPECT_GT(together[0].cached_tokens, 0);
}

TEST(EngineCpuTest, PreemptionAndEvictionDoNotChangeOutput) {
  std::mt19937 rng(23);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(RandomRequest(rng, vocab, 2, 20, 12));
  std::vector<Result> alone;
  for (const Request& r : reqs) {
    auto e = MakeEngine(64);
    alone.push_back(RunOne(*e, r));
  }
  auto small = MakeEngine(8);  // 128 tokens for six sequences of up to 52: preempts and evicts
  std::vector<Result> together = RunAll(*small, reqs);
  EXPECT_GT(small->Stats().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_TRUE(Same(alone[i], together[i])) << i;
}

// The host tier's acceptance test: a prefix the GPU tier evicted (to the host) and restored
// gives logits bitwise equal to cold. Without the host tier the same run recomputes it.
TEST(EngineCpuTest, PrefixEvictedToHostAndRestoredGivesBitwiseColdLogits) {
  std::mt19937 rng(31);
  const Request a = OneChunk(rng, 100, 4), b = OneChunk(rng, 252, 4);
  auto cold_engine = MakeEngine(64);
  const Result cold = RunOne(*cold_engine, a);

  for (bool host_on : {false, true}) {
    auto e = MakeTieredEngine(16, host_on ? 64 : 0);  // b takes all 16 blocks: a goes
    EXPECT_TRUE(Same(RunOne(*e, a), cold));
    RunOne(*e, b);
    const Result again = RunOne(*e, a);
    EXPECT_TRUE(Same(again, cold)) << "host tier " << host_on;
    const EngineStats st = e->Stats();
    if (host_on) {
      EXPECT_EQ(again.cached_tokens, 96);
      EXPECT_EQ(st.prefix_cache_hits_host, 96);
      EXPECT_GE(st.host_restored_blocks, 6);
      EXPECT_GE(st.host_offloaded_blocks, 6);
    } else {
      EXPECT_EQ(again.cached_tokens, 0);  // the scenario does evict a
      EXPECT_EQ(st.host_total_blocks, 0);
    }
  }
}

// Six prefixes over 16 GPU blocks and 20 host blocks, run concurrently (preemption), then again
// with new queries: restores happen while allocations offload other blocks and the host tier
// evicts; every output equals that of an engine with room for all, and afterwards no block is
// held.
TEST(EngineCpuTest, HostTierUnderMemoryPressureKeepsOutputsAndLeaksNoBlocks) {
  std::mt19937 rng(32);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  std::vector<Request> first, second;
  for (int i = 0; i < 6; ++i) {
    Request r = OneChunk(rng, 64, 20);
    ChunkInput q;
    q.kind = 3;
    for (int t = 0; t < 12; ++t) q.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    r.chunks.push_back(q);
    first.push_back(r);
    for (auto& t : r.chunks[1].tokens) t = static_cast<int32_t>(rng() % vocab);
    second.push_back(r);
  }
  // The reference: an engine whose GPU KV holds everything (its cached runs equal cold ones,
  // CachedEqualsColdBitwiseForRandomChunkedPrompts).
  auto roomy = MakeEngine(128);
  std::vector<Result> cold = RunAll(*roomy, first);
  std::vector<Result> cold2 = RunAll(*roomy, second);
  cold.insert(cold.end(), cold2.begin(), cold2.end());
  EXPECT_EQ(roomy->Stats().preemptions, 0);
  auto e = MakeTieredEngine(16, 20);
  std::vector<Result> got = RunAll(*e, first);
  std::vector<Result> got2 = RunAll(*e, second);
  got.insert(got.end(), got2.begin(), got2.end());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(Same(got[i], cold[i])) << "request " << i;
  const EngineStats st = e->Stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.host_restored_blocks, 0);
  EXPECT_GT(st.host_evicted_blocks, 0);
  EXPECT_GT(st.prefix_cache_hits_host, 0);
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.free_blocks, st.total_blocks);
  EXPECT_LE(st.host_used_blocks, st.host_total_blocks);
  EXPECT_EQ(st.host_copy_failures, 0);
}

TEST(EngineCpuTest, HostTierSmallerThanOneBlockIsRefusedWithAReason) {
  cpu::CpuBackendOptions o;
  o.num_blocks = 8;
  o.block_size = kBlock;
  EngineOptions eo;
  eo.model_name = "tiny";
  eo.host_kv_bytes = 100;
  auto e = NewEngine(eo, cpu::NewCpuBackend(Tiny(), o));
  EXPECT_EQ(e->HostTierStatus().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e->HostTierStatus().message().find("less than one KV block"), std::string::npos);
  EXPECT_EQ(e->Stats().host_total_blocks, 0);
}

// Root causes 1 and 3: the same comparison with the fix removed from the backend must fail.
class RootCauseTest : public ::testing::TestWithParam<cpu::DebugFault> {};

TEST_P(RootCauseTest, CachedRunDivergesFromColdWhenTheFixIsRemoved) {
  std::mt19937 rng(24);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  Request req = RandomRequest(rng, vocab, 3, 30, 3);
  req.chunks[0].tokens.resize(40, 7);  // at least two full cached blocks
  auto good = MakeEngine(64);
  Result cold = RunOne(*good, req);
  auto faulty = MakeEngine(64, GetParam());
  RunOne(*faulty, Prefix(req, 1));
  Result hot = RunOne(*faulty, req);
  ASSERT_GT(hot.cached_tokens, 0);
  EXPECT_FALSE(hot.logits == cold.logits) << "the injected bug went unnoticed";
}

INSTANTIATE_TEST_SUITE_P(Faults, RootCauseTest,
                         ::testing::Values(cpu::DebugFault::kLocalPositions,
                                           cpu::DebugFault::kNoCausalOffset));

// Rows the backend samples (ForwardSampled: every option, with the scheduler's penalty tokens)
// get the tokens and logprobs the host sampler draws from the whole logits: one rule, whichever
// side applies it.
TEST(EngineCpuTest, BackendSampledRowsGiveTheHostSamplersTokens) {
  std::mt19937 rng(26);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r = RandomRequest(rng, vocab, 2, 20, 6);
    if (i % 2) {
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 70 + i;
    }
    if (i % 4 == 1) r.sampling.top_k = 30, r.sampling.top_p = 0.8f;
    if (i % 4 == 3) r.sampling.min_p = 0.1f;
    if (i >= 4) r.sampling.repetition_penalty = 1.4f, r.sampling.logprobs = 3;
    if (i == 2) r.sampling.frequency_penalty = 0.9f, r.sampling.max_tokens = 14;
    if (i == 5) r.sampling.frequency_penalty = 0.7f, r.sampling.presence_penalty = 0.5f;
    if (i == 6) r.sampling.repetition_penalty = 1.0f, r.sampling.frequency_penalty = -1.2f;
    if (i == 7) r.sampling.repetition_penalty = 1.0f, r.sampling.presence_penalty = 1.6f;
    // A logit bias alone (greedy, then with min-p) and with the penalties.
    if (i == 0 || i == 3 || i == 5 || i == 6)
      r.sampling.logit_bias = RandomLogitBias(rng, vocab, r, 6);
    reqs.push_back(r);
  }
  auto host = MakeEngine(64);
  auto backend = MakeEngine(64, cpu::DebugFault::kNone, 2048, /*capture_logits=*/false);
  std::vector<Result> want = RunAll(*host, reqs);
  std::vector<Result> got = RunAll(*backend, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(want[i].tokens, got[i].tokens) << "request " << i;
    EXPECT_TRUE(got[i].logits.empty());
    ASSERT_EQ(want[i].logprobs.size(), got[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_EQ(want[i].logprobs[t].sampled.logprob, got[i].logprobs[t].sampled.logprob);
      ASSERT_EQ(want[i].logprobs[t].top.size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(want[i].logprobs[t].top[j].token_id, got[i].logprobs[t].top[j].token_id);
        EXPECT_EQ(want[i].logprobs[t].top[j].logprob, got[i].logprobs[t].top[j].logprob);
      }
    }
  }
}

// Prompt logprobs (vLLM's prompt_logprobs, OpenAI's echo with logprobs): entry p scores prompt
// token p + 1 with the logits a cold request of the prompt's first p + 1 tokens samples from,
// bitwise, and with sample_rule.h's step 5 (RowLogprobsOf) and vLLM's rank (TokenRank), whether
// the backend scores them (score rows) or the engine does from whole rows (capture); whatever the
// chunking (a few rows a step), the schedule (overlapped or not), and whether the prompt is
// cached already (its rows are computed, never read from the cache). The generated tokens do
// not change.
TEST(EngineCpuTest, PromptLogprobsScoreEveryPromptTokenWithItsColdLogits) {
  std::mt19937 rng(31);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  Request req;
  int32_t kind = 1;  // SYSTEM, CONTEXT, QUERY: 13 + 21 + 9 tokens, boundaries mid-block
  for (int len : {13, 21, 9}) {
    ChunkInput c;
    c.kind = kind++;
    for (int i = 0; i < len; ++i) c.tokens.push_back(tok(rng));
    req.chunks.push_back(c);
  }
  req.sampling.max_tokens = 5;
  req.sampling.temperature = 0.7f;
  req.sampling.seed = 9;
  std::vector<int32_t> prompt;
  for (const ChunkInput& c : req.chunks)
    prompt.insert(prompt.end(), c.tokens.begin(), c.tokens.end());
  // The reference: each prefix's last row, captured (one batch of requests).
  std::vector<Request> prefixes;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    Request r;
    r.chunks.push_back({3, std::vector<int32_t>(prompt.begin(), prompt.begin() + p + 1), ""});
    r.sampling.max_tokens = 1;
    prefixes.push_back(r);
  }
  auto ref_engine = MakeEngine(256);
  const std::vector<Result> ref = RunAll(*ref_engine, prefixes);
  const Result plain = RunOne(*MakeEngine(64), req);
  constexpr int kTop = 4;
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(absl::StrCat("variant ", variant));
    auto engine = EngineWith([&](EngineOptions* eo) {
      eo->eos_token_ids = Tiny().config().eos_token_ids;
      eo->max_prompt_logprob_rows = variant == 0 ? 256 : 7;  // 7: a row cap inside blocks
      eo->max_num_batched_tokens = variant == 3 ? 24 : 2048;
      eo->overlap_schedule = variant == 2;
      eo->debug_capture_logits = variant == 1;
    });
    if (variant >= 2) RunOne(*engine, req);  // the prompt's blocks cached first
    Request with = req;
    with.sampling.prompt_logprobs = kTop;
    const Result got = RunOne(*engine, with);
    EXPECT_EQ(got.tokens, plain.tokens);
    EXPECT_EQ(got.cached_tokens, 0);
    ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
    for (size_t p = 0; p + 1 < prompt.size(); ++p) {
      ASSERT_EQ(ref[p].logits.size(), 1u);
      RowLogprobs want;
      RowLogprobsOf(ref[p].logits[0].data(), vocab, prompt[p + 1], kTop, &want);
      const LogprobEntry& e = got.prompt_logprobs[p];
      EXPECT_EQ(e.sampled.token_id, prompt[p + 1]) << "position " << p;
      EXPECT_EQ(e.sampled.logprob, want.sampled) << "position " << p;
      EXPECT_EQ(e.rank, TokenRank(ref[p].logits[0].data(), vocab, prompt[p + 1]))
          << "position " << p;
      ASSERT_EQ(e.top.size(), static_cast<size_t>(kTop));
      for (int j = 0; j < kTop; ++j) {
        EXPECT_EQ(e.top[j].token_id, want.top_ids[j]) << "position " << p;
        EXPECT_EQ(e.top[j].logprob, want.top[j]) << "position " << p;
      }
    }
  }
  // 0 asks for the prompt token's logprob alone; without the option there are none.
  Request zero = req;
  zero.sampling.prompt_logprobs = 0;
  const Result z = RunOne(*MakeEngine(64), zero);
  ASSERT_EQ(z.prompt_logprobs.size(), prompt.size() - 1);
  EXPECT_TRUE(z.prompt_logprobs[3].top.empty());
  EXPECT_TRUE(plain.prompt_logprobs.empty());
  Request bad = req;
  bad.sampling.prompt_logprobs = 21;
  EXPECT_FALSE(MakeEngine(64)->AddRequest(bad).ok());
}

// OpenAI's logit_bias end to end: -100 on the token a greedy request generates first bans it,
// +100 on a token makes every generated token that one (no penalty); both on the host sampler
// and on backend-sampled rows, alike.
TEST(EngineCpuTest, LogitBiasBansAndForcesTokens) {
  std::mt19937 rng(77);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  const Request plain = RandomRequest(rng, vocab, 2, 20, 6);
  for (const bool capture : {true, false}) {
    auto engine = MakeEngine(64, cpu::DebugFault::kNone, 2048, capture);
    const Result base = RunOne(*engine, plain);
    ASSERT_EQ(base.tokens.size(), 6u);
    Request banned = plain;
    banned.sampling.logit_bias = {{base.tokens[0], -100.0f}};
    const Result b = RunOne(*engine, banned);
    ASSERT_FALSE(b.tokens.empty());
    EXPECT_NE(b.tokens[0], base.tokens[0]) << "capture " << capture;
    for (int32_t t : b.tokens) EXPECT_NE(t, base.tokens[0]);
    Request forced = plain;
    const int32_t want = (base.tokens[0] + 17) % vocab;
    forced.sampling.logit_bias = {{want, 100.0f}};
    const Result f = RunOne(*engine, forced);
    EXPECT_EQ(f.tokens, std::vector<int32_t>(6, want)) << "capture " << capture;
  }
}

// vLLM's min_tokens: a request whose stop id is the token it would generate at index k ends
// there without min_tokens; with min_tokens k + 3 none of its first k + 3 tokens is that id (a
// -inf logit bias on it while they are sampled: each is the greedy argmax of its logits without
// the banned id), the first k are the plain run's, and it may end on the stop id only after.
// With min_tokens = max_tokens and the model's EOS ids live (ignore_eos off), every token is
// neither. The host sampler, backend-sampled rows and the overlapped schedule agree.
TEST(EngineCpuTest, MinTokensHoldsOffStopTokens) {
  std::mt19937 rng(91);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  const std::vector<int32_t>& eos = Tiny().config().eos_token_ids;
  Request plain = RandomRequest(rng, vocab, 2, 20, 12);
  auto ref = MakeEngine(64);
  const Result base = RunOne(*ref, plain);
  ASSERT_EQ(base.tokens.size(), 12u);
  // The stop id: the first token after the first that was not generated before it, else the
  // first (a tiny model's greedy run may repeat one token).
  size_t k = 1;
  while (k < 8 && std::find(base.tokens.begin(), base.tokens.begin() + static_cast<long>(k),
                            base.tokens[k]) != base.tokens.begin() + static_cast<long>(k)) {
    ++k;
  }
  if (k == 8) k = 0;
  const int32_t stop = base.tokens[k];
  Request stopped = plain;
  stopped.sampling.stop_token_ids = {stop};
  const Result cut = RunOne(*ref, stopped);
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.tokens,
            std::vector<int32_t>(base.tokens.begin(), base.tokens.begin() + static_cast<long>(k)));

  Request held = stopped;
  const int m = static_cast<int>(k) + 3;
  held.sampling.min_tokens = m;
  Request all = plain;  // EOS live, every token under the ban
  all.sampling.ignore_eos = false;
  all.sampling.stop_token_ids = {stop};
  all.sampling.min_tokens = all.sampling.max_tokens;
  std::vector<std::vector<Result>> runs;
  for (int variant = 0; variant < 3; ++variant) {
    auto e = MakeEngine(64, cpu::DebugFault::kNone, 2048, /*capture_logits=*/variant == 0, 0,
                        /*overlap=*/variant == 2);
    runs.push_back(RunAll(*e, {held, all}));
  }
  const Result& h = runs[0][0];
  ASSERT_GE(h.tokens.size(), static_cast<size_t>(m));
  ASSERT_GE(h.logits.size(), static_cast<size_t>(m));
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    if (i < k) {
      EXPECT_EQ(h.tokens[i], base.tokens[i]) << "token " << i;
    }
    if (i >= static_cast<size_t>(m)) continue;
    EXPECT_NE(h.tokens[i], stop) << "token " << i;
    std::vector<float> row = h.logits[i];
    row[static_cast<size_t>(stop)] = -INFINITY;
    const auto best = std::max_element(row.begin(), row.end());  // first of the largest
    EXPECT_EQ(h.tokens[i], static_cast<int32_t>(best - row.begin())) << "token " << i;
  }
  if (h.finish == FinishReason::kStop) {
    EXPECT_EQ(h.stop_token_id, stop);
  } else {
    EXPECT_EQ(h.finish, FinishReason::kLength);
    EXPECT_EQ(h.tokens.size(), 12u);
  }
  const Result& a = runs[0][1];
  EXPECT_EQ(a.finish, FinishReason::kLength);
  ASSERT_EQ(a.tokens.size(), 12u);
  for (int32_t t : a.tokens) {
    EXPECT_NE(t, stop);
    EXPECT_EQ(std::find(eos.begin(), eos.end(), t), eos.end()) << "EOS id " << t;
  }
  for (int variant = 1; variant < 3; ++variant) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(runs[variant][r].tokens, runs[0][r].tokens)
          << "variant " << variant << " request " << r;
      EXPECT_EQ(runs[variant][r].finish, runs[0][r].finish)
          << "variant " << variant << " request " << r;
    }
  }
  // min_tokens above max_tokens is refused.
  Request bad = plain;
  bad.sampling.min_tokens = 13;
  EXPECT_EQ(ref->AddRequest(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A stream resumed elsewhere after k tokens (the gateway sends the prompt plus those tokens, with
// resumed_tokens = k) continues with exactly the unbroken stream's tokens under the frequency and
// presence penalties, which count those k tokens as generated; and counting them as prompt
// instead (resumed_tokens = 0) would change the stream, so the field is what keeps it exact.
TEST(EngineCpuTest, ResumedStreamWithPenaltiesContinuesTheUnbrokenOne) {
  std::mt19937 rng(52);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  int differs = 0;
  for (int trial = 1; trial < 4; ++trial) {
    Request r = RandomRequest(rng, vocab, 2, 20, 16);
    SamplingParams& sp = r.sampling;
    sp.temperature = trial % 2 ? 0.0f : 0.8f;
    sp.seed = 90 + trial;
    sp.frequency_penalty = trial < 2 ? 1.5f : -0.7f;
    sp.presence_penalty = trial % 3 ? 0.9f : 0.0f;
    sp.repetition_penalty = trial == 3 ? 1.2f : 1.0f;
    for (bool backend_sampled : {false, true}) {
      auto e = MakeEngine(64, cpu::DebugFault::kNone, 2048, /*capture_logits=*/!backend_sampled);
      const Result whole = RunOne(*e, r);
      ASSERT_EQ(whole.tokens.size(), 16u);
      for (int k : {1, 3, 11}) {
        Request resumed = r;
        resumed.chunks.push_back(
            ChunkInput{6, {whole.tokens.begin(), whole.tokens.begin() + k}, ""});
        resumed.resumed_tokens = k;
        resumed.sampling.max_tokens = 16 - k;
        const std::vector<int32_t> rest(whole.tokens.begin() + k, whole.tokens.end());
        EXPECT_EQ(RunOne(*e, resumed).tokens, rest)
            << "trial " << trial << ", resumed after " << k << ", backend " << backend_sampled;
        resumed.resumed_tokens = 0;
        differs += RunOne(*e, resumed).tokens != rest;
      }
    }
  }
  EXPECT_GT(differs, 0) << "the penalties never depended on what was generated";
  // resumed_tokens must leave at least one prompt token.
  Request bad = OneChunk(rng, 5, 2);
  auto e = MakeEngine(64);
  for (int64_t n : {int64_t{-1}, int64_t{5}}) {
    bad.resumed_tokens = n;
    auto id = e->AddRequest(bad);
    ASSERT_FALSE(id.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(id.status()));
    EXPECT_NE(id.status().message().find("resumed_tokens"), std::string::npos) << id.status();
  }
}

// Requests that share a new prefix, added together, prefill it once: the second waits while the
// first computes the prefix's blocks and then starts with them cached, plain and overlapped, in
// one step or in chunks; each still gives exactly its tokens and logits alone. With the wait
// turned off both compute the prefix (the comparison the test would fail without the wait).
TEST(EngineCpuTest, RequestsSharingANewPrefixPrefillItOnce) {
  std::mt19937 rng(61);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  const Request shared = OneChunk(rng, 70, 1);  // 4 full blocks
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) {
    Request r = RandomRequest(rng, vocab, 1, 12, 4);
    r.chunks.insert(r.chunks.begin(), shared.chunks[0]);
    reqs.push_back(std::move(r));
  }
  for (const bool overlap : {false, true}) {
    for (const int chunk : {2048, 24}) {
      auto e = MakeEngine(64, cpu::DebugFault::kNone, chunk, true, 0, overlap);
      const std::vector<Result> got = RunAll(*e, reqs);
      EXPECT_EQ(got[0].cached_tokens, 0);
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (i > 0) {
          EXPECT_EQ(got[i].cached_tokens, 64)
              << "request " << i << ", overlap " << overlap << ", chunk " << chunk;
        }
        EXPECT_TRUE(Same(got[i], RunOne(*MakeEngine(64), reqs[i]))) << "request " << i;
      }
    }
  }
  // One waiting for the prefix keeps its place, but the queue does not wait with it: a request
  // on another prompt added after it starts in the first step.
  {
    auto e = MakeEngine(64);
    Request other = RandomRequest(rng, vocab, 1, 12, 4);
    std::vector<uint64_t> ids;
    for (const Request* r : {&reqs[0], &reqs[1], &other}) {
      auto id = e->AddRequest(*r);
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    std::set<uint64_t> started;
    for (const SequenceOutput& o : *outs) {
      if (o.started) started.insert(o.seq_id);
    }
    EXPECT_EQ(started, (std::set<uint64_t>{ids[0], ids[2]}));
  }
  // Off: admitted together, each computes the prefix.
  auto off = EngineWith([](EngineOptions* eo) { eo->max_prefix_waits = 0; });
  const std::vector<Result> got = RunAll(*off, reqs);
  for (const Result& r : got) EXPECT_EQ(r.cached_tokens, 0);
}

TEST(EngineCpuTest, ChunkedPrefillGivesTheSameLogitsAsOneShot) {
  std::mt19937 rng(25);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  Request req = RandomRequest(rng, vocab, 3, 40, 3);
  auto a = MakeEngine(64);
  auto b = MakeEngine(64, cpu::DebugFault::kNone, /*max_batched_tokens=*/7);
  EXPECT_TRUE(Same(RunOne(*a, req), RunOne(*b, req)));
}

// What each request saw in `b` and in `c` is what it saw in `a` (host_blocks and c_label name the
// run in failures); returns how many of them ended on a stop token.
int ExpectSameSeen(const std::vector<Seen>& a, const std::vector<Seen>& b,
                   const std::vector<Seen>& c, int64_t host_blocks, const char* c_label) {
  int stops = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i] == b[i]) << "host blocks " << host_blocks << ", request " << i << ": "
                              << a[i].tokens.size() << " vs " << b[i].tokens.size()
                              << " tokens, finish " << FinishReasonName(a[i].finish) << " vs "
                              << FinishReasonName(b[i].finish);
    EXPECT_TRUE(a[i] == c[i]) << "host blocks " << host_blocks << ", request " << i << " ("
                              << c_label << "): " << a[i].tokens.size() << " vs "
                              << c[i].tokens.size() << " tokens";
    stops += a[i].finish == FinishReason::kStop;
  }
  return stops;
}

// The overlapped schedule (step n+1 scheduled and built while step n runs) shows every request
// the same tokens, logprobs and finish as the plain engine: sequences added mid-run, stop tokens
// that end a sequence the next step was already scheduled for, a cancel, preemption and
// eviction in a KV cache too small for the batch, shared prefixes, with and without the host
// tier. Every option is sampled by the backend (ForwardSampled), as in production. So does an
// engine that overlaps only after steps of 4 or more sequences (EngineOptions::overlap_min_rows),
// switching between the two schedules as the batch grows and shrinks.
TEST(EngineCpuTest, OverlappedScheduleGivesThePlainEnginesOutputs) {
  std::mt19937 rng(41);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  const Request shared = OneChunk(rng, 40, 1);
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r = RandomRequest(rng, vocab, 2, 24, 9 + i % 5);
    if (i % 3 == 0) r.chunks.insert(r.chunks.begin(), shared.chunks[0]);  // a shared prefix
    SamplingParams& sp = r.sampling;
    sp.seed = 1000 + i;
    if (i % 2 == 1) sp.temperature = 0.9f;
    if (i % 4 == 1) sp.top_k = 20, sp.repetition_penalty = 1.3f;
    if (i == 5) sp.frequency_penalty = 0.6f, sp.presence_penalty = 0.3f;
    if (i == 8) sp.frequency_penalty = -0.5f;
    if (i == 9) sp.repetition_penalty = 1.0f, sp.presence_penalty = 1.1f;
    if (i % 4 == 3) sp.top_p = 0.8f, sp.logprobs = 3;
    if (i == 6) sp.min_p = 0.1f, sp.temperature = 1.0f;
    if (i == 2 || i == 5 || i == 9) sp.logit_bias = RandomLogitBias(rng, vocab, r, 5);
    reqs.push_back(std::move(r));
  }
  // Stop tokens that fire: requests 2, 5 and 7 stop at the token a first run gave them at
  // index 3 (or earlier, where it came before).
  ASSERT_NO_FATAL_FAILURE(StopAtFourthToken(
      *MakeEngine(256, cpu::DebugFault::kNone, 2048, /*capture_logits=*/false), reqs, {2, 5, 7}));
  for (const int64_t host_blocks : {int64_t{0}, int64_t{32}}) {
    // 10 blocks of 16 tokens for up to ten sequences of up to 75: preempts and evicts.
    auto plain = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, false);
    auto overlap = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, true);
    auto switching = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, true, 0,
                                /*overlap_min_rows=*/4);
    const std::vector<Seen> a = RunScripted(*plain, reqs);
    const int stops = ExpectSameSeen(a, RunScripted(*overlap, reqs), RunScripted(*switching, reqs),
                                     host_blocks, "overlap from 4 rows");
    EXPECT_EQ(plain->Stats().overlapped_steps, 0);
    EXPECT_GT(overlap->Stats().overlapped_steps, 0);
    // Both schedules ran in the switching engine.
    EXPECT_GT(switching->Stats().overlapped_steps, 0);
    EXPECT_LT(switching->Stats().overlapped_steps, overlap->Stats().overlapped_steps);
    EXPECT_FALSE(switching->HasWork());
    EXPECT_EQ(switching->Stats().free_blocks, plain->Stats().free_blocks);
    EXPECT_EQ(stops, 3);
    EXPECT_EQ(a[1].finish, FinishReason::kCancelled);
    EXPECT_EQ(a[1].tokens.size(), 4u);
    EXPECT_GT(plain->Stats().preemptions, 0);
    EXPECT_GT(overlap->Stats().preemptions, 0);
    EXPECT_FALSE(overlap->HasWork());
    EXPECT_EQ(overlap->Stats().free_blocks, plain->Stats().free_blocks);
  }
}

// Speculated steps (Backend::PrepareSampled: the backend starts the overlapped schedule's next
// step before the one in flight is collected, its inputs fed from that step's samples; the CPU
// backend's synchronous form) show every request what the plain engine shows: stop tokens that
// end a sequence whose row the started step still carries (dropped, its retirement deferred),
// a cancel, sequences added mid-run, preemption and eviction in a KV cache too small, shared
// prefixes, the host tier. Greedy, temperature, top-k / top-p / min-p and logprobs rows
// speculate; penalized ones (their lists need the fed tokens on the host) do not, and a batch
// with one goes the old way.
TEST(EngineCpuTest, SpeculatedStepsGiveThePlainEnginesOutputs) {
  std::mt19937 rng(43);
  const int vocab = static_cast<int>(Tiny().config().vocab_size);
  const Request shared = OneChunk(rng, 40, 1);
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r = RandomRequest(rng, vocab, 2, 24, 9 + i % 5);
    if (i % 3 == 0) r.chunks.insert(r.chunks.begin(), shared.chunks[0]);
    SamplingParams& sp = r.sampling;
    sp.seed = 2000 + i;
    if (i % 2 == 1) sp.temperature = 0.9f;
    if (i % 4 == 1) sp.top_k = 20;
    if (i % 4 == 3) sp.top_p = 0.8f, sp.logprobs = 3;
    if (i == 6) sp.min_p = 0.1f, sp.temperature = 1.0f;
    if (i == 0) sp.repetition_penalty = 1.3f;  // its steps go unspeculated while it runs
    reqs.push_back(std::move(r));
  }
  ASSERT_NO_FATAL_FAILURE(StopAtFourthToken(
      *MakeEngine(256, cpu::DebugFault::kNone, 2048, /*capture_logits=*/false), reqs, {2, 4, 7}));
  for (const int64_t host_blocks : {int64_t{0}, int64_t{32}}) {
    auto plain = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, false);
    auto spec = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, true, 0, 0,
                           /*speculative=*/true);
    // Overlapped (and so speculated) only after steps of 2 or more sequences (this KV cache holds
    // at most 3 at a time).
    auto switching = MakeEngine(10, cpu::DebugFault::kNone, 64, false, host_blocks, true, 0, 2,
                                /*speculative=*/true);
    const std::vector<Seen> a = RunScripted(*plain, reqs);
    const int stops = ExpectSameSeen(a, RunScripted(*spec, reqs), RunScripted(*switching, reqs),
                                     host_blocks, "overlap from 2 rows");
    EXPECT_GT(switching->Stats().speculated_steps, 0);
    EXPECT_LT(switching->Stats().speculated_steps, spec->Stats().speculated_steps);
    EXPECT_FALSE(switching->HasWork());
    EXPECT_EQ(switching->Stats().free_blocks, plain->Stats().free_blocks);
    const EngineStats st = spec->Stats();
    std::printf(
        "host blocks %lld: %lld steps, %lld overlapped, %lld speculated, %lld rows dropped\n",
        static_cast<long long>(host_blocks), static_cast<long long>(st.steps),
        static_cast<long long>(st.overlapped_steps), static_cast<long long>(st.speculated_steps),
        static_cast<long long>(st.speculated_rows_dropped));
    EXPECT_GT(st.speculated_steps, 0);
    EXPECT_GT(st.speculated_rows_dropped, 0) << "no speculated row was dropped";
    EXPECT_LT(st.speculated_steps, st.overlapped_steps) << "the penalized request's steps";
    EXPECT_EQ(plain->Stats().speculated_steps, 0);
    EXPECT_EQ(stops, 3);
    EXPECT_EQ(a[1].finish, FinishReason::kCancelled);
    EXPECT_FALSE(spec->HasWork());
    EXPECT_EQ(st.free_blocks, plain->Stats().free_blocks);
    EXPECT_EQ(st.running, 0);
  }
}

// Peer fetch at the engine: the blocks one engine exports (from its GPU tier, and again from its
// host tier after they were evicted there: the same bytes) and another imports give that engine
// the cold run's logits bit for bit, also when the import spans steps; a flipped byte in an
// imported block changes the logits, so the comparison does see the fetched bytes.
std::vector<ExportedBlock> ExportAll(Engine& e, const std::vector<hash::Hash128>& keys,
                                     int64_t max_bytes) {
  std::vector<ExportedBlock> got;
  while (got.size() < keys.size()) {
    bool answered = false;
    int64_t held = 0;
    e.ExportBlocks({keys.begin() + got.size(), keys.end()}, max_bytes, [&](ExportBatch b) {
      EXPECT_TRUE(b.status.ok()) << b.status;
      held = b.held;
      for (auto& x : b.blocks) got.push_back(std::move(x));
      answered = true;
    });
    EXPECT_TRUE(e.HasWork());
    EXPECT_TRUE(e.Step().ok());
    EXPECT_TRUE(answered);
    if (!answered || held == 0) break;
  }
  return got;
}

std::vector<PeerBlock> AsPeerBlocks(const std::vector<ExportedBlock>& blocks) {
  std::vector<PeerBlock> out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    out.push_back({blocks[i].key, i == 0 ? hash::Hash128{} : blocks[i - 1].key, blocks[i].bytes});
  }
  return out;
}

TEST(EngineCpuTest, PeerExportedBlocksImportedElsewhereGiveBitwiseColdLogits) {
  std::mt19937 rng(33);
  const Request a = OneChunk(rng, 100, 4), b = OneChunk(rng, 252, 4);
  const std::vector<hash::Hash128> keys =
      hash::BlockKeys("tiny", "", hash::SpecsOf(a.chunks), kBlock);
  ASSERT_EQ(keys.size(), 6u);
  auto holder = MakeTieredEngine(16, 64);
  const Result cold = RunOne(*holder, a);
  const int64_t block_bytes = holder->backend().KvBlockBytes();
  const std::vector<ExportedBlock> from_gpu = ExportAll(*holder, keys, 2 * block_bytes);
  RunOne(*holder, b);  // takes every GPU block: a's go to the host tier
  const std::vector<ExportedBlock> from_host = ExportAll(*holder, keys, 4 * block_bytes);
  ASSERT_EQ(from_gpu.size(), 6u);
  ASSERT_EQ(from_host.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(from_gpu[i].key, keys[i]);
    EXPECT_EQ(from_gpu[i].bytes, from_host[i].bytes) << "block " << i;
  }
  EXPECT_EQ(holder->Stats().peer_exported_blocks, 12);
  EXPECT_EQ(holder->Stats().used_blocks, 0);  // exports hold nothing

  for (int64_t per_step : {int64_t{1} << 30, block_bytes}) {
    auto e = MakeEngine(64, cpu::DebugFault::kNone, 2048, true, 64, /*overlap=*/false, per_step);
    Request r = a;
    r.peer_blocks = AsPeerBlocks(from_host);
    const Result got = RunOne(*e, r);
    EXPECT_TRUE(Same(got, cold)) << "import budget " << per_step;
    EXPECT_EQ(got.cached_tokens, 96);
    EXPECT_EQ(e->Stats().peer_imported_blocks, 6);
    EXPECT_EQ(e->Stats().prefix_cache_hits_host, 96);
    EXPECT_EQ(e->Stats().prompt_tokens_computed, 4);
  }
  {
    auto e = MakeTieredEngine(64, 64);
    Request r = a;
    r.peer_blocks = AsPeerBlocks(from_gpu);
    r.peer_blocks[5].bytes[r.peer_blocks[5].bytes.size() / 2] ^= 0x40;
    const Result got = RunOne(*e, r);
    EXPECT_EQ(got.cached_tokens, 96);
    EXPECT_NE(got.logits, cold.logits) << "a corrupt imported block went unseen";
  }
}

// A holder that lacks part of the chain exports only the leading run it holds.
TEST(EngineCpuTest, ExportStopsAtTheFirstBlockNotHeld) {
  std::mt19937 rng(34);
  const Request a = OneChunk(rng, 100, 1);
  std::vector<hash::Hash128> keys = hash::BlockKeys("tiny", "", hash::SpecsOf(a.chunks), kBlock);
  auto holder = MakeTieredEngine(64, 0);
  RunOne(*holder, a);
  keys[3].lo ^= 1;
  EXPECT_EQ(ExportAll(*holder, keys, int64_t{1} << 30).size(), 3u);
  keys[0].lo ^= 1;
  EXPECT_TRUE(ExportAll(*holder, keys, int64_t{1} << 30).empty());
}

}  // namespace
}  // namespace cascade::engine::testing
