// The hash definition: chaining, salts, positions, hex round trip, and a pinned known answer so
// that any change to the byte layout (which would split caches across versions) is caught.
#include "common/chunk_hash.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cascade::hash {
namespace {

TEST(ChunkHashTest, SameChunksAfterSamePrefixGiveSameHashes) {
  std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
  std::vector<ChunkSpec> chunks = {{1, a, ""}, {3, b, ""}};
  auto p1 = PlaceChunks("m", "", chunks);
  auto p2 = PlaceChunks("m", "", chunks);
  ASSERT_EQ(p1.size(), 2u);
  EXPECT_EQ(p1[0].hash, p2[0].hash);
  EXPECT_EQ(p1[1].hash, p2[1].hash);
  EXPECT_NE(p1[0].hash, p1[1].hash);
}

TEST(ChunkHashTest, SameChunkAfterDifferentPrefixGetsDifferentHash) {
  std::vector<int32_t> a = {1, 2, 3}, a2 = {1, 2, 4}, b = {4, 5};
  auto p1 = PlaceChunks("m", "", std::vector<ChunkSpec>{{1, a, ""}, {3, b, ""}});
  auto p2 = PlaceChunks("m", "", std::vector<ChunkSpec>{{1, a2, ""}, {3, b, ""}});
  EXPECT_NE(p1[1].hash, p2[1].hash);
}

TEST(ChunkHashTest, ModelSaltAndKindChangeTheHash) {
  std::vector<int32_t> a = {1, 2, 3};
  std::vector<ChunkSpec> c = {{1, a, ""}};
  Hash128 base = PlaceChunks("m", "", c)[0].hash;
  EXPECT_NE(base, PlaceChunks("other", "", c)[0].hash);
  EXPECT_NE(base, PlaceChunks("m", "tenant", c)[0].hash);
  EXPECT_NE(base, PlaceChunks("m", "", std::vector<ChunkSpec>{{2, a, ""}})[0].hash);
  EXPECT_NE(base, PlaceChunks("m", "", std::vector<ChunkSpec>{{1, a, "x"}})[0].hash);
}

TEST(ChunkHashTest, PerChunkSaltIsolatesThatChunkAndLaterOnesOnly) {
  std::vector<int32_t> sys = {7, 8, 9}, ctx = {10, 11};
  auto t1 = PlaceChunks("m", "", std::vector<ChunkSpec>{{1, sys, ""}, {2, ctx, "tenant-a"}});
  auto t2 = PlaceChunks("m", "", std::vector<ChunkSpec>{{1, sys, ""}, {2, ctx, "tenant-b"}});
  EXPECT_EQ(t1[0].hash, t2[0].hash);  // shared system chunk
  EXPECT_NE(t1[1].hash, t2[1].hash);  // private context
}

TEST(ChunkHashTest, PositionsAreContinuousFromZero) {
  std::vector<int32_t> a(5, 1), b(0), c(7, 2);
  auto p = PlaceChunks("m", "", std::vector<ChunkSpec>{{1, a, ""}, {2, b, ""}, {3, c, ""}});
  EXPECT_EQ(p[0].start, 0);
  EXPECT_EQ(p[0].end, 5);
  EXPECT_EQ(p[1].start, 5);
  EXPECT_EQ(p[1].end, 5);
  EXPECT_EQ(p[2].start, 5);
  EXPECT_EQ(p[2].end, 12);
}

TEST(ChunkHashTest, BlockKeysChainAcrossChunkBoundariesAndIgnorePartialBlock) {
  std::vector<int32_t> a = {1, 2, 3}, b = {4, 5, 6, 7, 8};
  auto keys = BlockKeys("m", "", std::vector<ChunkSpec>{{1, a, ""}, {3, b, ""}}, 3);
  ASSERT_EQ(keys.size(), 2u);  // 8 tokens: two full blocks of 3
  std::vector<int32_t> blk0 = {1, 2, 3}, blk1 = {4, 5, 6};
  Hash128 k0 = BlockHash({}, "m", {}, blk0);
  EXPECT_EQ(keys[0], k0);
  EXPECT_EQ(keys[1], BlockHash(k0, "m", {}, blk1));
  // Same tokens, split differently into chunks: same block keys (KV depends on tokens only).
  std::vector<int32_t> whole = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(keys, BlockKeys("m", "", std::vector<ChunkSpec>{{4, whole, ""}}, 3));
}

TEST(ChunkHashTest, SaltedChunkSaltsTheBlockItEndsIn) {
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6};
  auto plain = BlockKeys("m", "", std::vector<ChunkSpec>{{1, a, ""}, {3, b, ""}}, 3);
  auto salted = BlockKeys("m", "", std::vector<ChunkSpec>{{1, a, ""}, {3, b, "s"}}, 3);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0], salted[0]);  // block [1,2,3]: before the salted chunk
  EXPECT_NE(plain[1], salted[1]);  // block [4,5,6] ends inside the salted chunk
}

TEST(ChunkHashTest, BlockKeysFromPlacedChunksEqualBlockKeysFromScratch) {
  // The worker places the chunks once (checking the gateway's hashes) and derives the block keys
  // from that placement: it must give exactly the keys of the one-shot form, salts included.
  std::vector<int32_t> a = {1, 2, 3, 4, 5}, b = {6, 7, 8}, c = {9, 10, 11, 12, 13, 14};
  const std::vector<ChunkSpec> chunks = {{1, a, ""}, {2, b, "tenant"}, {3, c, ""}};
  const auto placed = PlaceChunks("m", "request-salt", chunks);
  for (int bs : {1, 2, 3, 4, 16}) {
    EXPECT_EQ(BlockKeys("m", placed, chunks, bs), BlockKeys("m", "request-salt", chunks, bs))
        << "block size " << bs;
  }
  // A placement under another salt gives other keys: the placement is what is used.
  EXPECT_NE(BlockKeys("m", PlaceChunks("m", "", chunks), chunks, 2),
            BlockKeys("m", "request-salt", chunks, 2));
}

TEST(ChunkHashTest, SpecsOfViewsAnyChunkTypeWithKindTokensAndSalt) {
  struct Mine {
    int32_t kind;
    std::vector<int32_t> tokens;
    std::string cache_salt;
  };
  const std::vector<Mine> mine = {{1, {1, 2}, ""}, {3, {4}, "s"}};
  const std::vector<ChunkSpec> specs = SpecsOf(mine);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[1].kind, 3);
  EXPECT_EQ(specs[1].tokens.data(), mine[1].tokens.data());
  EXPECT_EQ(specs[1].cache_salt, "s");
  EXPECT_EQ(
      PlaceChunks("m", "", specs)[1].hash,
      PlaceChunks("m", "",
                  std::vector<ChunkSpec>{{1, mine[0].tokens, ""}, {3, mine[1].tokens, "s"}})[1]
          .hash);
}

TEST(ChunkHashTest, HexRoundTripAndRejectsGarbage) {
  Hash128 h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(h.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(Hash128::FromHex(h.ToHex()), h);
  EXPECT_EQ(Hash128::FromHex("0123456789ABCDEFFEDCBA9876543210"), h);
  EXPECT_FALSE(Hash128::FromHex("xyz").has_value());
  EXPECT_FALSE(Hash128::FromHex("0123456789abcdeffedcba987654321g").has_value());
}

// Pinned answer: SHA-256 of the documented layout. If this changes, caches written by an older
// build no longer match; bump the domain tag instead of changing the layout silently.
TEST(ChunkHashTest, KnownAnswerPinsTheByteLayout) {
  std::vector<int32_t> t = {1, 2, 3};
  Hash128 h = ChunkHash({}, "qwen3", {}, 1, t);
  EXPECT_EQ(h.ToHex(), "7f14dbf1f9cbcd9e48372455205fa2ca");
}

}  // namespace
}  // namespace cascade::hash
