// cascade-registry's flags and their ranges; see registry_flags.h.
#include "cache_service/server/registry_flags.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cache_service/wire/registry_wire.h"

namespace cascade::registry {
namespace {

// Upper bounds: far above any deployment's need, far below overflow and silly allocations.
constexpr int64_t kMaxLeaseMs = 24 * 3600 * 1000;  // a day
constexpr int64_t kMaxChunks = 1'000'000'000;
constexpr int64_t kMaxShards = 4096;  // each shard is a mutex, a map and a list, made at start
constexpr int64_t kMaxChunksPerRequest = 1 << 20;
constexpr int64_t kMaxTokensPerRequest = int64_t{1} << 30;
constexpr int64_t kMaxEventsPerBatch = 1 << 24;  // and within --max_message_bytes (below)
constexpr int64_t kMaxResyncChunks = 1 << 24;    // likewise
constexpr int64_t kMaxPinnedChunks = 1'000'000'000;
constexpr int64_t kMaxWorkers = 1 << 16;
constexpr int64_t kMaxSweepIntervalMs = 3600 * 1000;  // an hour

absl::Status InRange(absl::string_view flag, int64_t value, int64_t lo, int64_t hi,
                     absl::string_view note = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be in [", lo, ", ", hi, "]", note));
}

// `flag`'s largest request (`bytes(value)`) must fit in a message: gRPC would refuse it before the
// registry saw it, and the worker would get a transport error instead of the cap's answer.
absl::Status FitsInMessage(absl::string_view flag, int64_t value, int64_t max_message_bytes,
                           int64_t (*bytes)(int64_t)) {
  if (bytes(value) <= max_message_bytes) return absl::OkStatus();
  const int64_t per_item = bytes(1) - bytes(0);
  const int64_t most = std::max<int64_t>(0, (max_message_bytes - bytes(0)) / per_item);
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": its largest request takes up to ", bytes(value),
                   " bytes on the wire, over --max_message_bytes=", max_message_bytes,
                   "; use at most ", most, " or raise --max_message_bytes"));
}

}  // namespace

void RegisterRegistryFlags(common::FlagSet* flags, RegistryOptions* options,
                           int64_t* sweep_interval_ms) {
  flags->AddInt64("lease_ms", &options->lease_ms,
                  "A worker that does not heartbeat for this long is dropped with its residency.");
  flags->AddInt64("max_chunks", &options->max_chunks,
                  "Chunks tracked; the least recently used are forgotten past it.");
  flags->AddInt("num_shards", &options->num_shards, "Chunk table shards (lock striping).");
  flags->AddInt("max_chunks_per_request", &options->max_chunks_per_request,
                "Resolve: most chunks in one request.");
  flags->AddInt64("max_tokens_per_request", &options->max_tokens_per_request,
                  "Resolve: most tokens over all chunks of one request.");
  flags->AddInt("max_events_per_batch", &options->max_events_per_batch,
                "ReportEvents: most events in one batch (must fit in --max_message_bytes).");
  flags->AddInt("max_resync_chunks", &options->max_resync_chunks,
                "Resync: most chunks in one call (must fit in --max_message_bytes).");
  flags->AddInt64("max_pinned_chunks", &options->max_pinned_chunks, "Most chunks pinned at once.");
  flags->AddInt("max_workers", &options->max_workers,
                "Most workers registered at once; a new worker past it is refused "
                "(RESOURCE_EXHAUSTED), a known one may always register again.");
  flags->AddInt64("sweep_interval_ms", sweep_interval_ms,
                  "How often expired leases are swept and metrics published (0: lease_ms / 4).");
}

absl::Status CheckRegistryFlags(const RegistryOptions& o, int64_t sweep_interval_ms,
                                int64_t max_message_bytes) {
  for (absl::Status s : {
           InRange("lease_ms", o.lease_ms, 100, kMaxLeaseMs),
           InRange("max_chunks", o.max_chunks, 1, kMaxChunks),
           InRange("num_shards", o.num_shards, 1, kMaxShards),
           InRange("max_chunks_per_request", o.max_chunks_per_request, 1, kMaxChunksPerRequest),
           InRange("max_tokens_per_request", o.max_tokens_per_request, 1, kMaxTokensPerRequest),
           InRange("max_events_per_batch", o.max_events_per_batch, 1, kMaxEventsPerBatch),
           InRange("max_resync_chunks", o.max_resync_chunks, 1, kMaxResyncChunks),
           InRange("max_pinned_chunks", o.max_pinned_chunks, 0, kMaxPinnedChunks),
           InRange("max_workers", o.max_workers, 1, kMaxWorkers),
           InRange("sweep_interval_ms", sweep_interval_ms, 0, kMaxSweepIntervalMs,
                   " (0: lease_ms / 4)"),
       }) {
    if (!s.ok()) return s;
  }
  if (max_message_bytes <= 0) {  // the server runner refuses it too, but after the checks below
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", max_message_bytes, ": must be positive"));
  }
  // gRPC takes an int: the runner clamps larger values to INT32_MAX.
  const int64_t message = std::min<int64_t>(max_message_bytes, std::numeric_limits<int32_t>::max());
  if (absl::Status s = FitsInMessage("max_resync_chunks", o.max_resync_chunks, message,
                                     &wire::MaxResyncRequestBytes);
      !s.ok()) {
    return s;
  }
  return FitsInMessage("max_events_per_batch", o.max_events_per_batch, message,
                       &wire::MaxReportEventsRequestBytes);
}

}  // namespace cascade::registry
