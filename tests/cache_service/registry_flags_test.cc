// cascade-registry's flag checks: every numeric flag has an upper bound as well as a lower one,
// and the request caps agree with the gRPC message size, so a resync at the cap gets the cap's
// answer rather than a transport error.
#include "cache_service/server/registry_flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_service/wire/registry_wire.h"
#include "common/transport.h"

namespace cascade::registry {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// A chunk the registry accepts, every field at its longest encoding.
HeldChunk LongestChunk() {
  const Hash128 h{~uint64_t{0}, ~uint64_t{0}};
  const int64_t end = int64_t{1} << 40;
  return HeldChunk{h, end, end, end, h, std::numeric_limits<int32_t>::max(), KvTier::kHost};
}

TEST(RegistryFlagsTest, DefaultCapsFitInTheDefaultMessageSize) {
  const RegistryOptions defaults;
  EXPECT_LE(wire::MaxResyncRequestBytes(defaults.max_resync_chunks),
            common::kDefaultMaxMessageBytes);
  EXPECT_LE(wire::MaxReportEventsRequestBytes(defaults.max_events_per_batch),
            common::kDefaultMaxMessageBytes);
  absl::Status s = CheckRegistryFlags(defaults, 0, common::kDefaultMaxMessageBytes);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(RegistryFlagsTest, RequestSizeBoundsCoverTheLongestValidRequests) {
  for (int n : {0, 1, 3, 200}) {
    v2::ResyncRequest resync;
    resync.set_worker_id(std::string(128, 'w'));
    resync.set_seq(kMaxEventSeq - 1);
    v2::ReportEventsRequest events;
    events.set_worker_id(std::string(128, 'w'));
    events.set_seq(kMaxEventSeq);
    for (int i = 0; i < n; ++i) {
      wire::ToProto(LongestChunk(), resync.add_chunks());
      wire::ToProto(ChunkEvent{ChunkEvent::Type::kStored, LongestChunk()}, events.add_events());
    }
    EXPECT_LE(static_cast<int64_t>(resync.ByteSizeLong()), wire::MaxResyncRequestBytes(n)) << n;
    EXPECT_LE(static_cast<int64_t>(events.ByteSizeLong()), wire::MaxReportEventsRequestBytes(n))
        << n;
  }
  // Tight: about 100 bytes a chunk, which the default cap's comment relies on.
  EXPECT_LE(wire::MaxResyncRequestBytes(1) - wire::MaxResyncRequestBytes(0), 100);
}

TEST(RegistryFlagsTest, AResyncCapThatCannotFitInAMessageIsRefusedWithTheLargestThatFits) {
  RegistryOptions o;
  o.max_resync_chunks = 1'000'000;  // the old default: ~99 MB against 64 MiB
  absl::Status s = CheckRegistryFlags(o, 0, common::kDefaultMaxMessageBytes);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max_resync_chunks=1000000"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--max_message_bytes=67108864"), std::string::npos) << s;
  // The largest cap it suggests fits; one more does not.
  const std::string kUse = "use at most ";
  const size_t at = s.message().find(kUse);
  ASSERT_NE(at, std::string::npos) << s;
  const int most = std::stoi(std::string(s.message().substr(at + kUse.size())));
  EXPECT_LE(wire::MaxResyncRequestBytes(most), common::kDefaultMaxMessageBytes);
  EXPECT_GT(wire::MaxResyncRequestBytes(most + 1), common::kDefaultMaxMessageBytes);
  o.max_resync_chunks = most;
  EXPECT_TRUE(CheckRegistryFlags(o, 0, common::kDefaultMaxMessageBytes).ok());

  RegistryOptions e;
  e.max_events_per_batch = 1'000'000;
  s = CheckRegistryFlags(e, 0, common::kDefaultMaxMessageBytes);
  EXPECT_NE(s.message().find("--max_events_per_batch=1000000"), std::string::npos) << s;
  // A larger message makes room (gRPC caps it at 2^31 - 1 whatever the flag says).
  EXPECT_TRUE(CheckRegistryFlags(e, 0, int64_t{1} << 40).ok());
  EXPECT_EQ(CheckRegistryFlags(RegistryOptions{}, 0, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegistryFlagsTest, EachNumericFlagIsRefusedOutsideItsRangeNamingFlagAndRange) {
  struct Case {
    std::string flag;
    int64_t lo;
    int64_t hi;
    std::function<void(RegistryOptions&, int64_t&, int64_t)> set;
  };
  const std::vector<Case> cases = {
      {"lease_ms", 100, 86'400'000, [](auto& o, auto&, int64_t v) { o.lease_ms = v; }},
      {"max_chunks", 1, 1'000'000'000, [](auto& o, auto&, int64_t v) { o.max_chunks = v; }},
      {"num_shards", 1, 4096,
       [](auto& o, auto&, int64_t v) { o.num_shards = static_cast<int>(v); }},
      {"max_chunks_per_request", 1, 1 << 20,
       [](auto& o, auto&, int64_t v) { o.max_chunks_per_request = static_cast<int>(v); }},
      {"max_tokens_per_request", 1, int64_t{1} << 30,
       [](auto& o, auto&, int64_t v) { o.max_tokens_per_request = v; }},
      {"max_events_per_batch", 1, 1 << 24,
       [](auto& o, auto&, int64_t v) { o.max_events_per_batch = static_cast<int>(v); }},
      {"max_resync_chunks", 1, 1 << 24,
       [](auto& o, auto&, int64_t v) { o.max_resync_chunks = static_cast<int>(v); }},
      {"max_pinned_chunks", 0, 1'000'000'000,
       [](auto& o, auto&, int64_t v) { o.max_pinned_chunks = v; }},
      {"max_workers", 1, 1 << 16,
       [](auto& o, auto&, int64_t v) { o.max_workers = static_cast<int>(v); }},
      {"sweep_interval_ms", 0, 3'600'000, [](auto&, auto& sweep, int64_t v) { sweep = v; }},
  };
  for (const Case& c : cases) {
    // The int flags are checked at the extremes their variable can hold.
    const bool is_int = c.flag == "num_shards" || c.flag.starts_with("max_chunks_per") ||
                        c.flag == "max_events_per_batch" || c.flag == "max_resync_chunks" ||
                        c.flag == "max_workers";
    const int64_t huge = is_int ? kInt32Max : std::numeric_limits<int64_t>::max();
    for (int64_t bad : {c.lo - 1, c.hi + 1, huge}) {
      RegistryOptions o;
      int64_t sweep = 0;
      c.set(o, sweep, bad);
      absl::Status s = CheckRegistryFlags(o, sweep, kInt32Max);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag << "=" << bad;
      EXPECT_NE(s.message().find(
                    absl::StrCat("--", c.flag, "=", bad, ": must be in [", c.lo, ", ", c.hi, "]")),
                std::string::npos)
          << s;
    }
    for (int64_t good : {c.lo, c.hi}) {
      RegistryOptions o;
      int64_t sweep = 0;
      c.set(o, sweep, good);
      absl::Status s = CheckRegistryFlags(o, sweep, kInt32Max);
      EXPECT_TRUE(s.ok()) << c.flag << "=" << good << ": " << s;
    }
  }
}

}  // namespace
}  // namespace cascade::registry
