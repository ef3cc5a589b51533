// The host tier's walk ahead of eviction (engine.cc OffloadAhead over
// BlockManager::ForNextVictims): every engine step of a worker whose GPU cache is full walks the
// next `n` victims (the copies-ahead watermark: 4 steps' allocations by default, ~875 blocks on a 6
// GiB qwen3-0.6b cache, ~3,000 on an H200's default one) and asks the host tier whether it holds
// each. Chains of 44 blocks (a 700-token prompt of 16-token blocks), every block cached and
// unreferenced, as on a full cache; the walk's callback looks each key up in a hash set the size of
// a host tier. Time per walk.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "common/chunk_hash.h"
#include "gpu_worker/engine/block_manager.h"

namespace cascade::engine {
namespace {

constexpr int kChain = 44;

void BM_NextVictims(benchmark::State& state) {
  const int64_t blocks = state.range(0), walk = state.range(1);
  BlockManager bm(blocks, 16);
  std::vector<int32_t> taken;
  for (int64_t s = 0; s < blocks / kChain; ++s) {
    hash::Hash128 parent{};
    for (int j = 0; j < kChain; ++j) {
      const int32_t b = bm.AllocateFresh();
      const hash::Hash128 key{static_cast<uint64_t>(s) * 1000 + j + 1, 0x9e3779b97f4a7c15ull};
      bm.Commit(b, key, parent);
      parent = key;
      taken.push_back(b);
    }
  }
  for (int32_t b : taken) bm.Release(b);
  std::unordered_set<hash::Hash128, hash::Hash128Hasher> host;
  for (int64_t i = 0; i < blocks; ++i) host.insert(hash::Hash128{static_cast<uint64_t>(i), 7});
  int64_t visited = 0;
  for (auto _ : state) {
    bm.ForNextVictims(walk, [&](int32_t block, const hash::Hash128& key, const hash::Hash128&,
                                const EvictionHints&) {
      visited += static_cast<int64_t>(host.count(key)) + bm.Uses(block) + 1;
      return true;
    });
  }
  benchmark::DoNotOptimize(visited);
  state.counters["blocks_walked"] = static_cast<double>(visited) / state.iterations();
}
BENCHMARK(BM_NextVictims)->Args({3520, 880})->Args({61600, 3080})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cascade::engine

BENCHMARK_MAIN();
