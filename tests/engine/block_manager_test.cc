// Block pool and prefix cache: refcounts, exact lookup, LRU order (descendants first), admin
// eviction with descendants, and never handing out a referenced block.
#include "gpu_worker/engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace cascade::engine {
namespace {

hash::Hash128 K(uint64_t v) { return hash::Hash128{0, v}; }

TEST(BlockManagerTest, AllocatesEveryBlockOnceThenRunsOut) {
  BlockManager bm(4, 16);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(bm.AllocateFresh());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(bm.AllocateFresh(), -1);
  EXPECT_EQ(bm.NumAvailable(), 0);
}

TEST(BlockManagerTest, UnkeyedReleasedBlockIsFreeAndKeyedOneIsCachedUntilEvicted) {
  BlockManager bm(2, 4);
  int32_t a = bm.AllocateFresh(), b = bm.AllocateFresh();
  ASSERT_TRUE(bm.Commit(a, K(1), {}));
  bm.Release(a);
  bm.Release(b);
  EXPECT_EQ(bm.NumAvailable(), 2);
  EXPECT_EQ(bm.Lookup(K(1)), a);
  // The free block goes first; the cached one survives.
  EXPECT_EQ(bm.AllocateFresh(), b);
  EXPECT_EQ(bm.Lookup(K(1)), a);
  // Now the cached one is evicted to make room.
  EXPECT_EQ(bm.AllocateFresh(), a);
  EXPECT_FALSE(bm.Lookup(K(1)).has_value());
  EXPECT_EQ(bm.TakeEvictedKeys(), std::vector<hash::Hash128>{K(1)});
}

TEST(BlockManagerTest, AcquiringACachedBlockProtectsItFromEviction) {
  BlockManager bm(2, 4);
  int32_t a = bm.AllocateFresh();
  bm.Commit(a, K(1), {});
  bm.Release(a);
  EXPECT_EQ(bm.AcquireCached(K(1)), a);
  EXPECT_EQ(bm.RefCount(a), 1);
  int32_t b = bm.AllocateFresh();
  EXPECT_NE(b, a);
  EXPECT_EQ(bm.AllocateFresh(), -1);  // a is referenced: never handed out
}

TEST(BlockManagerTest, ReleasingLastFirstEvictsDescendantsBeforeAncestors) {
  BlockManager bm(3, 4);
  int32_t b0 = bm.AllocateFresh(), b1 = bm.AllocateFresh(), b2 = bm.AllocateFresh();
  bm.Commit(b0, K(10), {});
  bm.Commit(b1, K(11), K(10));
  bm.Commit(b2, K(12), K(11));
  bm.Release(b2);
  bm.Release(b1);
  bm.Release(b0);
  EXPECT_EQ(bm.AllocateFresh(), b2);
  EXPECT_EQ(bm.CountCachedPrefix(std::vector<hash::Hash128>{K(10), K(11), K(12)}), 2);
}

TEST(BlockManagerTest, DuplicateKeyStaysWithTheFirstBlock) {
  BlockManager bm(2, 4);
  int32_t a = bm.AllocateFresh(), b = bm.AllocateFresh();
  EXPECT_TRUE(bm.Commit(a, K(5), {}));
  EXPECT_FALSE(bm.Commit(b, K(5), {}));
  bm.Release(b);  // private block goes straight to the free list
  EXPECT_EQ(bm.NumCached(), 1);
  EXPECT_EQ(bm.Lookup(K(5)), a);
}

TEST(BlockManagerTest, EvictKeysDropsUnreferencedDescendantsToo) {
  BlockManager bm(4, 4);
  int32_t b0 = bm.AllocateFresh(), b1 = bm.AllocateFresh(), b2 = bm.AllocateFresh();
  int32_t other = bm.AllocateFresh();
  bm.Commit(b0, K(1), {});
  bm.Commit(b1, K(2), K(1));
  bm.Commit(b2, K(3), K(2));
  bm.Commit(other, K(9), {});
  for (int32_t b : {b2, b1, b0, other}) bm.Release(b);
  EXPECT_EQ(bm.EvictKeys(std::vector<hash::Hash128>{K(2)}), 2);  // K(2) and its child K(3)
  EXPECT_TRUE(bm.Lookup(K(1)).has_value());
  EXPECT_FALSE(bm.Lookup(K(2)).has_value());
  EXPECT_FALSE(bm.Lookup(K(3)).has_value());
  EXPECT_TRUE(bm.Lookup(K(9)).has_value());
}

TEST(BlockManagerTest, EvictKeysLeavesReferencedBlocksUntilReleased) {
  BlockManager bm(2, 4);
  int32_t a = bm.AllocateFresh();
  bm.Commit(a, K(1), {});
  bm.TakeEvictedKeys();
  EXPECT_EQ(bm.EvictKeys(std::vector<hash::Hash128>{K(1)}), 0);
  EXPECT_TRUE(bm.Lookup(K(1)).has_value());
  EXPECT_TRUE(bm.TakeEvictedKeys().empty());
  // Another reader takes it meanwhile: it stays until the last one lets go.
  EXPECT_EQ(bm.AcquireCached(K(1)), a);
  bm.Release(a);
  EXPECT_TRUE(bm.Lookup(K(1)).has_value());
  bm.Release(a);
  EXPECT_FALSE(bm.Lookup(K(1)).has_value());
  EXPECT_EQ(bm.TakeEvictedKeys(), std::vector<hash::Hash128>{K(1)});
  EXPECT_EQ(bm.NumCached(), 0);
  EXPECT_EQ(bm.NumAvailable(), 2);
  // Freed, not cached: the next two allocations get both blocks without evicting anything.
  EXPECT_GE(bm.AllocateFresh(), 0);
  EXPECT_GE(bm.AllocateFresh(), 0);
  EXPECT_TRUE(bm.TakeEvictedKeys().empty());
}

// A registry eviction of a prefix whose last block a live sequence still reads: the unreferenced
// ancestors go at once, the block in use (unreachable now: no lookup passes its dropped parent) at
// its release, with the block the sequence committed below it in the meantime.
TEST(BlockManagerTest, BlockInUseBelowAnEvictedPrefixGoesWhenReleased) {
  BlockManager bm(4, 4);
  int32_t b0 = bm.AllocateFresh(), b1 = bm.AllocateFresh();
  bm.Commit(b0, K(1), {});
  bm.Commit(b1, K(2), K(1));
  bm.Release(b0);  // the sequence still holds b1
  bm.TakeEvictedKeys();
  EXPECT_EQ(bm.EvictKeys(std::vector<hash::Hash128>{K(1)}), 1);
  EXPECT_EQ(bm.TakeEvictedKeys(), std::vector<hash::Hash128>{K(1)});
  EXPECT_EQ(bm.CountCachedPrefix(std::vector<hash::Hash128>{K(1), K(2)}), 0);
  int32_t b2 = bm.AllocateFresh();  // the sequence goes on below its block
  ASSERT_TRUE(bm.Commit(b2, K(3), K(2)));
  bm.Release(b2);
  EXPECT_TRUE(bm.IsCachedKey(K(3)));
  bm.Release(b1);
  EXPECT_FALSE(bm.IsCachedKey(K(2)));
  EXPECT_FALSE(bm.IsCachedKey(K(3)));
  std::vector<hash::Hash128> gone = bm.TakeEvictedKeys();
  std::sort(gone.begin(), gone.end());
  EXPECT_EQ(gone, (std::vector<hash::Hash128>{K(2), K(3)}));
  EXPECT_EQ(bm.NumCached(), 0);
  EXPECT_EQ(bm.NumAvailable(), 4);
}

// Two finished chains (a: 3 blocks, then b: 2) and a loose leaf: the walk names what eviction
// then takes, in the same order, a chain tail first; a referenced ancestor ends its chain's run.
TEST(BlockManagerTest, ForNextVictimsNamesTheBlocksEvictionTakesInOrder) {
  BlockManager bm(6, 4);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 3; ++i) a.push_back(bm.AllocateFresh());
  for (int i = 0; i < 2; ++i) b.push_back(bm.AllocateFresh());
  const int32_t c = bm.AllocateFresh();
  bm.Commit(a[0], K(10), {});
  bm.Commit(a[1], K(11), K(10));
  bm.Commit(a[2], K(12), K(11));
  bm.Commit(b[0], K(20), {});
  bm.Commit(b[1], K(21), K(20));
  bm.Commit(c, K(30), {});
  for (int32_t x : a) bm.Release(x);  // a sequence releases its blocks root first
  for (int32_t x : b) bm.Release(x);
  bm.Release(c);
  auto walk = [&](int64_t n) {
    std::vector<int32_t> got;
    bm.ForNextVictims(n, [&](int32_t block, const hash::Hash128& key, const hash::Hash128& parent,
                             const EvictionHints&) {
      EXPECT_EQ(bm.Lookup(key), block);
      if (block == a[1]) {
        EXPECT_EQ(parent, K(10));
      }
      got.push_back(block);
      return true;
    });
    return got;
  };
  const std::vector<int32_t> predicted = walk(10);
  EXPECT_EQ(predicted, (std::vector<int32_t>{a[2], a[1], a[0], b[1], b[0], c}));
  EXPECT_EQ(walk(4), (std::vector<int32_t>{a[2], a[1], a[0], b[1]}));
  EXPECT_TRUE(walk(0).empty());
  // f may stop the walk.
  int calls = 0;
  bm.ForNextVictims(10, [&](int32_t, const hash::Hash128&, const hash::Hash128&,
                            const EvictionHints&) { return ++calls < 2; });
  EXPECT_EQ(calls, 2);
  // A hit on a's root: the run stops below it, and b follows.
  bm.AcquireCached(K(10));
  EXPECT_EQ(walk(10), (std::vector<int32_t>{a[2], a[1], b[1], b[0], c}));
  bm.Release(a[0]);
  // The root, released last, is now newer than the other chains: a's tail run goes first
  // (its leaf is the oldest), the root after everything else.
  std::vector<int32_t> evicted;
  const std::vector<int32_t> expect = walk(10);
  for (size_t i = 0; i < expect.size(); ++i) evicted.push_back(bm.AllocateFresh());
  EXPECT_EQ(evicted, (std::vector<int32_t>{a[2], a[1], b[1], b[0], c, a[0]}));
  EXPECT_EQ(expect, (std::vector<int32_t>{a[2], a[1], a[0], b[1], b[0], c}))
      << "the walk is an estimate: a parent follows its last child at once";
}

// The walk goes up a chain through each block's parent, found from a hint recorded at commit:
// where the parent was cached only after its child (no hint), and where the block that held the
// parent's key at the child's commit holds another key since, the walk still finds the parent's
// block, and eviction's leaf bookkeeping (a parent becoming a leaf) follows it too.
TEST(BlockManagerTest, ForNextVictimsFindsParentsCachedAfterOrElsewhere) {
  BlockManager bm(4, 4);
  const int32_t child = bm.AllocateFresh(), parent = bm.AllocateFresh();
  bm.Commit(child, K(2), K(1));  // K(1) is not cached yet: no hint
  bm.Commit(parent, K(1), {});
  bm.Release(parent);
  bm.Release(child);
  auto walk = [&] {
    std::vector<int32_t> got;
    bm.ForNextVictims(
        10, [&](int32_t block, const hash::Hash128&, const hash::Hash128&, const EvictionHints&) {
          got.push_back(block);
          return true;
        });
    return got;
  };
  EXPECT_EQ(walk(), (std::vector<int32_t>{child, parent}));
  // The parent's key dropped (with its descendant) and cached again in another block under a new
  // child: the new child's hint is right, the walk names the new blocks.
  bm.EvictKeys(std::vector<hash::Hash128>{K(1)});
  EXPECT_FALSE(bm.IsCachedKey(K(2)));
  const int32_t p2 = bm.AllocateFresh(), c2 = bm.AllocateFresh();
  bm.Commit(p2, K(1), {});
  bm.Commit(c2, K(3), K(1));
  bm.Release(c2);
  bm.Release(p2);
  EXPECT_EQ(walk(), (std::vector<int32_t>{c2, p2}));
  // Evicting the child makes the parent a leaf, found through the hint: taken next.
  while (bm.NumFree() > 0) bm.AllocateFresh();  // held: the next allocation evicts
  EXPECT_EQ(bm.AllocateFresh(), c2);
  EXPECT_EQ(walk(), (std::vector<int32_t>{p2}));
  EXPECT_EQ(bm.AllocateFresh(), p2);
}

// A parent taken while its child is in use (no unreferenced leaf left: the fallback victim) and
// its block reused for another key: the child's hint names a block that no longer holds the
// parent's key, so the walk stops at the child instead of walking into that block.
TEST(BlockManagerTest, ForNextVictimsIgnoresAStaleParentHint) {
  BlockManager bm(2, 4);
  const int32_t parent = bm.AllocateFresh(), child = bm.AllocateFresh();
  bm.Commit(parent, K(1), {});
  bm.Commit(child, K(2), K(1));
  bm.Release(parent);
  const int32_t other = bm.AllocateFresh();  // evicts the parent, the only unreferenced block
  ASSERT_EQ(other, parent);
  EXPECT_FALSE(bm.IsCachedKey(K(1)));
  bm.Commit(other, K(9), {});
  bm.Release(other);
  bm.Release(child);
  std::vector<int32_t> got;
  bm.ForNextVictims(
      10, [&](int32_t block, const hash::Hash128&, const hash::Hash128&, const EvictionHints&) {
        got.push_back(block);
        return true;
      });
  EXPECT_EQ(got, (std::vector<int32_t>{other, child}));
}

TEST(BlockManagerTest, ReuseListenerHearsOfEveryBlockHandedOut) {
  BlockManager bm(2, 4);
  std::vector<int32_t> heard;
  bm.set_reuse_listener([&](int32_t block) { heard.push_back(block); });
  const int32_t x = bm.AllocateFresh(), y = bm.AllocateFresh();
  bm.Commit(x, K(1), {});
  bm.Release(x);
  EXPECT_EQ(bm.NumFree(), 0);
  const int32_t z = bm.AllocateFresh();  // evicts x
  EXPECT_EQ(z, x);
  bm.Release(y);
  EXPECT_EQ(bm.NumFree(), 1);
  EXPECT_EQ(bm.AllocateFresh(), y);  // from the free list
  EXPECT_EQ(heard, (std::vector<int32_t>{x, y, x, y}));
}

// Uses: the prefix hits on a block (AcquireCached) and the restores into it (NoteUse) since it
// was handed out; the evict listener still sees a victim's count, and a block handed out again
// starts from zero (the host tier's write policy reads it).
TEST(BlockManagerTest, UsesCountHitsSinceTheBlockWasHandedOut) {
  BlockManager bm(2, 4);
  const int32_t a = bm.AllocateFresh();
  EXPECT_EQ(bm.Uses(a), 0);
  bm.Commit(a, K(1), {});
  bm.Release(a);
  EXPECT_EQ(bm.Uses(a), 0);  // computed, cached, not taken again yet
  EXPECT_EQ(bm.AcquireCached(K(1)), a);
  EXPECT_EQ(bm.AcquireCached(K(1)), a);  // two sequences on it at once
  EXPECT_EQ(bm.Uses(a), 2);
  bm.Release(a);
  bm.Release(a);
  int32_t victim_uses = -1;
  bm.set_evict_listener([&](int32_t block, const hash::Hash128&, const hash::Hash128&,
                            const EvictionHints&) { victim_uses = bm.Uses(block); });
  const int32_t b = bm.AllocateFresh();  // from the free list
  EXPECT_EQ(victim_uses, -1);
  const int32_t c = bm.AllocateFresh();  // evicts a
  EXPECT_EQ(c, a);
  EXPECT_EQ(victim_uses, 2);
  EXPECT_EQ(bm.Uses(c), 0);
  bm.NoteUse(b);  // (a restore into b)
  EXPECT_EQ(bm.Uses(b), 1);
}

}  // namespace
}  // namespace cascade::engine
