// Resolve latency and throughput of the registry core with 10^5 and 10^6 known chunks, 16 live
// workers holding part of the working set, one to many resolving threads, optionally with a
// writer streaming residency events at the same time. Results: bench/registry/RESULTS.md.
#include <benchmark/benchmark.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "cache_service/registry/registry.h"

namespace cascade::registry {
namespace {

constexpr int kWorkers = 16;
constexpr int kChunksPerPrompt = 4;  // system, context, query, generation prompt
constexpr int kTokensPerChunk = 64;  // 256-token prompts

struct Fixture {
  std::unique_ptr<Registry> registry;
  std::vector<std::vector<std::vector<int32_t>>> prompts;  // [prompt][chunk][token]
};

std::vector<hash::ChunkSpec> Specs(const std::vector<std::vector<int32_t>>& p) {
  std::vector<hash::ChunkSpec> s;
  for (size_t i = 0; i < p.size(); ++i) s.push_back({static_cast<int32_t>(i % 4) + 1, p[i], ""});
  return s;
}

// Builds (once per size) a registry that knows `known` chunks, a tenth of them held by workers.
Fixture& GetFixture(int64_t known) {
  static absl::Mutex mu;
  static auto* fixtures = new std::map<int64_t, std::unique_ptr<Fixture>>();
  absl::MutexLock lock(&mu);
  auto& slot = (*fixtures)[known];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Fixture>();
  RegistryOptions o;
  o.max_chunks = known + known / 4;
  o.lease_ms = int64_t{1} << 40;
  slot->registry = std::make_unique<Registry>(o);
  Registry& r = *slot->registry;
  for (int w = 0; w < kWorkers; ++w) {
    (void)r.RegisterWorker({"w" + std::to_string(w), "127.0.0.1:1", "m", 10000, 16, 32768, 1000});
  }
  std::mt19937 rng(1);
  int64_t n_prompts = known / kChunksPerPrompt;
  std::vector<uint64_t> seq(kWorkers, 0);
  for (int64_t i = 0; i < n_prompts; ++i) {
    std::vector<std::vector<int32_t>> p(kChunksPerPrompt, std::vector<int32_t>(kTokensPerChunk));
    for (auto& c : p) {
      for (int32_t& t : c) t = static_cast<int32_t>(rng() % 151936);
    }
    std::vector<hash::ChunkSpec> specs = Specs(p);
    absl::StatusOr<ResolveResult> res = r.Resolve({"m", "", specs});
    if (i % 10 == 0) {  // held by one worker: 3 full chunks and the last in part
      int w = static_cast<int>(i % kWorkers);
      std::vector<ChunkEvent> events;
      hash::Hash128 prev;
      for (const ResolvedChunk& c : res->chunks) {
        int64_t held = c.end == res->chunks.back().end ? c.end - 8 : c.end;
        events.push_back({ChunkEvent::Type::kStored, {c.hash, c.start, c.end, held, prev, 1}});
        prev = c.hash;
      }
      (void)r.ReportEvents("w" + std::to_string(w), ++seq[w], events);
    }
    if (slot->prompts.size() < 4096) slot->prompts.push_back(std::move(p));
  }
  return *slot;
}

// Resolves known prompts (every chunk a table hit; a tenth held somewhere).
void BM_ResolveKnown(benchmark::State& state) {
  Fixture& f = GetFixture(state.range(0));
  std::mt19937 rng(state.thread_index() + 7);
  int64_t hits = 0;
  for (auto _ : state) {
    const auto& p = f.prompts[rng() % f.prompts.size()];
    std::vector<hash::ChunkSpec> specs = Specs(p);
    absl::StatusOr<ResolveResult> r = f.registry->Resolve({"m", "", specs});
    hits += r->workers.front().matched_tokens > 0;
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_frac"] = benchmark::Counter(static_cast<double>(hits) / state.iterations(),
                                                  benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_ResolveKnown)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->ThreadRange(1, 16)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The same with one thread streaming residency events (stored then evicted) the whole time.
void BM_ResolveKnownWithEvents(benchmark::State& state) {
  Fixture& f = GetFixture(state.range(0));
  std::atomic<bool> stop{false};
  std::thread writer;
  if (state.thread_index() == 0) {
    writer = std::thread([&] {
      Registry& r = *f.registry;
      (void)r.RegisterWorker({"writer", "127.0.0.1:2", "m", 10000, 16, 32768, 1000});
      uint64_t seq = 0;
      std::mt19937 rng(99);
      while (!stop.load(std::memory_order_relaxed)) {
        const auto& p = f.prompts[rng() % f.prompts.size()];
        std::vector<hash::ChunkSpec> specs = Specs(p);
        std::vector<hash::PlacedChunk> placed = hash::PlaceChunks("m", "", specs);
        std::vector<ChunkEvent> events;
        for (const auto& c : placed) {
          events.push_back({ChunkEvent::Type::kStored, {c.hash, c.start, c.end, c.end, {}, 1}});
        }
        (void)r.ReportEvents("writer", ++seq, events);
        for (ChunkEvent& e : events) e.type = ChunkEvent::Type::kEvicted;
        (void)r.ReportEvents("writer", ++seq, events);
      }
    });
  }
  std::mt19937 rng(state.thread_index() + 7);
  for (auto _ : state) {
    const auto& p = f.prompts[rng() % f.prompts.size()];
    std::vector<hash::ChunkSpec> specs = Specs(p);
    benchmark::DoNotOptimize(f.registry->Resolve({"m", "", specs}));
  }
  if (state.thread_index() == 0) {
    stop.store(true);
    writer.join();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ResolveKnownWithEvents)
    ->Arg(1'000'000)
    ->ThreadRange(1, 8)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Hashing alone (the floor: 4 SHA-256 over 256 tokens), to show what the table adds.
void BM_PlaceChunksOnly(benchmark::State& state) {
  Fixture& f = GetFixture(100'000);
  std::mt19937 rng(3);
  for (auto _ : state) {
    std::vector<hash::ChunkSpec> specs = Specs(f.prompts[rng() % f.prompts.size()]);
    benchmark::DoNotOptimize(hash::PlaceChunks("m", "", specs));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PlaceChunksOnly)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cascade::registry

BENCHMARK_MAIN();
