// The receiver's checks of a peer KV transfer without a network: CRC-32C against its published
// check value (both the SSE4.2 and the table path give it), and the verifier's verdicts for a
// good stream and for each kind of bad one.
#include "gpu_worker/service/kv_transfer.h"

#include <gtest/gtest.h>

#include <string>

namespace cascade::worker {
namespace {

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

TEST(KvTransferTest, Crc32cMatchesTheCastagnoliCheckValue) {
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
  // Continuing a CRC over a split input gives the CRC of the whole, at every split and length
  // (the 8-byte path and the byte tail both run).
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32c(Bytes(s.substr(cut)), Crc32c(Bytes(s.substr(0, cut)))), Crc32c(Bytes(s)))
        << cut;
  }
}

struct Chain {
  std::vector<hash::Hash128> keys = {{1, 2}, {3, 4}, {5, 6}};
  std::vector<std::string> data = {std::string(64, 'a'), std::string(64, 'b'),
                                   std::string(64, 'c')};
  FetchVerifier Verifier() const { return FetchVerifier(keys, {9, 9}, 64); }
  uint32_t Crc(int i) const { return BlockChecksum(keys[i], Bytes(data[i])); }
};

TEST(KvTransferTest, AGoodStreamYieldsTheChainedBlocks) {
  Chain c;
  FetchVerifier v = c.Verifier();
  ASSERT_TRUE(v.OnHeader(3, 64));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(v.OnBlock(i, c.keys[i].ToHex(), c.data[i], c.Crc(i)));
  FetchOutcome o = std::move(v).Finish(absl::OkStatus());
  ASSERT_EQ(o.result, FetchResult::kOk) << o.detail;
  ASSERT_EQ(o.blocks.size(), 3u);
  EXPECT_EQ(o.blocks[0].parent, (hash::Hash128{9, 9}));
  EXPECT_EQ(o.blocks[2].parent, c.keys[1]);
  EXPECT_EQ(o.blocks[1].bytes, c.data[1]);
  EXPECT_EQ(o.bytes, 192);
}

TEST(KvTransferTest, EveryBadStreamIsRefusedWithItsReason) {
  Chain c;
  const auto run = [&](auto feed, absl::Status end = absl::OkStatus()) {
    FetchVerifier v = c.Verifier();
    feed(v);
    FetchOutcome o = std::move(v).Finish(end);
    EXPECT_TRUE(o.blocks.empty());
    return o.result;
  };
  std::string flipped = c.data[1];
  flipped[10] ^= 1;
  EXPECT_EQ(run([&](FetchVerifier& v) {
              v.OnHeader(3, 64);
              v.OnBlock(0, c.keys[0].ToHex(), c.data[0], c.Crc(0));
              v.OnBlock(1, c.keys[1].ToHex(), flipped, c.Crc(1));
            }),
            FetchResult::kChecksum);
  // Right bytes and checksum, but under another block's key: the checksum covers the key.
  EXPECT_EQ(run([&](FetchVerifier& v) {
              v.OnHeader(3, 64);
              v.OnBlock(0, c.keys[1].ToHex(), c.data[0], c.Crc(0));
            }),
            FetchResult::kWrongKey);
  EXPECT_EQ(run([&](FetchVerifier& v) {
              v.OnHeader(3, 64);
              v.OnBlock(1, c.keys[1].ToHex(), c.data[1], c.Crc(1));
            }),
            FetchResult::kWrongKey);
  EXPECT_EQ(run([&](FetchVerifier& v) {
              v.OnHeader(3, 64);
              v.OnBlock(0, c.keys[0].ToHex(), c.data[0].substr(1), c.Crc(0));
            }),
            FetchResult::kBadSize);
  EXPECT_EQ(run([&](FetchVerifier& v) { v.OnHeader(4, 64); }), FetchResult::kBadSize);
  EXPECT_EQ(run([&](FetchVerifier& v) { v.OnHeader(3, 32); }), FetchResult::kBadSize);
  EXPECT_EQ(run([&](FetchVerifier& v) {
              v.OnHeader(3, 64);
              v.OnBlock(0, c.keys[0].ToHex(), c.data[0], c.Crc(0));
            }),
            FetchResult::kTruncated);
  EXPECT_EQ(run([](FetchVerifier&) {}), FetchResult::kTruncated);
  EXPECT_EQ(run([](FetchVerifier& v) { v.OnHeader(0, 64); }), FetchResult::kNotHeld);
  const auto good_then = [&](absl::Status end) {
    return run(
        [&](FetchVerifier& v) {
          v.OnHeader(3, 64);
          v.OnBlock(0, c.keys[0].ToHex(), c.data[0], c.Crc(0));
        },
        end);
  };
  EXPECT_EQ(good_then(absl::DeadlineExceededError("late")), FetchResult::kDeadline);
  EXPECT_EQ(good_then(absl::UnavailableError("gone")), FetchResult::kUnavailable);
  EXPECT_EQ(good_then(absl::FailedPreconditionError("layout")), FetchResult::kRefused);
  EXPECT_EQ(good_then(absl::CancelledError("by us")), FetchResult::kCancelled);
}

}  // namespace
}  // namespace cascade::worker
