// The receiver's checks of a peer KV transfer without a network: CRC-32C against its published
// check value (both the SSE4.2 and the table path give it), and the verifier's verdicts for a
// good stream and for each kind of bad one; the holder's raw block messages (kv_serve.h) parse
// as the protobuf message, and a corrupted or cut one is refused.
#include "gpu_worker/service/kv_transfer.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>

#include "gpu_worker/service/kv_serve.h"

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

// The wire bytes of a raw message, and its parse as the receiver's stub does it.
std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST(KvTransferTest, RawBlockMessageParsesAsTheProtobufMessageWouldAndPassesTheChecks) {
  const hash::Hash128 key{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  // Lengths around the varint steps (127/128, 16383/16384) and one of a real block's size.
  for (size_t n : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384},
                   size_t{3} << 20}) {
    for (int64_t index : {0, 1, 300}) {
      std::string data(n, '\0');
      for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 131 + index);
      const uint32_t crc = BlockChecksum(key, Bytes(data));
      cascade::v2::FetchKvResponse want;
      want.mutable_block()->set_index(index);
      want.mutable_block()->set_key(key.ToHex());
      want.mutable_block()->set_data(data);
      want.mutable_block()->set_crc32c(crc);
      const std::string wire = Flatten(BlockMessage(index, key.ToHex(), crc, data));
      EXPECT_EQ(wire.size(), want.ByteSizeLong()) << n << " " << index;
      cascade::v2::FetchKvResponse got;
      ASSERT_TRUE(got.ParseFromString(wire)) << n << " " << index;
      ASSERT_TRUE(got.has_block());
      EXPECT_EQ(got.block().index(), index);
      EXPECT_EQ(got.block().key(), key.ToHex());
      EXPECT_EQ(got.block().crc32c(), crc);
      EXPECT_TRUE(got.block().data() == data) << n << " " << index;
      if (n == 0 || index != 0) continue;
      FetchVerifier v({key}, {}, static_cast<int64_t>(n));
      ASSERT_TRUE(v.OnHeader(1, static_cast<int64_t>(n)));
      EXPECT_TRUE(v.OnBlock(0, got.block().key(), got.block().data(), got.block().crc32c()));
      EXPECT_EQ(std::move(v).Finish(absl::OkStatus()).result, FetchResult::kOk);
    }
  }
}

TEST(KvTransferTest, AByteFlippedInARawBlockMessageIsCaughtByItsChecksum) {
  const hash::Hash128 key{7, 8};
  std::string data(4096, 'k');
  const uint32_t crc = BlockChecksum(key, Bytes(data));
  data[1234] ^= 0x01;  // after the checksum, as the holder's corrupt_block fault does
  cascade::v2::FetchKvResponse got;
  ASSERT_TRUE(got.ParseFromString(Flatten(BlockMessage(0, key.ToHex(), crc, data))));
  FetchVerifier v({key}, {}, 4096);
  ASSERT_TRUE(v.OnHeader(1, 4096));
  EXPECT_FALSE(v.OnBlock(0, got.block().key(), got.block().data(), got.block().crc32c()));
  EXPECT_EQ(std::move(v).Finish(absl::OkStatus()).result, FetchResult::kChecksum);
}

TEST(KvTransferTest, ARawBlockMessageCutShortDoesNotParse) {
  const hash::Hash128 key{7, 8};
  const std::string data(4096, 'k');
  const std::string wire = Flatten(BlockMessage(3, key.ToHex(), 99, data));
  cascade::v2::FetchKvResponse got;
  ASSERT_TRUE(got.ParseFromString(wire));
  // Cut inside the head, inside the data, and just before the end.
  for (size_t keep : {size_t{3}, size_t{40}, wire.size() / 2, wire.size() - 1}) {
    EXPECT_FALSE(got.ParseFromString(wire.substr(0, keep))) << keep;
  }
}

}  // namespace
}  // namespace cascade::worker
