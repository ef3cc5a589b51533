// RecentRoutes: a prompt a worker admitted counts as held there (by whole-chunk prefix, chained
// hashes) for the ttl, for the router's prefill term only; the oldest chunks go past the capacity.
#include "services/gateway/recent_routes.h"

#include <gtest/gtest.h>

#include <vector>

namespace cascade::gateway {
namespace {

hash::Hash128 H(uint64_t x) { return hash::Hash128{x, x * 31 + 7}; }

// A prompt of chunks with these hashes, each `len` tokens.
std::vector<RoutedChunk> Prompt(std::vector<uint64_t> ids, int64_t len = 100) {
  std::vector<RoutedChunk> p;
  int64_t end = 0;
  for (uint64_t id : ids) p.push_back({H(id), end += len});
  return p;
}

std::vector<Candidate> Workers(std::vector<int64_t> matched) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < matched.size(); ++i) {
    c.push_back(Candidate{"w" + std::to_string(i), "w" + std::to_string(i) + ":1", matched[i]});
  }
  return c;
}

TEST(RecentRoutesTest, AnAdmittedPromptCountsAsHeldByItsWorkerForTheTtl) {
  RecentRoutes r(/*ttl_ms=*/1000, /*capacity=*/100);
  r.Note(Prompt({1, 2, 3}), "w1", 5000);
  std::vector<Candidate> c = Workers({0, 0, 0});
  EXPECT_EQ(r.Apply(Prompt({1, 2, 3}), 5500, &c), 1);
  EXPECT_EQ(c[0].routed_tokens, 0);
  EXPECT_EQ(c[1].routed_tokens, 300);
  // A prompt sharing the first two chunks (chained: the same hashes), another third.
  EXPECT_EQ(r.Apply(Prompt({1, 2, 9}), 5500, &c), 1);
  EXPECT_EQ(c[1].routed_tokens, 200);
  // A prompt whose first chunk differs shares nothing (its later hashes would differ too).
  EXPECT_EQ(r.Apply(Prompt({8, 2, 3}), 5500, &c), 0);
  EXPECT_EQ(c[1].routed_tokens, 0);
  // The registry already says more: nothing is raised, the value is still set.
  c = Workers({0, 350});
  EXPECT_EQ(r.Apply(Prompt({1, 2, 3}), 5500, &c), 0);
  EXPECT_EQ(c[1].routed_tokens, 300);
  // Past the ttl it is forgotten; a new note renews it.
  EXPECT_EQ(r.Apply(Prompt({1, 2, 3}), 6001, &c), 0);
  EXPECT_EQ(c[1].routed_tokens, 0);
  r.Note(Prompt({1}), "w1", 6100);
  c = Workers({0, 0});
  EXPECT_EQ(r.Apply(Prompt({1, 2, 3}), 6200, &c), 1);
  EXPECT_EQ(c[1].routed_tokens, 100) << "chunk 1 renewed, chunks 2 and 3 expired";
}

TEST(RecentRoutesTest, OffCapacityAndWorkersPerChunk) {
  RecentRoutes off(0, 100);
  off.Note(Prompt({1}), "w0", 0);
  std::vector<Candidate> c = Workers({0});
  EXPECT_EQ(off.Apply(Prompt({1}), 0, &c), 0);
  EXPECT_EQ(off.size(), 0u);

  // Capacity 4 chunks: the oldest prompt's chunks go first.
  RecentRoutes r(1000, 4);
  r.Note(Prompt({1, 2}), "w0", 0);
  r.Note(Prompt({3, 4}), "w1", 1);
  r.Note(Prompt({5, 6}), "w2", 2);
  EXPECT_EQ(r.size(), 4u);
  c = Workers({0, 0, 0});
  EXPECT_EQ(r.Apply(Prompt({1, 2}), 3, &c), 0);
  EXPECT_EQ(r.Apply(Prompt({3, 4}), 3, &c), 1);
  EXPECT_EQ(c[1].routed_tokens, 200);
  // Expired chunks at the front are dropped at the next note.
  r.Note(Prompt({7}), "w0", 2000);
  EXPECT_EQ(r.size(), 1u);

  // A chunk keeps its four most recent workers.
  RecentRoutes many(1000, 100);
  for (int w = 0; w < 5; ++w) many.Note(Prompt({1}), "w" + std::to_string(w), w);
  c = Workers({0, 0, 0, 0, 0});
  EXPECT_EQ(many.Apply(Prompt({1}), 10, &c), 4);
  EXPECT_EQ(c[0].routed_tokens, 0) << "the oldest made room";
  for (int w = 1; w < 5; ++w) EXPECT_EQ(c[w].routed_tokens, 100);
}

// The router counts routed tokens as held for the candidate's own prefill, so a burst stays on
// the worker that admitted the prefix first; it never plans a fetch from a worker that holds the
// prompt only by this gateway's note (its blocks may not be stored yet).
TEST(RecentRoutesTest, RouterCountsRoutedTokensForPrefillNotAsAFetchHolder) {
  std::vector<Candidate> c = {
      Candidate{"first", "first:1", 0, 1, 0, 900, 1000, 1},
      Candidate{"idle", "idle:1", 0, 0, 0, 900, 1000, 0},
  };
  EXPECT_EQ(RankWorkers(c, 2000, {})[0].candidate.worker_id, "idle") << "without the note";
  c[0].routed_tokens = 1984;
  EXPECT_EQ(RankWorkers(c, 2000, {})[0].candidate.worker_id, "first");
  RouteWeights fetch;
  fetch.fetch = 0.001;
  fetch.fetch_overhead = 1;
  for (const Scored& s : RankWorkers(c, 2000, fetch)) {
    EXPECT_TRUE(s.peer.worker_id.empty())
        << s.candidate.worker_id << " would fetch from " << s.peer.worker_id;
  }
}

}  // namespace
}  // namespace cascade::gateway
