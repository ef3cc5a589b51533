// Eviction policy in both KV tiers: tree-aware (a block goes only after the cached blocks that
// extend it, whatever the release order), priority before recency, retention honoured until it
// lapses; and the host tier's bookkeeping: one copy per key, copies recorded in order, protected
// copies kept, admin erase with descendants, offloads handed to the eviction listener.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "gpu_worker/engine/block_manager.h"
#include "gpu_worker/engine/host_tier.h"

namespace cascade::engine {
namespace {

hash::Hash128 K(uint64_t v) { return hash::Hash128{0, v}; }

// A chain K(1) <- K(2) <- K(3) on blocks allocated in that order.
std::vector<int32_t> CommitChain(BlockManager& bm, uint64_t first, int n) {
  std::vector<int32_t> blocks;
  for (int i = 0; i < n; ++i) {
    const int32_t b = bm.AllocateFresh();
    EXPECT_GE(b, 0);
    EXPECT_TRUE(bm.Commit(b, K(first + i), i == 0 ? hash::Hash128{} : K(first + i - 1)));
    blocks.push_back(b);
  }
  return blocks;
}

TEST(EvictionTest, GpuTierEvictsLeavesFirstWhateverTheReleaseOrder) {
  BlockManager bm(3, 4);
  std::vector<int32_t> chain = CommitChain(bm, 1, 3);
  // Released root first: plain LRU would evict the root and strand its descendants.
  for (int32_t b : chain) bm.Release(b);
  EXPECT_EQ(bm.AllocateFresh(), chain[2]);
  EXPECT_EQ(bm.TakeEvictedKeys(), std::vector<hash::Hash128>{K(3)});
  EXPECT_EQ(bm.AllocateFresh(), chain[1]);
  EXPECT_EQ(bm.TakeEvictedKeys(), std::vector<hash::Hash128>{K(2)});
  EXPECT_TRUE(bm.IsCachedKey(K(1)));
}

TEST(EvictionTest, GpuTierEvictsLowerPriorityFirstThenLeastRecentlyUsed) {
  BlockManager bm(3, 4);
  const int32_t a = bm.AllocateFresh(), b = bm.AllocateFresh(), c = bm.AllocateFresh();
  ASSERT_TRUE(bm.Commit(a, K(1), {}));
  ASSERT_TRUE(bm.Commit(b, K(2), {}));
  ASSERT_TRUE(bm.Commit(c, K(3), {}));
  bm.RaiseHints(a, {.priority = 5});
  bm.Release(a);  // oldest, but high priority
  bm.Release(b);
  bm.Release(c);
  EXPECT_EQ(bm.AllocateFresh(), b);
  EXPECT_EQ(bm.AllocateFresh(), c);
  EXPECT_EQ(bm.AllocateFresh(), a);
}

TEST(EvictionTest, RetainedBlocksGoLastUntilTheirRetentionLapses) {
  int64_t now = 1000;
  BlockManager bm(3, 4, [&] { return now; });
  const int32_t a = bm.AllocateFresh(), b = bm.AllocateFresh(), c = bm.AllocateFresh();
  ASSERT_TRUE(bm.Commit(a, K(1), {}));
  ASSERT_TRUE(bm.Commit(b, K(2), {}));
  ASSERT_TRUE(bm.Commit(c, K(3), {}));
  bm.RaiseHints(a, {.retain_until_ms = 5000});
  bm.Release(a);
  bm.Release(b);
  bm.Release(c);
  EXPECT_EQ(bm.AllocateFresh(), b);  // a is retained
  now = 6000;
  EXPECT_EQ(bm.AllocateFresh(), a);  // lapsed: plain LRU again, and a is older than c
  // Retention is soft: with nothing else left, a retained block is still evicted.
  bm.RaiseHints(c, {.retain_until_ms = 99999});
  EXPECT_EQ(bm.AllocateFresh(), c);
}

TEST(EvictionTest, ListenerSeesEachEvictedBlockBeforeItsKeyIsDropped) {
  BlockManager bm(2, 4);
  std::vector<std::pair<int32_t, hash::Hash128>> seen;
  bm.set_evict_listener([&](int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                            const EvictionHints&) {
    EXPECT_TRUE(bm.IsCachedKey(key));
    EXPECT_EQ(parent, K(1));
    seen.push_back({block, key});
  });
  std::vector<int32_t> chain = CommitChain(bm, 1, 2);
  bm.Release(chain[1]);
  bm.Release(chain[0]);
  EXPECT_EQ(bm.AllocateFresh(), chain[1]);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, chain[1]);
  EXPECT_EQ(seen[0].second, K(2));
  bm.EvictKeys(std::vector<hash::Hash128>{K(1)});  // admin eviction: no offload
  EXPECT_EQ(seen.size(), 1u);
}

HostKvTier MakeHost(int64_t slots, std::function<int64_t()> now = nullptr) {
  constexpr int64_t kBytes = 8;
  auto mem =
      HostKvMemory(static_cast<std::byte*>(std::malloc(slots * kBytes)), HostKvDeleter{&std::free});
  return HostKvTier(slots, kBytes, std::move(mem), std::move(now));
}

TEST(HostTierTest, OffloadRecordsOneCopyPerKeyAndRestoreReadsTheSameSlot) {
  HostKvTier host = MakeHost(4);
  host.Offload(7, K(1), {}, {});
  host.Offload(8, K(2), K(1), {});
  host.Offload(9, K(1), {}, {});  // already on the host: no second copy
  std::vector<HostCopyOp> ops = host.TakeCopies();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_TRUE(ops[0].to_host);
  EXPECT_EQ(ops[0].copy.block, 7);
  EXPECT_EQ(ops[0].key, K(1));
  EXPECT_NE(ops[0].copy.host, ops[1].copy.host);
  host.Restore(K(1), 3);
  std::vector<HostCopyOp> back = host.TakeCopies();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_FALSE(back[0].to_host);
  EXPECT_EQ(back[0].copy.block, 3);
  EXPECT_EQ(back[0].copy.host, ops[0].copy.host);
  EXPECT_EQ(host.Data(K(1)), ops[0].copy.host);
  EXPECT_TRUE(host.Contains(K(1)));  // inclusive: the host copy stays
  HostTierStats s = host.Stats();
  EXPECT_EQ(s.used, 2);
  EXPECT_EQ(s.offloaded, 2);
  EXPECT_EQ(s.restored, 1);
}

// An ahead copy is an offload marked ahead; the eviction that follows finds the key on the
// host and records nothing (the GPU block's bytes went already).
TEST(HostTierTest, OffloadAheadRecordsAnAheadCopyAndTheLaterEvictionCopiesNothing) {
  HostKvTier host = MakeHost(4);
  host.OffloadAhead(7, K(1), {}, {});
  host.Offload(8, K(2), K(1), {});
  EXPECT_TRUE(host.HasCopies());
  ASSERT_EQ(host.PendingCopies().size(), 2u);
  std::vector<HostCopyOp> ops = host.TakeCopies();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_TRUE(ops[0].to_host && ops[0].ahead);
  EXPECT_EQ(ops[0].copy.block, 7);
  EXPECT_TRUE(ops[1].to_host && !ops[1].ahead);
  host.Offload(7, K(1), {}, {});       // the eviction
  host.OffloadAhead(9, K(2), {}, {});  // on the host already
  EXPECT_TRUE(host.TakeCopies().empty());
  host.Restore(K(1), 3);
  std::vector<HostCopyOp> back = host.TakeCopies();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_FALSE(back[0].ahead);
  EXPECT_EQ(back[0].copy.host, ops[0].copy.host);
  const HostTierStats s = host.Stats();
  EXPECT_EQ(s.offloaded, 2);
  EXPECT_EQ(s.offloaded_ahead, 1);
}

TEST(HostTierTest, FullTierEvictsHostLeavesFirstAndRecordsTheOverwriteAfterTheRestore) {
  HostKvTier host = MakeHost(3);
  // GPU order: the leaf arrives first, then its ancestors.
  host.Offload(0, K(3), K(2), {});
  host.Offload(1, K(2), K(1), {});
  host.Offload(2, K(1), {}, {});
  host.Offload(4, K(10), {}, {});  // room: the leaf K(3) goes, not the oldest-touched root
  EXPECT_FALSE(host.Contains(K(3)));
  EXPECT_TRUE(host.Contains(K(1)));
  EXPECT_EQ(host.TakeEvictedKeys(), std::vector<hash::Hash128>{K(3)});
  host.TakeCopies();
  // A restore of K(2) then an offload that evicts it: the copies come out restore first.
  host.Restore(K(2), 5);
  host.Offload(6, K(11), {}, {});  // evicts the leaf with the oldest use: K(10)
  host.Offload(7, K(12), {}, {});  // evicts K(2), a leaf since K(3) left, older than K(11)
  EXPECT_FALSE(host.Contains(K(2)));
  std::vector<HostCopyOp> ops = host.TakeCopies();
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_FALSE(ops[0].to_host);
  EXPECT_TRUE(ops[1].to_host);
  EXPECT_TRUE(ops[2].to_host);
  EXPECT_EQ(ops[2].copy.host, ops[0].copy.host);  // same slot: read before it is overwritten
  EXPECT_EQ(host.Stats().used, 3);
  EXPECT_EQ(host.Stats().evicted, 3);
}

TEST(HostTierTest, ProtectedCopiesAreNotEvictedAndAnOffloadWithoutRoomIsSkipped) {
  HostKvTier host = MakeHost(2);
  host.Offload(0, K(1), {}, {});
  host.Offload(1, K(2), {}, {});
  host.TakeCopies();
  const std::vector<hash::Hash128> keep = {K(1), K(2)};
  host.Protect(keep);
  host.Offload(2, K(3), {}, {});
  EXPECT_FALSE(host.Contains(K(3)));
  EXPECT_TRUE(host.TakeCopies().empty());
  host.Unprotect();
  host.Offload(2, K(3), {}, {});
  EXPECT_TRUE(host.Contains(K(3)));
  EXPECT_FALSE(host.Contains(K(1)));  // the least recently used
}

TEST(HostTierTest, PriorityAndRetentionOrderHostEvictionToo) {
  int64_t now = 0;
  HostKvTier host = MakeHost(3, [&] { return now; });
  host.Offload(0, K(1), {}, {.priority = 2});
  host.Offload(1, K(2), {}, {.retain_until_ms = 100});
  host.Offload(2, K(3), {}, {});
  host.Offload(3, K(4), {}, {});
  EXPECT_FALSE(host.Contains(K(3)));  // lowest priority, not retained
  host.Offload(4, K(5), {}, {});
  EXPECT_FALSE(host.Contains(K(4)));
  now = 200;
  host.Offload(5, K(6), {}, {});
  EXPECT_FALSE(host.Contains(K(2)));  // retention lapsed; K(1)'s priority still holds
  EXPECT_TRUE(host.Contains(K(1)));
}

TEST(HostTierTest, EraseDropsDescendants) {
  HostKvTier host = MakeHost(4);
  host.Offload(0, K(3), K(2), {});
  host.Offload(1, K(2), K(1), {});
  host.Offload(2, K(1), {}, {});
  host.Offload(3, K(9), {}, {});
  EXPECT_EQ(host.Erase(std::vector<hash::Hash128>{K(2)}), 2);
  EXPECT_TRUE(host.Contains(K(1)));
  EXPECT_FALSE(host.Contains(K(3)));
  EXPECT_EQ(host.Stats().used, 2);
}

// A random prefix forest over keys K(1)..K(n): parent[i] is 0 (a root) or an earlier key.
std::vector<uint64_t> RandomForest(std::mt19937& rng, uint64_t n) {
  std::vector<uint64_t> parent(n + 1, 0);
  for (uint64_t i = 2; i <= n; ++i) {
    if (rng() % 8 != 0) parent[i] = 1 + rng() % (i - 1);
  }
  return parent;
}

// The seeds and every key of `present` below one of them, by repeated passes over the parent
// links (the obvious way, to check the child index against).
std::set<uint64_t> Closure(const std::vector<uint64_t>& seeds, const std::set<uint64_t>& present,
                           const std::vector<uint64_t>& parent) {
  std::set<uint64_t> out(seeds.begin(), seeds.end());
  for (bool grew = true; grew;) {
    grew = false;
    for (uint64_t k : present) {
      if (!out.count(k) && out.count(parent[k])) grew = out.insert(k).second;
    }
  }
  return out;
}

std::set<uint64_t> Values(const std::vector<hash::Hash128>& keys) {
  std::set<uint64_t> out;
  for (const hash::Hash128& k : keys) out.insert(k.lo);
  return out;
}

// Admin evictions of many keys at once, with keys re-committed between them (so the child index
// is exercised through inserts and evictions), drop exactly the unreferenced keys below the
// given ones; referenced blocks stay until released, then go with what is cached below them.
// Afterwards pressure evicts only leaves, so the index still knows every block's children.
TEST(EvictionTest, ManyKeyGpuEvictionDropsExactlyTheUnreferencedDescendants) {
  constexpr uint64_t kN = 300;
  std::mt19937 rng(7);
  const std::vector<uint64_t> parent = RandomForest(rng, kN);
  BlockManager bm(kN, 4);
  std::map<uint64_t, int32_t> block_of;
  std::set<uint64_t> cached, referenced, marked;  // marked: an eviction met it in use
  auto commit = [&](uint64_t k) {
    const int32_t b = bm.AllocateFresh();
    ASSERT_GE(b, 0);
    ASSERT_TRUE(bm.Commit(b, K(k), parent[k] == 0 ? hash::Hash128{} : K(parent[k])));
    block_of[k] = b;
    cached.insert(k);
  };
  for (uint64_t k = 1; k <= kN; ++k) commit(k);
  for (uint64_t k = 1; k <= kN; ++k) {
    if (rng() % 10 == 0) {
      referenced.insert(k);  // a live sequence keeps it
    } else {
      bm.Release(block_of[k]);
    }
  }
  bm.TakeEvictedKeys();
  for (int round = 0; round < 4; ++round) {
    std::vector<uint64_t> seeds;
    for (int i = 0; i < 25; ++i) seeds.push_back(1 + rng() % kN);
    std::vector<hash::Hash128> seed_keys;
    for (uint64_t k : seeds) seed_keys.push_back(K(k));
    const std::set<uint64_t> doomed = Closure(seeds, cached, parent);
    std::set<uint64_t> want;
    for (uint64_t k : doomed) {
      if (cached.count(k) && !referenced.count(k)) want.insert(k);
      if (cached.count(k) && referenced.count(k)) marked.insert(k);
    }
    std::vector<hash::Hash128> covered;
    EXPECT_EQ(bm.EvictKeys(seed_keys, &covered), static_cast<int64_t>(want.size()));
    EXPECT_EQ(Values(bm.TakeEvictedKeys()), want) << "round " << round;
    EXPECT_EQ(Values(covered), doomed) << "round " << round;
    for (uint64_t k : want) cached.erase(k);
    for (uint64_t k = 1; k <= kN; ++k) {
      EXPECT_EQ(bm.IsCachedKey(K(k)), cached.count(k) > 0) << "key " << k << " round " << round;
    }
    // Commit half of the dropped keys again, as new sequences would.
    for (uint64_t k : want) {
      if (rng() % 2 == 0) {
        commit(k);
        bm.Release(block_of[k]);
      }
    }
    bm.TakeEvictedKeys();
  }
  // Released, a block an eviction met in use goes with its unreferenced cached descendants (the
  // referenced ones in turn at their release); the others stay cached.
  std::set<uint64_t> held = referenced;
  int64_t dropped_at_release = 0;
  for (uint64_t k : referenced) {
    held.erase(k);
    bm.Release(block_of[k]);
    std::set<uint64_t> gone;
    if (marked.count(k)) {
      for (uint64_t c : Closure({k}, cached, parent)) {
        if (!cached.count(c)) continue;
        if (held.count(c)) {
          marked.insert(c);
        } else {
          gone.insert(c);
        }
      }
    }
    EXPECT_EQ(Values(bm.TakeEvictedKeys()), gone) << "release of " << k;
    for (uint64_t c : gone) cached.erase(c);
    dropped_at_release += static_cast<int64_t>(gone.size());
  }
  EXPECT_GT(dropped_at_release, 0);  // the seeds do meet blocks in use
  for (uint64_t k = 1; k <= kN; ++k) EXPECT_EQ(bm.IsCachedKey(K(k)), cached.count(k) > 0) << k;
  bm.set_evict_listener([&](int32_t, const hash::Hash128& key, const hash::Hash128&,
                            const EvictionHints&) {
    for (uint64_t k : cached) {
      EXPECT_FALSE(parent[k] == key.lo && k != key.lo) << key.lo << " evicted before child " << k;
    }
    cached.erase(key.lo);
  });
  while (!cached.empty() && bm.AllocateFresh() >= 0) {
  }
  EXPECT_TRUE(cached.empty());
}

// The host tier's Erase of many keys at once drops exactly the host copies below them, whether
// or not a given key is on the host itself, through offloads and erases that reshape the tree.
TEST(HostTierTest, ManyKeyEraseDropsExactlyTheHostDescendants) {
  constexpr uint64_t kN = 300;
  std::mt19937 rng(8);
  const std::vector<uint64_t> parent = RandomForest(rng, kN);
  HostKvTier host = MakeHost(kN);
  std::set<uint64_t> on_host;
  auto offload = [&](uint64_t k) {
    host.Offload(static_cast<int32_t>(k), K(k), parent[k] == 0 ? hash::Hash128{} : K(parent[k]),
                 {});
    on_host.insert(k);
  };
  for (uint64_t k = 1; k <= kN; ++k) {
    if (rng() % 6 != 0) offload(k);  // the rest are on the GPU only, say
  }
  for (int round = 0; round < 4; ++round) {
    std::vector<uint64_t> seeds;
    for (int i = 0; i < 25; ++i) seeds.push_back(1 + rng() % kN);
    std::vector<hash::Hash128> seed_keys;
    for (uint64_t k : seeds) seed_keys.push_back(K(k));
    std::set<uint64_t> want;
    for (uint64_t k : Closure(seeds, on_host, parent)) {
      if (on_host.count(k)) want.insert(k);
    }
    host.TakeEvictedKeys();
    EXPECT_EQ(host.Erase(seed_keys), static_cast<int64_t>(want.size()));
    EXPECT_EQ(Values(host.TakeEvictedKeys()), want) << "round " << round;
    for (uint64_t k : want) on_host.erase(k);
    for (uint64_t k = 1; k <= kN; ++k) {
      EXPECT_EQ(host.Contains(K(k)), on_host.count(k) > 0) << "key " << k << " round " << round;
    }
    for (uint64_t k = 1; k <= kN; ++k) {
      if (!on_host.count(k) && rng() % 2 == 0) offload(k);
    }
  }
  EXPECT_EQ(host.Stats().used, static_cast<int64_t>(on_host.size()));
}

}  // namespace
}  // namespace cascade::engine
