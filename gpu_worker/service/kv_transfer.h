// The receiving side's checks of a peer KV fetch (FetchKv), without gRPC: each block must arrive
// in order, carry the key this prompt gives it, be one block long and match its CRC-32C (over
// its bytes and its key), and the stream must bring every block its header announced. The first
// failure names the reason; only a transfer that passed all of it is used.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/chunk_hash.h"
#include "gpu_worker/engine/types.h"

namespace cascade::worker {

// CRC-32C (Castagnoli, reflected 0x82F63B78, as iSCSI and ext4 use) of `data`, continuing from
// `crc` (0 to start). SSE4.2's crc32 instruction where the CPU has it, a table otherwise.
uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc = 0);

// The checksum a FetchKvBlock carries: CRC-32C of the block's bytes, then its key's 16 bytes
// (hi then lo, big-endian), so bytes paired with the wrong key fail too.
uint32_t BlockChecksum(const hash::Hash128& key, std::span<const std::byte> data);

// Why a fetch was not used (or kOk). Names are the metric's `result` label.
enum class FetchResult {
  kOk,
  kNotHeld,      // the holder has none of the blocks (any more)
  kChecksum,     // a block's bytes do not match its checksum
  kWrongKey,     // a block's key is not the one asked for at its index, or out of order
  kBadSize,      // a block of the wrong length, or a header that does not fit the request
  kTruncated,    // the stream ended before every announced block arrived
  kDeadline,     // the fetch ran past its deadline
  kUnavailable,  // the holder could not be reached or went away mid-transfer
  kRefused,      // the holder refused (other model or layout, not allowed)
  kCancelled,    // the request was cancelled while fetching
};
std::string_view FetchResultName(FetchResult r);
inline constexpr FetchResult kAllFetchResults[] = {
    FetchResult::kOk,       FetchResult::kNotHeld,     FetchResult::kChecksum,
    FetchResult::kWrongKey, FetchResult::kBadSize,     FetchResult::kTruncated,
    FetchResult::kDeadline, FetchResult::kUnavailable, FetchResult::kRefused,
    FetchResult::kCancelled};

// Where a fetch's time went, on the receiver's clock (ms from the call's start), for the log and
// benchmarks.
struct FetchTimings {
  double header_ms = 0;       // the header arrived
  double first_block_ms = 0;  // the first block arrived
  double last_block_ms = 0;   // the last block arrived
  double end_ms = 0;          // the stream ended
  double verify_ms = 0;       // spent in the checks (key, size, CRC-32C), summed
  int64_t messages = 0;       // messages read
};

struct FetchOutcome {
  FetchResult result = FetchResult::kOk;
  std::string detail;                     // what failed, for the log
  std::vector<engine::PeerBlock> blocks;  // verified, in order; empty unless kOk
  int64_t bytes = 0;                      // block bytes received
  FetchTimings timings;
};

// Not thread-safe: one per fetch, fed by its reader in stream order.
class FetchVerifier {
 public:
  // `keys`: the blocks asked for, in order; `first_parent`: the key before keys[0] (zero when
  // keys[0] is block 0); `block_bytes`: this worker's block size in bytes.
  FetchVerifier(std::vector<hash::Hash128> keys, hash::Hash128 first_parent, int64_t block_bytes);

  // Each returns false at the first failure (stop reading then; Finish says why).
  bool OnHeader(int64_t blocks, int64_t block_bytes);
  bool OnBlock(int64_t index, std::string_view key_hex, std::string data, uint32_t crc32c);
  // The outcome once the stream ended with `status` (the transport's, mapped from gRPC).
  FetchOutcome Finish(const absl::Status& status) &&;

 private:
  bool Fail(FetchResult r, std::string detail);

  const std::vector<hash::Hash128> keys_;
  const hash::Hash128 first_parent_;
  const int64_t block_bytes_;
  bool have_header_ = false;
  int64_t announced_ = 0;
  FetchOutcome out_;
  bool failed_ = false;
};

}  // namespace cascade::worker
