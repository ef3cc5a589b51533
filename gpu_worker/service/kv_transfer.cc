// Peer fetch checks and CRC-32C; see kv_transfer.h.
#include "gpu_worker/service/kv_transfer.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace cascade::worker {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // CRC-32C, reflected

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t Crc32cTable(const unsigned char* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// One dependent chain of 8-byte crc32 instructions: about 8 GB/s, well above what a transfer
// over the network brings, so it is not worth interleaving streams.
__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const unsigned char* p, size_t n,
                                                    uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}
#endif

}  // namespace

uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  crc = hw ? Crc32cHw(p, data.size(), crc) : Crc32cTable(p, data.size(), crc);
#else
  crc = Crc32cTable(p, data.size(), crc);
#endif
  return ~crc;
}

uint32_t BlockChecksum(const hash::Hash128& key, std::span<const std::byte> data) {
  std::array<std::byte, 16> k;
  for (int i = 0; i < 8; ++i) {
    k[i] = static_cast<std::byte>(key.hi >> (56 - 8 * i));
    k[8 + i] = static_cast<std::byte>(key.lo >> (56 - 8 * i));
  }
  return Crc32c(k, Crc32c(data));
}

std::string_view FetchResultName(FetchResult r) {
  switch (r) {
    case FetchResult::kOk:
      return "ok";
    case FetchResult::kNotHeld:
      return "not_held";
    case FetchResult::kChecksum:
      return "checksum";
    case FetchResult::kWrongKey:
      return "wrong_key";
    case FetchResult::kBadSize:
      return "bad_size";
    case FetchResult::kTruncated:
      return "truncated";
    case FetchResult::kDeadline:
      return "deadline";
    case FetchResult::kUnavailable:
      return "unavailable";
    case FetchResult::kRefused:
      return "refused";
    case FetchResult::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

FetchVerifier::FetchVerifier(std::vector<hash::Hash128> keys, hash::Hash128 first_parent,
                             int64_t block_bytes)
    : keys_(std::move(keys)), first_parent_(first_parent), block_bytes_(block_bytes) {}

bool FetchVerifier::Fail(FetchResult r, std::string detail) {
  if (!failed_) {
    failed_ = true;
    out_.result = r;
    out_.detail = std::move(detail);
  }
  return false;
}

bool FetchVerifier::OnHeader(int64_t blocks, int64_t block_bytes) {
  if (failed_) return false;
  if (have_header_) return Fail(FetchResult::kWrongKey, "a second header");
  have_header_ = true;
  if (block_bytes != block_bytes_) {
    return Fail(FetchResult::kBadSize, absl::StrCat("the holder's blocks are ", block_bytes,
                                                    " bytes, this worker's ", block_bytes_));
  }
  if (blocks < 0 || blocks > static_cast<int64_t>(keys_.size())) {
    return Fail(FetchResult::kBadSize, absl::StrCat("the header announces ", blocks,
                                                    " blocks for a request of ", keys_.size()));
  }
  announced_ = blocks;
  return true;
}

bool FetchVerifier::OnBlock(int64_t index, std::string_view key_hex, std::string data,
                            uint32_t crc32c) {
  if (failed_) return false;
  const int64_t i = static_cast<int64_t>(out_.blocks.size());
  if (!have_header_) return Fail(FetchResult::kWrongKey, "a block before the header");
  if (index != i || i >= announced_) {
    return Fail(FetchResult::kWrongKey, absl::StrCat("block index ", index, " where ", i,
                                                     " was due (", announced_, " announced)"));
  }
  const std::optional<hash::Hash128> key = hash::Hash128::FromHex(key_hex);
  if (!key || *key != keys_[i]) {
    return Fail(FetchResult::kWrongKey,
                absl::StrCat("block ", i, " carries key '", std::string(key_hex.substr(0, 32)),
                             "', expected ", keys_[i].ToHex()));
  }
  if (static_cast<int64_t>(data.size()) != block_bytes_) {
    return Fail(FetchResult::kBadSize,
                absl::StrCat("block ", i, " has ", data.size(), " bytes, not ", block_bytes_));
  }
  const uint32_t got = BlockChecksum(*key, std::as_bytes(std::span(data)));
  if (got != crc32c) {
    return Fail(FetchResult::kChecksum, absl::StrCat("block ", i, " checksum ", absl::Hex(got),
                                                     " != sent ", absl::Hex(crc32c)));
  }
  out_.bytes += static_cast<int64_t>(data.size());
  out_.blocks.push_back({*key, i == 0 ? first_parent_ : keys_[i - 1], std::move(data)});
  return true;
}

FetchOutcome FetchVerifier::Finish(const absl::Status& status) && {
  if (!failed_ && !status.ok()) {
    FetchResult r = FetchResult::kUnavailable;
    switch (status.code()) {
      case absl::StatusCode::kDeadlineExceeded:
        r = FetchResult::kDeadline;
        break;
      case absl::StatusCode::kCancelled:
        r = FetchResult::kCancelled;
        break;
      case absl::StatusCode::kFailedPrecondition:
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kPermissionDenied:
      case absl::StatusCode::kUnauthenticated:
      case absl::StatusCode::kUnimplemented:
        r = FetchResult::kRefused;
        break;
      default:
        break;
    }
    Fail(r, status.ToString());
  }
  if (!failed_ && !have_header_) Fail(FetchResult::kTruncated, "the stream ended before a header");
  if (!failed_ && static_cast<int64_t>(out_.blocks.size()) < announced_) {
    Fail(FetchResult::kTruncated, absl::StrCat("the stream ended after ", out_.blocks.size(),
                                               " of ", announced_, " announced blocks"));
  }
  if (!failed_ && announced_ == 0) Fail(FetchResult::kNotHeld, "the holder has none of the blocks");
  if (failed_) out_.blocks.clear();
  return std::move(out_);
}

}  // namespace cascade::worker
