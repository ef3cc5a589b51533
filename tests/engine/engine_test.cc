// The engine over the trace backend: cached == cold for chunked prompts (all, some or no chunks
// cached, chunks ending mid-block, mixed batches), eviction and preemption never change output,
// cancellation frees blocks, residency events, pins, stop conditions, and input validation.
#include "gpu_worker/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/trace_backend.h"

namespace cascade::engine::testing {
namespace {

constexpr int kVocab = 97;
constexpr int kBlock = 8;

// `trace`, if set, receives the engine's backend (for fault injection and its counters).
std::unique_ptr<Engine> MakeEngine(int64_t blocks, EngineOptions opts = {},
                                   TraceBackend** trace = nullptr) {
  opts.model_name = "trace";
  opts.debug_capture_logits = true;
  if (opts.max_context == 4096) opts.max_context = 100000;
  auto backend = std::make_unique<TraceBackend>(blocks, kBlock, kVocab);
  if (trace != nullptr) *trace = backend.get();
  return NewEngine(opts, std::move(backend));
}

// Each request run alone on a fresh engine with room for it: the cold reference.
std::vector<Result> EachCold(const std::vector<Request>& reqs) {
  std::vector<Result> cold;
  for (const Request& r : reqs) {
    auto fresh = MakeEngine(64);
    cold.push_back(RunOne(*fresh, r));
  }
  return cold;
}

Request Prefix(const Request& r, size_t chunks) {
  Request p = r;
  p.chunks.resize(chunks);
  p.sampling.max_tokens = 1;
  return p;
}

void ExpectSame(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_EQ(a.logits[i], b.logits[i]) << what << ": logits of token " << i << " differ";
  }
  EXPECT_EQ(a.finish, b.finish) << what;
}

TEST(EngineTest, CachedEqualsColdForRandomChunkedPrompts) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 30; ++trial) {
    Request req = RandomRequest(rng, kVocab, 1 + trial % 4, 21, 6);
    if (trial % 2) {
      req.sampling.temperature = 0.9f;
      req.sampling.seed = 1000 + trial;
    }
    auto cold_engine = MakeEngine(256);
    Result cold = RunOne(*cold_engine, req);
    EXPECT_EQ(cold.cached_tokens, 0);
    for (size_t k = 1; k <= req.chunks.size(); ++k) {
      auto warm = MakeEngine(256);
      RunOne(*warm, Prefix(req, k));  // caches the first k chunks (full blocks only)
      Result hot = RunOne(*warm, req);
      ExpectSame(cold, hot,
                 "trial " + std::to_string(trial) + " cached chunks " + std::to_string(k));
      int64_t prefix_len = 0;
      for (size_t c = 0; c < k; ++c) prefix_len += req.chunks[c].tokens.size();
      const int64_t total = cold.prompt_tokens;
      const int64_t expect_cached = std::min((prefix_len / kBlock), (total - 1) / kBlock) * kBlock;
      EXPECT_EQ(hot.cached_tokens, expect_cached) << "trial " << trial << " k " << k;
    }
  }
}

TEST(EngineTest, BatchMixingCachedAndColdSequencesMatchesEachAlone) {
  std::mt19937 rng(2);
  std::vector<Request> reqs;
  Request shared = RandomRequest(rng, kVocab, 1, 30, 1);
  for (int i = 0; i < 8; ++i) {
    Request r = RandomRequest(rng, kVocab, 2, 19, 5);
    if (i % 2 == 0) r.chunks.insert(r.chunks.begin(), shared.chunks[0]);
    reqs.push_back(r);
  }
  std::vector<Result> alone;
  for (const Request& r : reqs) {
    auto e = MakeEngine(256);
    alone.push_back(RunOne(*e, r));
  }
  auto e = MakeEngine(256);
  RunOne(*e, Prefix(reqs[0], 1));  // warm the shared chunk
  std::vector<Result> batched = RunAll(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    ExpectSame(alone[i], batched[i], "request " + std::to_string(i));
  EXPECT_GT(batched[0].cached_tokens, 0);
  EXPECT_EQ(batched[1].cached_tokens, 0);
}

TEST(EngineTest, SecondIdenticalRequestHitsCacheAndReportsChunks) {
  std::mt19937 rng(3);
  Request r = RandomRequest(rng, kVocab, 3, 20, 4);
  auto e = MakeEngine(128);
  Result first = RunOne(*e, r);
  Result second = RunOne(*e, r);
  ExpectSame(first, second, "repeat");
  const int64_t len = first.prompt_tokens;
  EXPECT_EQ(second.cached_tokens, (len - 1) / kBlock * kBlock);
  ASSERT_EQ(second.chunks.size(), 3u);
  int64_t pos = 0, cached_sum = 0;
  for (const ChunkPlacement& c : second.chunks) {
    EXPECT_EQ(c.start, pos);
    pos = c.end;
    cached_sum += c.cached_tokens;
  }
  EXPECT_EQ(pos, len);
  EXPECT_EQ(cached_sum, second.cached_tokens);
  EXPECT_EQ(first.chunks[2].hash, second.chunks[2].hash);
}

TEST(EngineTest, ChunkedPrefillUnderSmallTokenBudgetGivesSameOutput) {
  std::mt19937 rng(4);
  Request r = RandomRequest(rng, kVocab, 3, 40, 8);
  auto big = MakeEngine(256);
  Result a = RunOne(*big, r);
  EngineOptions small;
  small.max_num_batched_tokens = 5;
  auto e = MakeEngine(256, small);
  Result b = RunOne(*e, r);
  ExpectSame(a, b, "chunked prefill");
}

TEST(EngineTest, EvictionUnderPressureNeverChangesOutput) {
  std::mt19937 rng(5);
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(RandomRequest(rng, kVocab, 2, 30, 5));
  auto tiny = MakeEngine(12);  // 96 tokens of KV: every request evicts earlier ones
  for (const Request& r : reqs) {
    auto fresh = MakeEngine(256);
    Result want = RunOne(*fresh, r);
    ExpectSame(want, RunOne(*tiny, r), "after eviction");
    ExpectSame(want, RunOne(*tiny, r), "cache hit on a full cache");
  }
  EXPECT_GT(tiny->Stats().prefix_cache_hits, 0);
}

// 16 tenants' prefixes cycled through GPU KV for about four of them, with a host tier for all:
// every round after the first restores from the host, and the trace backend (which fails a step
// reading a slot that holds the wrong position, and hashes every token it reads) sees the same
// KV as cold. A small host tier then evicts on the host as well, with the same outputs.
TEST(EngineTest, PrefixesCycledThroughASmallGpuTierRestoreFromTheHostExactly) {
  std::mt19937 rng(41);
  std::vector<Request> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(OneChunkRequest(rng, kVocab, 40, 3));
  std::vector<Result> cold = EachCold(reqs);
  for (int64_t host_blocks : {int64_t{16 * 5}, int64_t{64}}) {
    EngineOptions o;
    o.host_kv_bytes = host_blocks * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
    auto e = MakeEngine(24, o);
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < reqs.size(); ++i) {
        Result got = RunOne(*e, reqs[i]);
        ExpectSame(cold[i], got, "round " + std::to_string(round) + " tenant " + std::to_string(i));
        if (round > 0 && host_blocks == 80) {
          EXPECT_EQ(got.cached_tokens, 32);  // (40 - 1) / 8
        }
      }
    }
    const EngineStats st = e->Stats();
    EXPECT_EQ(st.host_total_blocks, host_blocks);
    EXPECT_GT(st.host_restored_blocks, 0);
    EXPECT_EQ(st.used_blocks, 0);
    if (host_blocks == 80) {
      // Each tenant is back after 15 others: always from the host, never still on the GPU.
      EXPECT_EQ(st.prefix_cache_hits_host, 2 * 16 * 32);
      EXPECT_EQ(st.prefix_cache_hits, 2 * 16 * 32);
      EXPECT_EQ(st.host_evicted_blocks, 0);
    } else {
      EXPECT_GT(st.host_evicted_blocks, 0);
    }
  }
}

// Offloading ahead of eviction with the copies deferred as late as the backend contract allows
// (the trace backend runs an ahead copy when a later Forward is ordered after it, at the next
// synchronous copy, or `lag` Forwards on). 24 tenants cycle through a GPU tier that holds about
// four: every eviction should find its block on the host already, every block reused while its
// copy is still in flight must order the step after it (a copy that ran after its block was
// rewritten would carry the wrong positions to the host, and the next restore would fail the
// trace's check or change the logits), and every output equals cold, under the plain and the
// overlapped schedule.
TEST(EngineTest, OffloadAheadOfEvictionKeepsRestoresExactWhileCopiesAreInFlight) {
  std::mt19937 rng(45);
  std::vector<Request> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back(OneChunkRequest(rng, kVocab, 40, 3));
  std::vector<Result> cold = EachCold(reqs);
  for (const int64_t lag : {int64_t{1}, int64_t{3}, INT64_MAX}) {
    for (const bool overlap : {false, true}) {
      const std::string what = absl::StrCat("lag ", lag, " overlap ", overlap);
      EngineOptions o;
      o.overlap_schedule = overlap;
      o.host_kv_bytes = 256 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
      o.host_offload_ahead_blocks = 12;  // a 40-token prompt and its tokens take 6 blocks
      TraceBackend* trace = nullptr;
      auto e = MakeEngine(24, o, &trace);
      trace->set_ahead_lag(lag);
      for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < reqs.size(); ++i) {
          const Result got = RunOne(*e, reqs[i]);
          ExpectSame(cold[i], got, absl::StrCat(what, " round ", round, " tenant ", i));
          if (round > 0) {
            EXPECT_EQ(got.cached_tokens, 32) << what << " tenant " << i;
          }
        }
      }
      const EngineStats st = e->Stats();
      EXPECT_GT(st.host_offloaded_ahead_blocks, 0) << what;
      // The walk named every block eviction took: none was copied at its eviction.
      EXPECT_EQ(st.host_offloaded_blocks, st.host_offloaded_ahead_blocks) << what;
      EXPECT_EQ(trace->blocks_to_host(), 0) << what;
      EXPECT_EQ(st.prefix_cache_hits_host, 24 * 32) << what;
      EXPECT_EQ(st.used_blocks, 0) << what;
      EXPECT_EQ(st.host_copy_failures, 0) << what;
      if (lag == INT64_MAX) {
        // No copy ran on its own: each reuse of an ahead-copied block ordered a step.
        EXPECT_GT(trace->ahead_orders(), 0) << what;
        EXPECT_EQ(st.host_offload_waits, trace->ahead_orders()) << what;
      }
    }
  }
}

// Off (host_offload_ahead_blocks = 0): each eviction copies its block before the step that
// reuses it, as before; the outputs are the same.
TEST(EngineTest, OffloadAheadOffCopiesAtEvictionWithTheSameOutputs) {
  std::mt19937 rng(46);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(OneChunkRequest(rng, kVocab, 40, 3));
  std::vector<Result> cold = EachCold(reqs);
  EngineOptions o;
  o.host_kv_bytes = 64 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
  o.host_offload_ahead_blocks = 0;
  auto e = MakeEngine(16, o);
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      ExpectSame(cold[i], RunOne(*e, reqs[i]), absl::StrCat("round ", round, " tenant ", i));
    }
  }
  const EngineStats st = e->Stats();
  EXPECT_GT(st.host_offloaded_blocks, 0);
  EXPECT_EQ(st.host_offloaded_ahead_blocks, 0);
  EXPECT_GT(st.host_offload_waits, 0);
  EXPECT_GT(st.prefix_cache_hits_host, 0);
}

// The host tier's write policy (EngineOptions::host_offload_min_uses = 1): 8 tenants whose
// prompts are taken again while cached (each sent twice in a row) and 16 prompts seen once flow
// through a GPU tier of about four prompts. Only the tenants' blocks go to the host: when all
// come back, the tenants restore from it and the one-off prompts are recomputed, while with
// every block offloaded (0, the default) both restore. Every output equals cold either way, under
// the plain and the overlapped schedule.
TEST(EngineTest, SelectiveOffloadKeepsOnlyPrefixesTakenAgainWhileCached) {
  std::mt19937 rng(47);
  std::vector<Request> hot, once;
  for (int i = 0; i < 8; ++i) hot.push_back(OneChunkRequest(rng, kVocab, 40, 3));
  for (int i = 0; i < 16; ++i) once.push_back(OneChunkRequest(rng, kVocab, 40, 3));
  const std::vector<Result> hot_cold = EachCold(hot), once_cold = EachCold(once);
  for (const auto [min_uses, overlap] :
       {std::pair{1, false}, std::pair{0, false}, std::pair{1, true}, std::pair{0, true}}) {
    const std::string what = absl::StrCat("min_uses ", min_uses, " overlap ", overlap);
    EngineOptions o;
    o.overlap_schedule = overlap;
    o.host_kv_bytes = 256 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
    o.host_offload_min_uses = min_uses;
    auto e = MakeEngine(24, o);
    for (size_t i = 0; i < hot.size(); ++i) {
      ExpectSame(hot_cold[i], RunOne(*e, hot[i]), absl::StrCat(what, " tenant ", i));
      const Result again = RunOne(*e, hot[i]);  // a GPU hit: its blocks taken again
      ExpectSame(hot_cold[i], again, absl::StrCat(what, " tenant ", i, " again"));
      EXPECT_EQ(again.cached_tokens, 32) << what;
    }
    for (size_t i = 0; i < once.size(); ++i) {
      ExpectSame(once_cold[i], RunOne(*e, once[i]), absl::StrCat(what, " once ", i));
    }
    const int64_t host_hits_before = e->Stats().prefix_cache_hits_host;
    EXPECT_EQ(host_hits_before, 0) << what;
    // All back, the tenants first (their 8 prompts push every one-off prompt off the GPU).
    for (size_t i = 0; i < hot.size(); ++i) {
      const Result got = RunOne(*e, hot[i]);
      ExpectSame(hot_cold[i], got, absl::StrCat(what, " tenant ", i, " back"));
      EXPECT_EQ(got.cached_tokens, 32) << what << " tenant " << i;
    }
    for (size_t i = 0; i < once.size(); ++i) {
      const Result got = RunOne(*e, once[i]);
      ExpectSame(once_cold[i], got, absl::StrCat(what, " once ", i, " back"));
      EXPECT_EQ(got.cached_tokens, min_uses == 1 ? 0 : 32) << what << " once " << i;
    }
    const EngineStats st = e->Stats();
    if (min_uses == 1) {
      EXPECT_EQ(st.prefix_cache_hits_host, 8 * 32) << what;  // the tenants only
      EXPECT_GT(st.host_offload_skipped_blocks, 0) << what;
    } else {
      EXPECT_EQ(st.prefix_cache_hits_host, 24 * 32) << what;
      EXPECT_EQ(st.host_offload_skipped_blocks, 0) << what;
    }
    EXPECT_EQ(st.used_blocks, 0) << what;
    EXPECT_EQ(st.host_copy_failures, 0) << what;
  }
}

// RegisterChunk's eviction hints through the engine: a prefix with a higher priority stays on
// the GPU while lower-priority prefixes cycle through it.
TEST(EngineTest, HigherPriorityPrefixStaysOnTheGpuWhileOthersCycle) {
  std::mt19937 rng(42);
  auto make = [&](int32_t priority) {
    Request r = OneChunkRequest(rng, kVocab, 33, 1);
    r.priority = priority;
    return r;
  };
  const Request vip = make(1);
  auto e = MakeEngine(16);
  RunOne(*e, vip);
  for (int i = 0; i < 6; ++i) RunOne(*e, make(0));  // 5 blocks each: the LRU would take vip's
  EXPECT_EQ(RunOne(*e, vip).cached_tokens, 32);

  // Without the priority, the same sequence of requests evicts it.
  rng.seed(42);
  Request plain = make(0);
  auto e2 = MakeEngine(16);
  RunOne(*e2, plain);
  for (int i = 0; i < 6; ++i) RunOne(*e2, make(0));
  EXPECT_EQ(RunOne(*e2, plain).cached_tokens, 0);
}

// Residency per tier: a chunk the GPU tier evicts into the host tier is reported stored with the
// host tier (not evicted), stored with the GPU tier again once restored, and evicted only when
// its last copy leaves the host too.
TEST(EngineTest, ResidencyEventsFollowAChunkBetweenTiers) {
  std::mt19937 rng(43);
  auto one_chunk = [&](int len) { return OneChunkRequest(rng, kVocab, len, 1); };
  const Request a = one_chunk(33), b = one_chunk(120);
  EngineOptions o;
  o.host_kv_bytes = 6 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
  auto e = MakeEngine(16, o);
  auto last_event_of = [&](const hash::Hash128& h) {
    std::optional<ChunkEvent> last;
    for (const ChunkEvent& ev : e->TakeChunkEvents()) {
      if (ev.hash == h) last = ev;
    }
    return last;
  };
  const Result ra = RunOne(*e, a);
  const hash::Hash128 ha = ra.chunks[0].hash;
  std::optional<ChunkEvent> ev = last_event_of(ha);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->stored);
  EXPECT_EQ(ev->tier, KvTier::kGpu);
  EXPECT_EQ(ev->held_tokens, 32);

  RunOne(*e, b);  // 15 blocks: a's 4 go to the host
  ev = last_event_of(ha);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->stored);
  EXPECT_EQ(ev->tier, KvTier::kHost);
  EXPECT_EQ(ev->held_tokens, 32);
  std::vector<ChunkEvent> held = e->HeldChunks();
  ASSERT_EQ(
      std::count_if(held.begin(), held.end(), [&](const ChunkEvent& c) { return c.hash == ha; }),
      1);

  EXPECT_EQ(RunOne(*e, a).cached_tokens, 32);
  ev = last_event_of(ha);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->tier, KvTier::kGpu);

  // b again: a's blocks go to the host, whose 6 slots then fill with b's copies and evict them.
  RunOne(*e, b);
  RunOne(*e, one_chunk(120));
  ev = last_event_of(ha);
  ASSERT_TRUE(ev.has_value());
  EXPECT_FALSE(ev->stored);
  for (const ChunkEvent& c : e->HeldChunks()) EXPECT_NE(c.hash, ha);
}

// A restore whose copy fails ends its request with an error before any token (never a token
// computed over KV that did not arrive); the engine goes on, and the next request for the same
// prefix restores it cleanly and matches cold.
TEST(EngineTest, FailedRestoreEndsTheRequestWithAnErrorAndTheNextOneMatchesCold) {
  std::mt19937 rng(44);
  auto one_chunk = [&](int len) { return OneChunkRequest(rng, kVocab, len, 3); };
  const Request a = one_chunk(33), b = one_chunk(120);
  auto fresh = MakeEngine(64);
  const Result cold = RunOne(*fresh, a);
  EngineOptions o;
  o.host_kv_bytes = 64 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
  TraceBackend* trace = nullptr;
  auto e = MakeEngine(16, o, &trace);
  RunOne(*e, a);
  RunOne(*e, b);  // a goes to the host
  trace->set_fail_restores(true);
  const Result failed = RunOne(*e, a);
  EXPECT_EQ(failed.finish, FinishReason::kError);
  EXPECT_TRUE(failed.tokens.empty());
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(e->Stats().host_copy_failures, 1);
  trace->set_fail_restores(false);
  const Result again = RunOne(*e, a);
  ExpectSame(cold, again, "after a failed restore");
  EXPECT_EQ(again.cached_tokens, 32);
  EXPECT_EQ(e->Stats().used_blocks, 0);
}

TEST(EngineTest, PreemptionNeverChangesOutput) {
  std::mt19937 rng(6);
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r = RandomRequest(rng, kVocab, 2, 20, 30);
    if (i % 3 == 0) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = i;
    }
    reqs.push_back(r);
  }
  std::vector<Result> alone;
  for (const Request& r : reqs) {
    auto e = MakeEngine(256);
    alone.push_back(RunOne(*e, r));
  }
  auto e = MakeEngine(20);  // 160 tokens for 10 sequences of up to 70: must preempt
  std::vector<Result> together = RunAll(*e, reqs);
  EXPECT_GT(e->Stats().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i)
    ExpectSame(alone[i], together[i], "preempted " + std::to_string(i));
}

TEST(EngineTest, CancelFreesBlocksWithinOneStep) {
  std::mt19937 rng(7);
  Request r = RandomRequest(rng, kVocab, 1, 20, 1000);
  auto e = MakeEngine(256);
  auto id = e->AddRequest(r);
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e->Step().ok());
  EXPECT_GT(e->Stats().used_blocks, 0);
  e->Cancel(*id);
  auto outs = e->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_TRUE((*outs)[0].finished);
  EXPECT_EQ((*outs)[0].finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(e->Stats().used_blocks, 0);
  EXPECT_EQ(e->Stats().running, 0);
  EXPECT_FALSE(e->HasWork());
}

TEST(EngineTest, CancelWhileWaitingFreesTheSlot) {
  std::mt19937 rng(8);
  auto e = MakeEngine(256);
  auto id = e->AddRequest(RandomRequest(rng, kVocab, 1, 5, 5));
  ASSERT_TRUE(id.ok());
  e->Cancel(*id);
  auto outs = e->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ((*outs)[0].finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(e->Stats().waiting, 0);
}

// Root cause 2 at the block level: identical block contents at different positions must not be
// confused. With unchained keys (the injected fault) both blocks get one key, the second is
// served from the first, and the output differs from cold (or the step fails on the position).
TEST(EngineTest, RepeatedBlockContentNeedsChainedKeys) {
  Request r;
  std::vector<int32_t> block(kBlock);
  for (int i = 0; i < kBlock; ++i) block[i] = 10 + i;
  ChunkInput c;
  c.kind = 1;
  c.tokens = block;
  c.tokens.insert(c.tokens.end(), block.begin(), block.end());
  c.tokens.insert(c.tokens.end(), block.begin(), block.end());
  c.tokens.push_back(5);
  r.chunks = {c};
  r.sampling.max_tokens = 4;
  r.sampling.ignore_eos = true;

  auto cold = MakeEngine(64);
  Result want = RunOne(*cold, r);
  auto warm = MakeEngine(64);
  RunOne(*warm, r);
  ExpectSame(want, RunOne(*warm, r), "chained keys");

  EngineOptions bad;
  bad.debug_unchained_block_keys = true;
  auto faulty = MakeEngine(64, bad);
  RunOne(*faulty, r);
  auto id = faulty->AddRequest(r);
  ASSERT_TRUE(id.ok());
  auto outs = faulty->Step();
  bool diverged = !outs.ok();
  if (outs.ok()) {
    for (auto& o : *outs) {
      diverged |= o.finish_reason == FinishReason::kError;  // the backend caught a wrong slot
      diverged |= !o.logits.empty() && o.logits[0] != want.logits[0];
    }
  }
  EXPECT_TRUE(diverged) << "unchained keys went unnoticed: the test would not catch the bug";
}

TEST(EngineTest, StopTokenEndsGenerationWithoutEmittingIt) {
  std::mt19937 rng(9);
  Request r = RandomRequest(rng, kVocab, 2, 10, 10);
  auto e = MakeEngine(128);
  Result full = RunOne(*e, r);
  ASSERT_EQ(full.tokens.size(), 10u);
  EXPECT_EQ(full.finish, FinishReason::kLength);
  // Stop on the first occurrence of the 4th token.
  const int32_t stop = full.tokens[3];
  size_t first = std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin();
  r.sampling.stop_token_ids = {stop};
  Result stopped = RunOne(*e, r);
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.stop_token_id, stop);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first));
  // The same token as EOS stops too, unless ignore_eos.
  EngineOptions o;
  o.eos_token_ids = {stop};
  auto e2 = MakeEngine(128, o);
  r.sampling.stop_token_ids.clear();
  r.sampling.ignore_eos = false;
  EXPECT_EQ(RunOne(*e2, r).finish, FinishReason::kStop);
  r.sampling.ignore_eos = true;
  EXPECT_EQ(RunOne(*e2, r).tokens, full.tokens);
}

TEST(EngineTest, SeededSamplingIsTheSameAloneAndInABatch) {
  std::mt19937 rng(10);
  Request r = RandomRequest(rng, kVocab, 2, 15, 12);
  r.sampling.temperature = 1.2f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 77;
  auto e1 = MakeEngine(256);
  Result alone = RunOne(*e1, r);
  std::vector<Request> batch = {RandomRequest(rng, kVocab, 1, 9, 7), r,
                                RandomRequest(rng, kVocab, 3, 9, 3)};
  auto e2 = MakeEngine(256);
  ExpectSame(alone, RunAll(*e2, batch)[1], "seeded in batch");
}

TEST(EngineTest, RejectsBadRequestsWithFieldNames) {
  auto e = MakeEngine(16);
  Request empty;
  EXPECT_THAT(e->AddRequest(empty).status().message(), ::testing::HasSubstr("no tokens"));
  Request oov;
  oov.chunks = {ChunkInput{1, {1, 2, kVocab}, ""}};
  auto s = e->AddRequest(oov).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("chunks[0].token_ids[2]"));
  Request zero = oov;
  zero.chunks[0].tokens = {1};
  zero.sampling.max_tokens = 0;
  EXPECT_THAT(e->AddRequest(zero).status().message(), ::testing::HasSubstr("sampling.max_tokens"));
  EngineOptions o;
  o.max_context = 10;
  auto small = MakeEngine(16, o);
  Request longreq = zero;
  longreq.sampling.max_tokens = 8;
  longreq.chunks[0].tokens = {1, 2, 3};
  EXPECT_THAT(small->AddRequest(longreq).status().message(),
              ::testing::HasSubstr("context length"));
  Request huge = zero;
  huge.sampling.max_tokens = 200;  // 16 blocks x 8 = 128 tokens of KV
  EXPECT_EQ(e->AddRequest(huge).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(EngineTest, FullQueueIsResourceExhausted) {
  EngineOptions o;
  o.max_waiting = 2;
  auto e = MakeEngine(64, o);
  Request r;
  r.chunks = {ChunkInput{1, {1, 2}, ""}};
  EXPECT_TRUE(e->AddRequest(r).ok());
  EXPECT_TRUE(e->AddRequest(r).ok());
  auto s = e->AddRequest(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("queue is full"));
}

TEST(EngineTest, ResidencyEventsTrackStoredAndEvictedChunks) {
  Request r;
  r.chunks = {ChunkInput{1, std::vector<int32_t>(20, 3), ""},
              ChunkInput{3, std::vector<int32_t>(9, 4), ""}};
  r.sampling.max_tokens = 1;
  auto e = MakeEngine(8);
  Result res = RunOne(*e, r);
  auto events = e->TakeChunkEvents();
  ASSERT_FALSE(events.empty());
  // Chunk 0 ends at 20: held through block 1 (16 tokens). Chunk 1 ends at 29: through 24.
  std::map<hash::Hash128, int64_t> held;
  for (auto& ev : events)
    if (ev.stored) held[ev.hash] = ev.held_tokens;
  EXPECT_EQ(held[res.chunks[0].hash], 16);
  EXPECT_EQ(held[res.chunks[1].hash], 24);
  EXPECT_EQ(e->HeldChunks().size(), 2u);
  // Fill the cache with something else: both chunks get evicted.
  Request other;
  other.chunks = {ChunkInput{1, std::vector<int32_t>(60, 7), ""}};
  other.sampling.max_tokens = 1;
  RunOne(*e, other);
  int evicted = 0;
  for (auto& ev : e->TakeChunkEvents())
    evicted += !ev.stored && (ev.hash == res.chunks[0].hash || ev.hash == res.chunks[1].hash);
  EXPECT_EQ(evicted, 2);
}

TEST(EngineTest, PinnedChunksSurviveEvictionUntilTheirTtl) {
  int64_t now = 0;
  EngineOptions o;
  o.now_ms = [&now] { return now; };
  auto e = MakeEngine(8, o);
  Request pinned;
  pinned.chunks = {ChunkInput{1, std::vector<int32_t>(17, 3), ""}};
  pinned.sampling.max_tokens = 1;
  pinned.pin_ttl_ms = 1000;
  RunOne(*e, pinned);
  Request other;
  other.chunks = {ChunkInput{1, std::vector<int32_t>(40, 7), ""}};
  other.sampling.max_tokens = 1;
  RunOne(*e, other);
  pinned.pin_ttl_ms = 0;
  EXPECT_EQ(RunOne(*e, pinned).cached_tokens, 16);
  now = 2000;  // pin expired: the next pressure evicts it
  for (int32_t fill : {8, 9}) {
    Request big;
    big.chunks = {ChunkInput{1, std::vector<int32_t>(47, fill), ""}};
    big.sampling.max_tokens = 1;
    RunOne(*e, big);
  }
  EXPECT_EQ(RunOne(*e, pinned).cached_tokens, 0);
}

TEST(EngineTest, RegistryPinsKeepAHeldChunkUntilTheyLapse) {
  int64_t now = 0;
  EngineOptions o;
  o.now_ms = [&now] { return now; };
  auto e = MakeEngine(8, o);
  Request held;
  held.chunks = {ChunkInput{1, std::vector<int32_t>(17, 3), ""}, ChunkInput{3, {1, 2}, ""}};
  held.sampling.max_tokens = 1;
  Result first = RunOne(*e, held);
  EXPECT_EQ(e->PinChunks({first.chunks[0].hash}, 1000), 1);
  EXPECT_EQ(e->PinChunks({hash::Hash128{1, 2}}, 1000), 0) << "a chunk not held is not pinned";
  auto flood = [&](int32_t fill) {
    Request big;
    big.chunks = {ChunkInput{1, std::vector<int32_t>(47, fill), ""}};
    big.sampling.max_tokens = 1;
    RunOne(*e, big);
  };
  flood(8);
  flood(9);
  EXPECT_EQ(RunOne(*e, held).cached_tokens, 16) << "the pinned chunk was evicted";
  now = 5000;  // not renewed: the pin lapses and pressure evicts the chunk
  flood(10);
  flood(11);
  EXPECT_EQ(RunOne(*e, held).cached_tokens, 0);
}

TEST(EngineTest, KvHeldByPinsEndsTheQueueHeadResourceExhausted) {
  EngineOptions o;
  o.max_pinned_fraction = 1.0;  // no cap: pins may hold the whole cache
  auto e = MakeEngine(8, o);
  Request pinned;  // 57 tokens: seven full blocks stay pinned, one block is left
  pinned.chunks = {ChunkInput{1, std::vector<int32_t>(57, 3), ""}};
  pinned.sampling.max_tokens = 1;
  pinned.pin_ttl_ms = 60000;
  ASSERT_TRUE(RunOne(*e, pinned).status.ok());
  Request next;  // needs three blocks; fits the cache but not what the pins leave
  next.chunks = {ChunkInput{1, std::vector<int32_t>(20, 5), ""}};
  next.sampling.max_tokens = 1;
  Result r = RunOne(*e, next);
  EXPECT_EQ(r.finish, FinishReason::kError);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kResourceExhausted) << r.status;
  EXPECT_THAT(r.status.message(), ::testing::HasSubstr("held by pinned chunks"));
}

// A prompt of one chunk of `len` copies of `fill` (a new fill: a new chain of blocks).
Request Filled(int32_t fill, int len, int max_tokens) {
  Request r;
  r.chunks = {ChunkInput{1, std::vector<int32_t>(len, fill), ""}};
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// One client pinning prompt after prompt must not take the KV other requests need: pins hold at
// most max_pinned_fraction of the cache, and a pin past it is not taken (the request still runs).
TEST(EngineTest, AFloodOfPinnedPromptsLeavesRoomForAnUnpinnedRequest) {
  auto e = MakeEngine(16);
  for (int32_t fill = 1; fill <= 10; ++fill) {  // each pins two full blocks; 20 > 16 blocks
    Request pinned = Filled(fill, 17, 1);
    pinned.pin_ttl_ms = 3600 * 1000;
    Result r = RunOne(*e, pinned);
    EXPECT_TRUE(r.status.ok()) << "flood " << fill << ": " << r.status;
  }
  EXPECT_EQ(e->Stats().pinned_blocks, 8) << "half of the 16 blocks, the default cap";
  EXPECT_EQ(e->Stats().pins_refused, 6);
  const Request other = Filled(50, 20, 4);  // three blocks
  const Result got = RunOne(*e, other);
  EXPECT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.finish, FinishReason::kLength);
  auto cold = MakeEngine(16);
  ExpectSame(RunOne(*cold, other), got, "after a flood of pins");
  // The pins taken still hold: the first prompts are cached, the refused ones were evicted.
  EXPECT_EQ(RunOne(*e, Filled(1, 17, 1)).cached_tokens, 16);
  EXPECT_EQ(RunOne(*e, Filled(4, 17, 1)).cached_tokens, 16);
}

// A chunk is pinned only if a full block ends inside it: one inside a block holds nothing the
// chunks before it do not, so a client adding a different short chunk to a pinned prefix request
// after request does not grow the pins.
TEST(EngineTest, ChunksWithoutAFullBlockOfTheirOwnAreNotPinned) {
  auto e = MakeEngine(16);
  for (int32_t t = 0; t < 20; ++t) {
    Request r = Filled(1, 8, 1);  // one full block, then a one-token chunk
    r.chunks.push_back(ChunkInput{3, {t}, ""});
    r.pin_ttl_ms = 3600 * 1000;
    ASSERT_TRUE(RunOne(*e, r).status.ok());
  }
  EXPECT_EQ(e->Stats().pinned_chunks, 1);
  EXPECT_EQ(e->Stats().pinned_blocks, 1);
}

// The same blocks under other chunk boundaries are other chunks: their pins hold no new block,
// so they count against the cap by number (at most as many pins as blocks may be pinned).
TEST(EngineTest, PinsOfOneBlockUnderManyChunkBoundariesAreCapped) {
  auto e = MakeEngine(8);  // at most 4 pinned blocks, so 4 pins
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (int split = 1; split < 8; ++split) {
    Request r;
    r.chunks = {ChunkInput{1, {tokens.begin(), tokens.begin() + split}, ""},
                ChunkInput{2, {tokens.begin() + split, tokens.end()}, ""}};
    r.sampling.max_tokens = 1;
    r.pin_ttl_ms = 3600 * 1000;
    ASSERT_TRUE(RunOne(*e, r).status.ok());
  }
  EXPECT_EQ(e->Stats().pinned_blocks, 1);
  EXPECT_EQ(e->Stats().pinned_chunks, 4);
  EXPECT_EQ(e->Stats().pins_refused, 3);
}

// max_pinned_fraction 0 turns pins off; 1 lets them hold every block (then a request the pins
// leave no room for ends RESOURCE_EXHAUSTED: KvHeldByPinsEndsTheQueueHeadResourceExhausted).
TEST(EngineTest, ZeroPinnedFractionTakesNoPins) {
  EngineOptions o;
  o.max_pinned_fraction = 0.0;
  auto e = MakeEngine(16, o);
  Request pinned = Filled(1, 17, 1);
  pinned.pin_ttl_ms = 3600 * 1000;
  ASSERT_TRUE(RunOne(*e, pinned).status.ok());
  EXPECT_EQ(e->Stats().pinned_blocks, 0);
  EXPECT_EQ(e->Stats().pins_refused, 1);
  EXPECT_EQ(e->Stats().used_blocks, 0);
}

// The registry's pins (PinChunks, renewed each heartbeat) count against the same cap.
TEST(EngineTest, RegistryPinsOfEveryHeldChunkLeaveRoomForAnUnpinnedRequest) {
  auto e = MakeEngine(16);
  for (int32_t fill = 1; fill <= 10; ++fill) {
    Result r = RunOne(*e, Filled(fill, 17, 1));
    ASSERT_TRUE(r.status.ok()) << r.status;
    e->PinChunks({r.chunks[0].hash}, 3600 * 1000);
  }
  ASSERT_TRUE(e->Step().ok());  // applies the last pin request
  EXPECT_EQ(e->Stats().pinned_blocks, 8);
  EXPECT_EQ(e->Stats().pins_refused, 6);
  const Result got = RunOne(*e, Filled(50, 20, 4));
  EXPECT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.finish, FinishReason::kLength);
}

// A registry pin refused by the cap is retried at every heartbeat's renewal, but it is one refused
// pin (cascade:pins_refused_total), not one per renewal; once the registry stops renewing it and
// it lapses, a new pin of the chunk is a new request and counts again.
TEST(EngineTest, RenewalsOfARefusedRegistryPinCountItOnce) {
  int64_t now = 0;
  EngineOptions o;
  o.now_ms = [&now] { return now; };
  auto e = MakeEngine(16, o);  // at most 8 pinned blocks
  std::vector<hash::Hash128> chunks;
  for (int32_t fill = 1; fill <= 5; ++fill) {  // two full blocks each: the fifth pin is refused
    Result r = RunOne(*e, Filled(fill, 17, 1));
    ASSERT_TRUE(r.status.ok()) << r.status;
    chunks.push_back(r.chunks[0].hash);
  }
  for (int renewal = 0; renewal < 10; ++renewal) {  // heartbeats every 100 ms, TTL 1 s
    EXPECT_EQ(e->PinChunks(chunks, 1000), 5);
    ASSERT_TRUE(e->Step().ok());
    now += 100;
  }
  EXPECT_EQ(e->Stats().pinned_blocks, 8);
  EXPECT_EQ(e->Stats().pins_refused, 1) << "a refused registry pin was counted at each renewal";
  now += 5000;  // no renewal: every registry pin lapses
  ASSERT_TRUE(e->Step().ok());
  EXPECT_EQ(e->Stats().pinned_blocks, 0);
  EXPECT_EQ(e->PinChunks({chunks[0], chunks[1], chunks[2], chunks[3]}, 1000), 4);
  ASSERT_TRUE(e->Step().ok());
  EXPECT_EQ(e->PinChunks({chunks[4]}, 1000), 1);
  ASSERT_TRUE(e->Step().ok());
  EXPECT_EQ(e->Stats().pins_refused, 2) << "the registry pinned the chunk again: a new request";
}

// The same tokens under other chunk boundaries or kinds are other chunks over the same blocks.
// `kinds` x 16 two-chunk splits of one 17-token prompt (two full blocks) through an engine.
// Returns every stored and evicted event the engine sent, in order.
std::vector<ChunkEvent> ServeChunkings(Engine& e, const std::vector<int32_t>& kinds,
                                       std::vector<hash::Hash128>* chunks = nullptr) {
  std::vector<int32_t> tokens(17);
  std::iota(tokens.begin(), tokens.end(), 1);
  std::vector<ChunkEvent> events;
  for (int32_t kind : kinds) {
    for (int split = 1; split < 17; ++split) {
      Request r;
      r.chunks = {ChunkInput{kind, {tokens.begin(), tokens.begin() + split}, ""},
                  ChunkInput{kind % 3 + 1, {tokens.begin() + split, tokens.end()}, ""}};
      r.sampling.max_tokens = 1;
      const Result res = RunOne(e, r);
      EXPECT_TRUE(res.status.ok()) << res.status;
      if (chunks != nullptr) {
        for (const ChunkPlacement& c : res.chunks) chunks->push_back(c.hash);
      }
      for (ChunkEvent& ev : e.TakeChunkEvents()) events.push_back(ev);
    }
  }
  return events;
}

// What the registry believes after `events`: the chunks last reported stored.
std::set<hash::Hash128> Replay(const std::vector<ChunkEvent>& events) {
  std::set<hash::Hash128> held;
  for (const ChunkEvent& ev : events) {
    if (ev.stored) {
      held.insert(ev.hash);
    } else {
      held.erase(ev.hash);
    }
  }
  return held;
}

std::set<hash::Hash128> HeldSet(const Engine& e) {
  std::set<hash::Hash128> held;
  for (const ChunkEvent& c : e.HeldChunks()) held.insert(c.hash);
  return held;
}

// 48 chunkings of one prompt put 48 + 24 chunk records on its two blocks; at most
// max_chunks_per_block are kept per block (as the last block they are held through), and every
// record dropped for the cap went out as an evicted event: replaying the events gives exactly
// what the engine holds (no stale claim in the registry).
TEST(EngineTest, ChunkingsOfOnePrefixAreCappedPerBlockAndTheDroppedAreWithdrawn) {
  EngineOptions o;
  o.max_chunks_per_block = 4;
  auto e = MakeEngine(16, o);
  const std::vector<ChunkEvent> events = ServeChunkings(*e, {1, 2, 3});
  const std::set<hash::Hash128> held = HeldSet(*e);
  EXPECT_LE(held.size(), 2u * 4u) << "chunk records over two blocks grew past the cap";
  EXPECT_EQ(Replay(events), held) << "the registry would be told something the worker dropped";
  EXPECT_EQ(e->Stats().held_chunks, static_cast<int64_t>(held.size()));
  EXPECT_EQ(e->Stats().held_chunks_displaced, 72 - static_cast<int64_t>(held.size()));
  // The blocks themselves are untouched: the prompt is still cached.
  Request again;
  again.chunks = {ChunkInput{1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, ""}};
  again.sampling.max_tokens = 1;
  EXPECT_EQ(RunOne(*e, again).cached_tokens, 16);
}

// The cap drops the least recently used record: a chunking that requests keep using is never
// withdrawn through a flood of others, nor is a pinned chunk (a registry pin), and the registry's
// renewals still find it.
TEST(EngineTest, ChunksInUseAndPinnedChunksKeepTheirRecordsThroughAFloodOfChunkings) {
  EngineOptions o;
  o.max_chunks_per_block = 2;
  auto e = MakeEngine(32, o);
  std::vector<int32_t> tokens(17);
  std::iota(tokens.begin(), tokens.end(), 1);
  auto split_at = [&](int split, int32_t kind) {
    Request r;
    r.chunks = {ChunkInput{kind, {tokens.begin(), tokens.begin() + split}, ""},
                ChunkInput{kind, {tokens.begin() + split, tokens.end()}, ""}};
    r.sampling.max_tokens = 1;
    return r;
  };
  // Both chunkings hold their first chunk through block 0 and their second through block 1.
  const Request used = split_at(12, 5);
  const Result u = RunOne(*e, used);
  const Result p = RunOne(*e, split_at(10, 4));
  ASSERT_EQ(e->PinChunks({p.chunks[0].hash, p.chunks[1].hash}, 3600 * 1000), 2);
  ASSERT_TRUE(e->Step().ok());
  std::vector<ChunkEvent> events = e->TakeChunkEvents();
  for (int32_t kind : {1, 2, 3}) {
    for (int split = 1; split < 17; ++split) {
      ASSERT_TRUE(RunOne(*e, split_at(split, kind)).status.ok());
      ASSERT_TRUE(RunOne(*e, used).status.ok());
    }
  }
  for (const ChunkEvent& ev : e->TakeChunkEvents()) events.push_back(ev);
  auto withdrawals = [&](const Result& r) {
    int n = 0;
    for (const ChunkEvent& ev : events) {
      for (const ChunkPlacement& c : r.chunks) n += !ev.stored && ev.hash == c.hash;
    }
    return n;
  };
  EXPECT_EQ(withdrawals(u), 0) << "a chunk in use was dropped";
  EXPECT_EQ(withdrawals(p), 0) << "a pinned chunk was dropped";
  const std::set<hash::Hash128> held = HeldSet(*e);
  EXPECT_LE(held.size(), 2u * 2u + 2u) << "two unpinned per block, plus the two pinned";
  EXPECT_GT(e->Stats().held_chunks_displaced, 0);
  EXPECT_EQ(e->PinChunks({p.chunks[0].hash, p.chunks[1].hash}, 3600 * 1000), 2)
      << "the registry's renewals must still find the pinned chunks";
}

// A registry eviction drops the blocks of the chunk (from the one holding its first token) and
// every block after them, and withdraws the chunks held through them; chunks before stay.
TEST(EngineTest, RegistryEvictionDropsTheChunksBlocksAndWhatFollowsThem) {
  auto e = MakeEngine(32);
  Request r;  // chunks [0, 12), [12, 30), [30, 41): held through 8, 24 and 40 tokens
  r.chunks = {ChunkInput{1, std::vector<int32_t>(12, 3), ""},
              ChunkInput{2, std::vector<int32_t>(18, 4), ""},
              ChunkInput{3, std::vector<int32_t>(11, 5), ""}};
  r.sampling.max_tokens = 1;
  const Result first = RunOne(*e, r);
  ASSERT_EQ(e->HeldChunks().size(), 3u);
  e->TakeChunkEvents();
  EXPECT_EQ(e->EvictChunks({first.chunks[1].hash}), 1);
  ASSERT_TRUE(e->Step().ok());
  const std::set<hash::Hash128> held = HeldSet(*e);
  EXPECT_EQ(held, std::set<hash::Hash128>{first.chunks[0].hash});
  std::set<hash::Hash128> withdrawn;
  for (const ChunkEvent& ev : e->TakeChunkEvents()) {
    if (!ev.stored) withdrawn.insert(ev.hash);
  }
  EXPECT_EQ(withdrawn, (std::set<hash::Hash128>{first.chunks[1].hash, first.chunks[2].hash}));
  // Block 1 (tokens 8..15) held chunk 1's first token: it went, block 0 stayed.
  EXPECT_EQ(RunOne(*e, r).cached_tokens, 8);
}

// A chunk held only through a host copy whose parent block is on the GPU alone: a registry
// eviction of an earlier chunk drops that parent from the GPU, so no prefix walk can reach the
// host copy any more. It must go too, and the chunk held through it must be withdrawn (it stayed
// "held (host)" in the registry until the host tier happened to evict it).
// With offloading ahead (the default) D, the next leaf to go, is on the host as well.
TEST(EngineTest, RegistryEvictionDropsHostCopiesBelowTheGpuBlocksItEvicts) {
  for (const int64_t ahead : {int64_t{0}, int64_t{-1}}) {
    SCOPED_TRACE(absl::StrCat("host_offload_ahead_blocks ", ahead));
    EngineOptions o;
    o.host_kv_bytes = 8 * TraceBackend(1, kBlock, kVocab).KvBlockBytes();
    o.host_offload_ahead_blocks = ahead;
    auto e = MakeEngine(6, o);
    auto request = [](int32_t second_block_token) {
      Request r;  // chunks [0, 8), [8, 24), [24, 27): held through blocks 0 and 2
      r.chunks = {ChunkInput{1, std::vector<int32_t>(8, 3), ""},
                  ChunkInput{2, std::vector<int32_t>(8, 4), ""},
                  ChunkInput{3, std::vector<int32_t>(3, 7), ""}};
      r.chunks[1].tokens.resize(16, second_block_token);
      r.sampling.max_tokens = 1;
      return r;
    };
    // Blocks A <- B <- C, then A <- B <- D: B has two children on the GPU.
    const Result first = RunOne(*e, request(5));
    const Result second = RunOne(*e, request(6));
    ASSERT_EQ(second.cached_tokens, 16);
    // Three more blocks for an unrelated prompt: of the leaves C and D, the older C goes to the
    // host; A, B and D stay on the GPU.
    Request other;
    other.chunks = {ChunkInput{1, std::vector<int32_t>(17, 9), ""}};
    other.sampling.max_tokens = 1;
    RunOne(*e, other);
    const hash::Hash128 held_on_host = first.chunks[1].hash;
    bool on_host = false;
    for (const ChunkEvent& c : e->HeldChunks())
      on_host |= c.hash == held_on_host && c.tier == KvTier::kHost;
    ASSERT_TRUE(on_host)
        << "setup: the first prompt's second chunk should be held through C on the host";
    ASSERT_EQ(e->Stats().host_used_blocks, ahead == 0 ? 1 : 2);
    e->TakeChunkEvents();

    EXPECT_EQ(e->EvictChunks({first.chunks[0].hash}), 1);  // block A, and so B, C and D
    ASSERT_TRUE(e->Step().ok());
    const std::set<hash::Hash128> held = HeldSet(*e);
    EXPECT_EQ(held.count(held_on_host), 0u) << "a claim on an unreachable host copy survived";
    EXPECT_EQ(held.count(second.chunks[1].hash), 0u);
    EXPECT_EQ(e->Stats().host_used_blocks, 0);
    std::set<hash::Hash128> withdrawn;
    for (const ChunkEvent& ev : e->TakeChunkEvents()) {
      if (!ev.stored) withdrawn.insert(ev.hash);
    }
    EXPECT_EQ(withdrawn, (std::set<hash::Hash128>{first.chunks[0].hash, first.chunks[1].hash,
                                                  second.chunks[1].hash}));
    EXPECT_EQ(RunOne(*e, request(5)).cached_tokens, 0);
  }
}

// A worker without a registry has nothing that takes chunk events: with chunk_events off none are
// queued (they would pile up for the process's life), and the engine still knows what it holds.
TEST(EngineTest, WithoutChunkEventsNoneAreQueuedAndHeldChunksStillAnswer) {
  EngineOptions o;
  o.chunk_events = false;
  o.max_chunks_per_block = 4;
  auto e = MakeEngine(16, o);
  EXPECT_TRUE(ServeChunkings(*e, {1, 2}).empty());
  EXPECT_EQ(e->HeldChunks().size(), 8u);
  EXPECT_TRUE(e->TakeChunkEvents().empty());
}

// Fails every Forward with `fault` while it is not OK, else runs the trace backend.
class FaultyBackend final : public Backend {
 public:
  explicit FaultyBackend(absl::Status* fault) : fault_(fault) {}
  std::string Name() const override { return "faulty"; }
  int64_t NumBlocks() const override { return inner_.NumBlocks(); }
  int BlockSize() const override { return inner_.BlockSize(); }
  int VocabSize() const override { return inner_.VocabSize(); }
  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    if (!fault_->ok()) return *fault_;
    return inner_.Forward(b, logits);
  }

 private:
  absl::Status* const fault_;
  TraceBackend inner_{64, kBlock, kVocab};
};

TEST(EngineTest, BackendFailureEndsTheStepsSequencesWithAStatusAndTheEngineGoesOn) {
  absl::Status fault;
  EngineOptions o;
  o.model_name = "faulty";
  auto e = NewEngine(o, std::make_unique<FaultyBackend>(&fault));
  Request r;
  r.chunks = {ChunkInput{1, {1, 2, 3}, ""}};
  r.sampling.max_tokens = 2;

  fault = absl::InvalidArgumentError("ForwardBatch: slot_mapping[0] is wrong");
  std::vector<Result> failed = RunAll(*e, {r, r});
  for (const Result& f : failed) {
    EXPECT_EQ(f.finish, FinishReason::kError);
    // A bad batch is the worker's fault, not the client's: INTERNAL, with the backend's words.
    EXPECT_EQ(f.status.code(), absl::StatusCode::kInternal) << f.status;
    EXPECT_THAT(f.status.message(), ::testing::HasSubstr("slot_mapping[0] is wrong"));
  }
  fault = absl::ResourceExhaustedError("out of device memory");
  Result oom = RunOne(*e, r);
  EXPECT_EQ(oom.status.code(), absl::StatusCode::kResourceExhausted) << oom.status;
  EXPECT_EQ(oom.status.message(), "out of device memory");

  fault = absl::OkStatus();
  Result ok = RunOne(*e, r);
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.finish, FinishReason::kLength);
  EXPECT_EQ(ok.tokens.size(), 2u);
  EXPECT_EQ(e->Stats().running + e->Stats().waiting, 0);
  EXPECT_EQ(e->Stats().used_blocks, 0) << "the failed sequences' blocks were not freed";
}

// Runs `hook` once, from the first FinishSampled after it is set: an arrival while the engine
// waits for the step in flight. Otherwise the trace backend.
class ArrivalDuringCollectBackend final : public Backend {
 public:
  std::string Name() const override { return "trace"; }
  int64_t NumBlocks() const override { return inner_.NumBlocks(); }
  int BlockSize() const override { return inner_.BlockSize(); }
  int VocabSize() const override { return inner_.VocabSize(); }
  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    return inner_.Forward(b, logits);
  }
  absl::Status FinishSampled(std::vector<float>* logits, std::vector<int32_t>* tokens,
                             std::vector<RowLogprobs>* logprobs) override {
    if (hook) std::exchange(hook, nullptr)();
    return Backend::FinishSampled(logits, tokens, logprobs);
  }
  std::function<void()> hook;

 private:
  TraceBackend inner_{64, kBlock, kVocab};
};

// A request that arrives while the engine waits for the step in flight starts in the next step
// the engine schedules: with the overlapped schedule that is the step built right after the wait
// (its first token two Step()s later: the launched step, then its own), not the one after (three:
// with long prefills in flight that was a prefill step more of TTFT, H200 session 49); without
// overlap, the next Step() (one). Its tokens are its tokens alone either way.
TEST(EngineTest, ArrivalDuringTheCollectStartsInTheNextScheduledStep) {
  Request a;
  a.chunks = {ChunkInput{1, {5, 6, 7, 8, 9}, ""}};
  a.sampling.max_tokens = 40;
  Request b;
  b.chunks = {ChunkInput{1, {11, 12, 13}, ""}};
  b.sampling.max_tokens = 3;
  const Result alone = RunOne(*MakeEngine(64), b);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped schedule" : "plain schedule");
    EngineOptions o;
    o.model_name = "trace";
    o.overlap_schedule = overlap;
    o.overlap_min_rows = 0;
    auto owned = std::make_unique<ArrivalDuringCollectBackend>();
    ArrivalDuringCollectBackend* backend = owned.get();
    auto e = NewEngine(o, std::move(owned));
    ASSERT_TRUE(e->AddRequest(a).ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->Step().ok());
    uint64_t b_id = 0;
    backend->hook = [&] {
      absl::StatusOr<uint64_t> id = e->AddRequest(b);
      ASSERT_TRUE(id.ok()) << id.status();
      b_id = *id;
    };
    ASSERT_TRUE(e->Step().ok());  // the step whose collect the request arrives during
    ASSERT_NE(b_id, 0u) << "the hook did not run: no FinishSampled in that step";
    int steps = 0;
    std::vector<int32_t> tokens;
    while (tokens.size() < 3 && steps < 20) {
      absl::StatusOr<std::vector<SequenceOutput>> out = e->Step();
      ASSERT_TRUE(out.ok()) << out.status();
      ++steps;
      for (const SequenceOutput& so : *out) {
        if (so.seq_id != b_id) continue;
        if (tokens.empty() && !so.new_tokens.empty()) {
          EXPECT_EQ(steps, overlap ? 2 : 1) << "steps after the arrival to the first token";
        }
        tokens.insert(tokens.end(), so.new_tokens.begin(), so.new_tokens.end());
      }
    }
    EXPECT_EQ(tokens, alone.tokens);
  }
}

TEST(EngineTest, CacheSaltIsolatesTenants) {
  Request a;
  a.chunks = {ChunkInput{1, std::vector<int32_t>(20, 3), ""}};
  a.sampling.max_tokens = 1;
  Request b = a;
  b.cache_salt = "tenant-b";
  auto e = MakeEngine(64);
  RunOne(*e, a);
  EXPECT_EQ(RunOne(*e, b).cached_tokens, 0);
  EXPECT_EQ(RunOne(*e, a).cached_tokens, 16);
}

}  // namespace
}  // namespace cascade::engine::testing
