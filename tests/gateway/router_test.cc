// The routing rule's two failure modes: a hot prefix must not pile every request onto its
// holder, and a cache miss must not go to an overloaded worker.
#include "services/gateway/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace cascade::gateway {
namespace {

Candidate Worker(std::string id, int64_t matched, int running, int waiting, int inflight = 0) {
  return Candidate{id, id + ":1", matched, running, waiting, 900, 1000, inflight};
}

TEST(RouterTest, PrefersTheHolderOfTheLongestPrefixWhenLoadsAreEqual) {
  auto r = RankWorkers({Worker("a", 0, 1, 0), Worker("b", 1024, 1, 0)}, 1100, {});
  EXPECT_EQ(r[0].candidate.worker_id, "b");
}

TEST(RouterTest, HotPrefixSpreadsOnceItsHolderIsBusy) {
  // Simulate a burst: every request shares a 1024-token prefix held by "hot"; each routed
  // request adds to its worker's in-flight count, as the gateway's own counter does.
  std::vector<Candidate> ws = {Worker("hot", 1024, 0, 0), Worker("cold1", 0, 0, 0),
                               Worker("cold2", 0, 0, 0)};
  std::map<std::string, int> placed;
  for (int i = 0; i < 60; ++i) {
    auto r = RankWorkers(ws, 1100, {});
    const std::string chosen = r[0].candidate.worker_id;
    ++placed[chosen];
    for (auto& w : ws) {
      if (w.worker_id == chosen) ++w.inflight;
    }
  }
  EXPECT_GT(placed["hot"], placed["cold1"]) << "the holder should still take the largest share";
  EXPECT_GT(placed["cold1"], 5) << "a hot prefix piled every request onto one worker";
  EXPECT_GT(placed["cold2"], 5);
}

TEST(RouterTest, CacheMissGoesToTheLeastLoadedWorker) {
  auto r = RankWorkers({Worker("busy", 0, 30, 10), Worker("idle", 0, 1, 0), Worker("mid", 0, 8, 2)},
                       500, {});
  EXPECT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_EQ(r.back().candidate.worker_id, "busy");
}

TEST(RouterTest, HugeReportedLoadsRankAsTheLongestQueue) {
  // running + waiting + inflight past INT32_MAX (a buggy or hostile heartbeat): summed in int32
  // it wrapped negative and put the busiest worker first.
  const int32_t huge = std::numeric_limits<int32_t>::max();
  auto r = RankWorkers({Worker("flooded", 0, huge, 10, 10), Worker("idle", 0, 1, 0)}, 500, {});
  EXPECT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_GT(r.back().cost, r[0].cost);
  RouteWeights fetch;
  fetch.fetch = 0.001;
  fetch.fetch_overhead = 1;
  // Nor is such a holder a cheap peer to fetch from.
  auto f =
      RankWorkers({Worker("holder", 4000, huge, 10, 10), Worker("idle", 0, 0, 0)}, 4001, fetch);
  for (const Scored& s : f) EXPECT_TRUE(s.peer.worker_id.empty()) << s.candidate.worker_id;
}

TEST(RouterTest, OverloadedWorkerIsSkippedEvenWhenItHoldsThePrefix) {
  RouteWeights w;
  w.max_waiting = 8;
  auto r = RankWorkers({Worker("holder", 4000, 4, 8), Worker("other", 0, 20, 0)}, 4000, w);
  EXPECT_EQ(r[0].candidate.worker_id, "other");
  // Still usable as a last resort.
  EXPECT_EQ(r.size(), 2u);
}

TEST(RouterTest, FullKvCacheCostsMore) {
  Candidate full = Worker("full", 0, 0, 0);
  full.free_kv_blocks = 10;
  Candidate empty = Worker("empty", 0, 0, 0);
  empty.free_kv_blocks = 1000;
  EXPECT_EQ(RankWorkers({full, empty}, 100, {})[0].candidate.worker_id, "empty");
}

// A prefix held only in a worker's host memory costs a copy, not a prefill: such a holder beats
// a worker that would prefill it, and loses to an equally loaded holder with it on the GPU.
TEST(RouterTest, HostTierHitCostsLessThanPrefillAndMoreThanAGpuHit) {
  Candidate host = Worker("host", 1000, 0, 0);
  host.matched_host_tokens = 1000;
  Candidate gpu = Worker("gpu", 1000, 0, 0);
  Candidate miss = Worker("miss", 0, 0, 0);
  std::vector<Scored> r = RankWorkers({miss, host, gpu}, 1100, {});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].candidate.worker_id, "gpu");
  EXPECT_EQ(r[1].candidate.worker_id, "host");
  EXPECT_EQ(r[2].candidate.worker_id, "miss");
  EXPECT_DOUBLE_EQ(r[1].cost - r[0].cost, 0.2 * 1000);
  // A host count beyond the match (a stale or bad answer) is capped at the match.
  host.matched_host_tokens = 5000;
  EXPECT_DOUBLE_EQ(RankWorkers({host}, 1100, {})[0].cost, r[1].cost);
}

TEST(RouterTest, WeightsAreHonoured) {
  RouteWeights prefix_only;
  prefix_only.load = 0;
  prefix_only.kv = 0;
  auto r = RankWorkers({Worker("holder", 1000, 50, 5), Worker("idle", 0, 0, 0)}, 1000, prefix_only);
  EXPECT_EQ(r[0].candidate.worker_id, "holder");
}

// The comparison policies. load: the holder of a long prefix gets no credit for it, so the
// less loaded worker wins; round_robin: each ticket moves the first choice one worker on;
// random: a ticket always gives the same order, and the tickets spread first choices.
TEST(RouterTest, LoadPolicyIgnoresTheCachedPrefix) {
  RouteWeights load;
  load.policy = RoutePolicy::kLoad;
  auto r = RankWorkers({Worker("holder", 4000, 2, 0), Worker("idle", 0, 1, 0)}, 4000, load);
  EXPECT_EQ(r[0].candidate.worker_id, "idle");
  auto c = RankWorkers({Worker("holder", 4000, 2, 0), Worker("idle", 0, 1, 0)}, 4000, {});
  EXPECT_EQ(c[0].candidate.worker_id, "holder");
}

TEST(RouterTest, RoundRobinRotatesByTicketWhateverTheListOrder) {
  RouteWeights rr;
  rr.policy = RoutePolicy::kRoundRobin;
  std::vector<Candidate> ws = {Worker("c", 4000, 0, 0), Worker("a", 0, 9, 0), Worker("b", 0, 0, 0)};
  std::vector<std::string> first;
  for (uint64_t t = 0; t < 6; ++t)
    first.push_back(RankWorkers(ws, 4000, rr, t)[0].candidate.worker_id);
  EXPECT_EQ(first, (std::vector<std::string>{"a", "b", "c", "a", "b", "c"}));
  std::reverse(ws.begin(), ws.end());
  EXPECT_EQ(RankWorkers(ws, 4000, rr, 1)[0].candidate.worker_id, "b");
  // Every worker stays in the list, for failover.
  EXPECT_EQ(RankWorkers(ws, 4000, rr, 1).size(), 3u);
}

TEST(RouterTest, RandomIsReproduciblePerTicketAndSpreads) {
  RouteWeights random;
  random.policy = RoutePolicy::kRandom;
  std::vector<Candidate> ws = {Worker("a", 0, 0, 0), Worker("b", 0, 0, 0), Worker("c", 0, 0, 0),
                               Worker("d", 0, 0, 0)};
  std::map<std::string, int> firsts;
  for (uint64_t t = 0; t < 400; ++t) {
    auto r = RankWorkers(ws, 10, random, t);
    EXPECT_EQ(r[0].candidate.worker_id, RankWorkers(ws, 10, random, t)[0].candidate.worker_id);
    ++firsts[r[0].candidate.worker_id];
  }
  ASSERT_EQ(firsts.size(), 4u);
  for (const auto& [id, n] : firsts) EXPECT_GT(n, 50) << id;  // expected 100 each
}

TEST(RouterTest, EveryPolicyPutsOverloadedWorkersLast) {
  for (RoutePolicy p :
       {RoutePolicy::kCost, RoutePolicy::kLoad, RoutePolicy::kRoundRobin, RoutePolicy::kRandom}) {
    RouteWeights w;
    w.policy = p;
    for (uint64_t t = 0; t < 8; ++t) {
      auto r = RankWorkers({Worker("a", 1000, 1, 64), Worker("b", 0, 1, 0)}, 1000, w, t);
      EXPECT_EQ(r[0].candidate.worker_id, "b") << RoutePolicyName(p) << " ticket " << t;
    }
  }
}

// Peer fetch: with the holder busy, a spilled request fetches the prefix from it when moving a
// token's KV costs less than prefilling it (fetch < 1), and prefills when it does not (fetch > 1)
// or when the saving does not cover the fixed overhead; an overloaded holder is never used.
RouteWeights FetchWeights(double fetch, double overhead) {
  RouteWeights w;
  w.fetch = fetch;
  w.fetch_overhead = overhead;
  return w;
}

TEST(RouterTest, SpilledRequestFetchesFromTheHolderWhenTransferIsCheaper) {
  const std::vector<Candidate> ws = {Worker("holder", 8192, 6, 0), Worker("idle", 0, 0, 0)};
  auto r = RankWorkers(ws, 8300, FetchWeights(0.25, 200));
  ASSERT_EQ(r[0].candidate.worker_id, "holder") << "fetching must not beat holding it";
  // The holder is busier: the idle worker takes it, fetching 8192 tokens for ~2k tokens' cost.
  std::vector<Candidate> busy = ws;
  busy[0].waiting = 40;
  r = RankWorkers(busy, 8300, FetchWeights(0.25, 200));
  ASSERT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_EQ(r[0].peer.worker_id, "holder");
  EXPECT_EQ(r[0].peer.address, "holder:1");
  EXPECT_EQ(r[0].peer.tokens, 8192);
  const auto prefill_only = RankWorkers(busy, 8300, {});
  EXPECT_TRUE(prefill_only[0].peer.worker_id.empty());
  EXPECT_NEAR(prefill_only[0].cost - r[0].cost, 8192 - (0.25 * 8192 + 200 + 64.0 * (6 + 40)), 1e-6);
}

TEST(RouterTest, NoFetchWhenPrefillIsCheaperOrTheOverheadEatsTheSaving) {
  const std::vector<Candidate> ws = {Worker("holder", 512, 0, 3), Worker("idle", 0, 0, 0)};
  EXPECT_TRUE(RankWorkers(ws, 600, FetchWeights(1.5, 0))[1].peer.worker_id.empty());
  EXPECT_TRUE(RankWorkers(ws, 600, FetchWeights(1.5, 0))[0].peer.worker_id.empty());
  for (const Scored& s : RankWorkers(ws, 600, FetchWeights(0.1, 5000))) {
    EXPECT_TRUE(s.peer.worker_id.empty()) << s.candidate.worker_id;
  }
  // A short prefix the overhead does not swamp is fetched.
  EXPECT_FALSE(RankWorkers(ws, 600, FetchWeights(0.1, 100))[0].peer.worker_id.empty());
}

TEST(RouterTest, OverloadedHolderIsNeverFetchedFrom) {
  RouteWeights w = FetchWeights(0.1, 0);
  w.max_waiting = 8;
  const std::vector<Candidate> ws = {Worker("holder", 4096, 0, 8), Worker("idle", 0, 0, 0)};
  for (const Scored& s : RankWorkers(ws, 5000, w)) EXPECT_TRUE(s.peer.worker_id.empty());
}

TEST(RouterTest, FetchBringsOnlyWhatTheCandidateLacks) {
  // "part" holds 2048 of the prefix already: it fetches the rest from "holder".
  const std::vector<Candidate> ws = {Worker("holder", 8192, 0, 50), Worker("part", 2048, 0, 0)};
  const auto r = RankWorkers(ws, 9000, FetchWeights(0.2, 0));
  ASSERT_EQ(r[0].candidate.worker_id, "part");
  EXPECT_EQ(r[0].peer.worker_id, "holder");
  const auto none = RankWorkers(ws, 9000, {});
  EXPECT_NEAR(none[0].cost - r[0].cost, 0.8 * (8192 - 2048) - 64.0 * 50, 1e-6);
}

TEST(RouterTest, HolderOfOtherKvNumericsIsNeverTheFetchPeer) {
  // "far" holds the most but computed it under other numerics: it would refuse the fetch, so the
  // plan names "near", which holds less under the idle candidate's numerics.
  std::vector<Candidate> ws = {Worker("far", 8192, 0, 50), Worker("near", 4096, 0, 50),
                               Worker("idle", 0, 0, 0)};
  ws[0].kv_numerics = "cuda/v1/G1/a95658a7fb833b51";
  ws[1].kv_numerics = "cuda/v1/G2/0123456789abcdef";
  ws[2].kv_numerics = "cuda/v1/G2/0123456789abcdef";
  auto r = RankWorkers(ws, 9000, FetchWeights(0.1, 0));
  ASSERT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_EQ(r[0].peer.worker_id, "near");
  EXPECT_EQ(r[0].peer.tokens, 4096);
  // Unknown numerics on either side (an older worker) leave the holder's own check to decide.
  for (size_t unknown : {size_t{0}, size_t{2}}) {
    std::vector<Candidate> old = ws;
    old[unknown].kv_numerics.clear();
    r = RankWorkers(old, 9000, FetchWeights(0.1, 0));
    ASSERT_EQ(r[0].candidate.worker_id, "idle");
    EXPECT_EQ(r[0].peer.worker_id, "far") << "unknown: " << old[unknown].worker_id;
  }
  // With no holder of its numerics the candidate prefills.
  ws[1].kv_numerics = ws[0].kv_numerics;
  for (const Scored& s : RankWorkers(ws, 9000, FetchWeights(0.1, 0))) {
    if (s.candidate.worker_id == "idle") EXPECT_TRUE(s.peer.worker_id.empty());
  }
}

TEST(RouterTest, HolderOfOtherBlockSizeIsNeverTheFetchPeer) {
  // All three share numerics, but "far" cut its KV into 32-token blocks: the idle 16-token
  // candidate could not take them (the holder refuses the layout), so the plan names "near".
  std::vector<Candidate> ws = {Worker("far", 8192, 0, 50), Worker("near", 4096, 0, 50),
                               Worker("idle", 0, 0, 0)};
  for (Candidate& c : ws) c.kv_numerics = "cpu";
  ws[0].block_size = 32;
  ws[1].block_size = 16;
  ws[2].block_size = 16;
  auto r = RankWorkers(ws, 9000, FetchWeights(0.1, 0));
  ASSERT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_EQ(r[0].peer.worker_id, "near");
  EXPECT_EQ(r[0].peer.tokens, 4096);
  // An unknown block size on either side (a registry that does not send it) leaves the holder's
  // own check to decide.
  for (size_t unknown : {size_t{0}, size_t{2}}) {
    std::vector<Candidate> old = ws;
    old[unknown].block_size = 0;
    r = RankWorkers(old, 9000, FetchWeights(0.1, 0));
    ASSERT_EQ(r[0].candidate.worker_id, "idle");
    EXPECT_EQ(r[0].peer.worker_id, "far") << "unknown: " << old[unknown].worker_id;
  }
  // With no holder of its block size the candidate prefills; equal sizes fetch as before.
  ws[1].block_size = 32;
  for (const Scored& s : RankWorkers(ws, 9000, FetchWeights(0.1, 0))) {
    if (s.candidate.worker_id == "idle") EXPECT_TRUE(s.peer.worker_id.empty());
  }
  ws[2].block_size = 32;
  r = RankWorkers(ws, 9000, FetchWeights(0.1, 0));
  ASSERT_EQ(r[0].candidate.worker_id, "idle");
  EXPECT_EQ(r[0].peer.worker_id, "far");
}

TEST(RouterTest, ParsesPolicyNames) {
  for (RoutePolicy p :
       {RoutePolicy::kCost, RoutePolicy::kLoad, RoutePolicy::kRoundRobin, RoutePolicy::kRandom}) {
    EXPECT_EQ(*ParseRoutePolicy(RoutePolicyName(p)), p);
  }
  EXPECT_FALSE(ParseRoutePolicy("fastest").ok());
}

}  // namespace
}  // namespace cascade::gateway
