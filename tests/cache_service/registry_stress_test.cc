// Concurrency: many resolver threads while workers stream events (with gaps, repeats, resyncs,
// re-registrations) and an admin pins, evicts and sweeps, on a small LRU cap. Checks invariants
// on every answer, then that a final resync leaves exact answers. Meant to run under TSan too.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "cache_service/registry/registry.h"
#include "tests/cache_service/registry_test_util.h"

namespace cascade::registry {
namespace {

using testing::HeldFor;
using testing::Info;
using testing::Prompt;
using testing::Stored;
using testing::Tokens;

constexpr int kPrompts = 24;
constexpr int kWorkers = 4;

std::vector<Prompt> MakePrompts() {
  std::vector<Prompt> out;
  for (int i = 0; i < kPrompts; ++i) {
    // Families share a system chunk; half share a context chunk too.
    out.push_back(
        Prompt{.tokens = {Tokens(40, 1 + i % 3), Tokens(24, 100 + i % 6), Tokens(8 + i, 1000 + i)},
               .kinds = {1, 2, 3}});
  }
  return out;
}

void CheckAnswer(const Prompt& p, const ResolveResult& res) {
  std::vector<hash::ChunkSpec> specs = p.Specs();
  std::vector<hash::PlacedChunk> want = hash::PlaceChunks(p.model, p.salt, specs);
  ASSERT_EQ(res.chunks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(res.chunks[i].hash, want[i].hash);
    ASSERT_EQ(res.chunks[i].start, i == 0 ? 0 : res.chunks[i - 1].end);
    ASSERT_EQ(res.chunks[i].end, want[i].end);
  }
  for (size_t k = 0; k < res.workers.size(); ++k) {
    const WorkerMatch& m = res.workers[k];
    ASSERT_GE(m.matched_tokens, 0);
    ASSERT_LE(m.matched_tokens, res.chunks.back().end);
    ASSERT_LE(m.matched_chunks, static_cast<int>(res.chunks.size()));
    if (m.matched_chunks > 0) {
      ASSERT_LE(res.chunks[m.matched_chunks - 1].end, m.matched_tokens);
    }
    if (k > 0) {
      ASSERT_GE(res.workers[k - 1].matched_tokens, m.matched_tokens);
    }
    for (size_t j = 0; j < k; ++j) ASSERT_NE(res.workers[j].worker_id, m.worker_id);
  }
}

TEST(RegistryStressTest, ConcurrentResolvesEventsAndAdminKeepInvariants) {
  FakeClock clock;
  RegistryOptions o;
  o.clock = &clock;
  // The admin advances the fake clock 200 ms a loop so that pins expire; a worker thread starved
  // of the CPU for 5,000 of those loops (CI's 2 cores run 11 threads here) must not lose its
  // lease, since its ReportEvents asserts that it is registered. Worker expiry is tested in
  // registry_test.
  o.lease_ms = int64_t{1} << 50;
  o.max_chunks = 48;  // smaller than the working set: the LRU forgets all the time
  o.num_shards = 8;
  Registry r(o);
  const std::vector<Prompt> prompts = MakePrompts();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> resolves{0};
  std::vector<std::thread> threads;

  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      while (!stop.load()) {
        const Prompt& p = prompts[rng() % kPrompts];
        std::vector<hash::ChunkSpec> specs = p.Specs();
        absl::StatusOr<ResolveResult> res = r.Resolve({p.model, p.salt, specs});
        ASSERT_TRUE(res.ok()) << res.status();
        CheckAnswer(p, *res);
        resolves.fetch_add(1);
      }
    });
  }
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(100 + w);
      std::string id = "w" + std::to_string(w);
      uint64_t seq = 0;
      ASSERT_TRUE(r.RegisterWorker(Info(id)).ok());
      while (!stop.load()) {
        const Prompt& p = prompts[rng() % kPrompts];
        std::vector<HeldChunk> held = HeldFor(p, 16, 16 * (1 + rng() % 6));
        std::vector<ChunkEvent> events = Stored(held);
        if (rng() % 3 == 0) events.back().type = ChunkEvent::Type::kEvicted;
        uint64_t send = ++seq;
        int dice = rng() % 20;
        if (dice == 0) send = seq + 1;             // a lost batch: gap
        if (dice == 1 && seq > 1) send = seq - 1;  // a repeat
        absl::StatusOr<ReportResult> rep = r.ReportEvents(id, send, events);
        ASSERT_TRUE(rep.ok()) << rep.status();
        if (rep->resync_required) {
          ASSERT_TRUE(r.Resync(id, held, seq).ok());
        }
        ASSERT_TRUE(r.Heartbeat(id, WorkerLoad{1, 0, 5, 10}).ok());
        if (rng() % 50 == 0) {
          ASSERT_TRUE(r.RegisterWorker(Info(id)).ok());  // restart: sequence starts over
          seq = 0;
        }
      }
    });
  }
  threads.emplace_back([&] {
    std::mt19937 rng(7);
    while (!stop.load()) {
      const Prompt& p = prompts[rng() % kPrompts];
      std::vector<HeldChunk> held = HeldFor(p, 16, 64);
      (void)r.PinChunk(held[0].hash, 1 + rng() % 3, held[0]);
      if (rng() % 4 == 0) (void)r.EvictChunk(held[1].hash);
      if (rng() % 4 == 0) (void)r.UnpinChunk(held[0].hash);
      (void)r.ListChunks(20, "", nullptr);
      (void)r.ListWorkers();
      RegistryStats s = r.GetStats();
      ASSERT_LE(s.resolve_hits, s.resolves);
      clock.AdvanceMs(200);
      r.Sweep();
    }
  });

  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_GT(resolves.load(), 100);

  // Quiescent: a resync makes each worker's answer exact again.
  const Prompt& p = prompts[0];
  for (int w = 0; w < kWorkers; ++w) {
    std::string id = "w" + std::to_string(w);
    ASSERT_TRUE(r.Resync(id, HeldFor(p, 16, 16 * (w + 1)), 0).ok());
  }
  std::vector<hash::ChunkSpec> specs = p.Specs();
  absl::StatusOr<ResolveResult> res = r.Resolve({p.model, p.salt, specs});
  ASSERT_TRUE(res.ok());
  ASSERT_EQ(res->workers.size(), static_cast<size_t>(kWorkers));
  for (int k = 0; k < kWorkers; ++k) {
    EXPECT_EQ(res->workers[k].worker_id, "w" + std::to_string(kWorkers - 1 - k));
    EXPECT_EQ(res->workers[k].matched_tokens, 16 * (kWorkers - k));
  }
}

}  // namespace
}  // namespace cascade::registry
