// Registry core limits that keep one caller from breaking the registry for the others: event
// sequence numbers that always leave room for the next batch, and the cap on registered workers.
#include <gtest/gtest.h>

#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cache_service/registry/registry.h"
#include "tests/cache_service/registry_test_util.h"

namespace cascade::registry {
namespace {

using testing::HeldFor;
using testing::Info;
using testing::Prompt;
using testing::Stored;
using testing::Tokens;

class RegistryLimitsTest : public ::testing::Test {
 protected:
  RegistryOptions Opts() {
    RegistryOptions o;
    o.clock = &clock_;
    o.lease_ms = 1000;
    return o;
  }
  // Tokens `id` holds of `two_` as a resolve sees them; -1 when it is not listed.
  int64_t Matched(Registry& r, const std::string& id) {
    std::vector<hash::ChunkSpec> specs = two_.Specs();
    absl::StatusOr<ResolveResult> res = r.Resolve({two_.model, two_.salt, specs});
    EXPECT_TRUE(res.ok()) << res.status();
    if (!res.ok()) return -1;
    for (const WorkerMatch& m : res->workers) {
      if (m.worker_id == id) return m.matched_tokens;
    }
    return -1;
  }

  FakeClock clock_;
  Prompt two_{.tokens = {Tokens(100, 1), Tokens(100, 1000)}};
};

// A resync to 2^64 - 1 used to be accepted; every later batch then read as a repeat of it: the
// events were dropped and the worker was told all was well. Now every accepted number has a
// successor, and a number past the end is refused out loud.
TEST_F(RegistryLimitsTest, SequenceNumbersWithoutASuccessorAreRefusedNotSilentlyDropped) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

  for (uint64_t seq : {kMax, kMaxEventSeq}) {
    absl::Status s = r.Resync("w", held, seq).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << seq;
    EXPECT_NE(s.message().find("seq"), std::string::npos) << s;
  }
  EXPECT_EQ(Matched(r, "w"), 0);  // the refused resyncs recorded nothing

  // The last resync number allowed is followed by the last batch number, which applies.
  ASSERT_TRUE(r.Resync("w", std::span(held).first(1), kMaxEventSeq - 1).ok());
  absl::StatusOr<ReportResult> last = r.ReportEvents("w", kMaxEventSeq, Stored({held[1]}));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_FALSE(last->resync_required);
  EXPECT_EQ(last->applied_seq, kMaxEventSeq);
  EXPECT_EQ(Matched(r, "w"), 192);

  // Past it: an error, not an OK that drops the events.
  for (uint64_t seq : {kMaxEventSeq + 1, kMax}) {
    absl::Status s = r.ReportEvents("w", seq, Stored({held[0]})).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << seq;
    EXPECT_NE(s.message().find("seq"), std::string::npos) << s;
  }
  // A resync starts the numbers again, and batches apply after it.
  ASSERT_TRUE(r.Resync("w", {}, 0).ok());
  ASSERT_FALSE(r.ReportEvents("w", 1, Stored(held))->resync_required);
  EXPECT_EQ(Matched(r, "w"), 192);
}

TEST_F(RegistryLimitsTest, NewWorkersPastMaxWorkersAreRefusedKnownOnesMayRejoin) {
  RegistryOptions o = Opts();
  o.max_workers = 2;
  Registry r(o);
  ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("b")).ok());
  absl::Status s = r.RegisterWorker(Info("c")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max_workers"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'c'"), std::string::npos) << s;
  EXPECT_EQ(r.GetStats().workers, 2);
  EXPECT_EQ(r.Heartbeat("c", {}).status().code(), absl::StatusCode::kNotFound);

  // A known id re-registers at the cap (a restarted worker must always get back in).
  ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
  // A departed worker makes room.
  ASSERT_TRUE(r.DeregisterWorker("b").ok());
  ASSERT_TRUE(r.RegisterWorker(Info("c")).ok());
  EXPECT_EQ(r.RegisterWorker(Info("d")).status().code(), absl::StatusCode::kResourceExhausted);

  // So does one whose lease ran out, before any sweep; its residency goes with it.
  ASSERT_TRUE(r.ReportEvents("a", 1, Stored(HeldFor(two_, 16, 200))).ok());
  clock_.AdvanceMs(600);
  ASSERT_TRUE(r.Heartbeat("c", {}).ok());
  clock_.AdvanceMs(600);  // a's lease (renewed at registration) has passed, c's has not
  ASSERT_TRUE(r.RegisterWorker(Info("d")).ok());
  EXPECT_EQ(r.GetStats().workers, 2);
  EXPECT_EQ(r.GetStats().leases_expired, 1);
  EXPECT_EQ(Matched(r, "a"), -1);
  EXPECT_EQ(r.Heartbeat("a", {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(r.Heartbeat("c", {}).ok());
}

}  // namespace
}  // namespace cascade::registry
