// Registry core on a fake clock: hashes and positions, residency matching, membership, leases,
// event sequence numbers, restart + resync, caps and errors.
#include "cache_service/registry/registry.h"

#include <gtest/gtest.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "tests/cache_service/registry_test_util.h"

namespace cascade::registry {
namespace {

using testing::HeldFor;
using testing::Info;
using testing::Prompt;
using testing::Stored;
using testing::Tokens;

class RegistryTest : public ::testing::Test {
 protected:
  RegistryOptions Opts() {
    RegistryOptions o;
    o.clock = &clock_;
    o.lease_ms = 1000;
    return o;
  }
  ResolveResult Resolve(Registry& r, const Prompt& p) {
    std::vector<hash::ChunkSpec> specs = p.Specs();
    absl::StatusOr<ResolveResult> res = r.Resolve({p.model, p.salt, specs});
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : ResolveResult{};
  }
  const WorkerMatch* Find(const ResolveResult& r, const std::string& id) {
    for (const WorkerMatch& m : r.workers) {
      if (m.worker_id == id) return &m;
    }
    return nullptr;
  }

  FakeClock clock_;
  Prompt two_{.tokens = {Tokens(100, 1), Tokens(100, 1000)}};
};

TEST_F(RegistryTest, ResolveHashesAndPositionsEqualPlaceChunks) {
  Registry r(Opts());
  Prompt p{.salt = "t",
           .tokens = {Tokens(5, 1), {}, Tokens(7, 50)},
           .kinds = {1, 2, 3},
           .chunk_salts = {"", "x", ""}};
  ResolveResult res = Resolve(r, p);
  std::vector<hash::ChunkSpec> specs = p.Specs();
  std::vector<hash::PlacedChunk> want = hash::PlaceChunks("m", "t", specs);
  ASSERT_EQ(res.chunks.size(), 3u);
  int64_t pos = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(res.chunks[i].hash, want[i].hash);
    EXPECT_EQ(res.chunks[i].start, pos);
    pos += static_cast<int64_t>(p.tokens[i].size());
    EXPECT_EQ(res.chunks[i].end, pos);
  }
}

TEST_F(RegistryTest, SamePrefixSameHashesDifferentPrefixSaltOrModelDiffer) {
  Registry r(Opts());
  ResolveResult a = Resolve(r, two_);
  ResolveResult b = Resolve(r, two_);
  EXPECT_EQ(a.chunks[1].hash, b.chunks[1].hash);
  Prompt other_prefix = two_;
  other_prefix.tokens[0][3] = 99999;
  Prompt salted = two_;
  salted.salt = "tenant";
  Prompt other_model = two_;
  other_model.model = "m2";
  for (const Prompt& p : {other_prefix, salted, other_model}) {
    EXPECT_NE(Resolve(r, p).chunks[1].hash, a.chunks[1].hash);
  }
}

TEST_F(RegistryTest, MatchFollowsEngineBlockView) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("full")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("half")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("none")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("other-model", "m2")).ok());
  // Block size 16: "full" holds all 200 tokens' full blocks (192), "half" the first 100 (96).
  ASSERT_TRUE(r.ReportEvents("full", 1, Stored(HeldFor(two_, 16, 200))).ok());
  ASSERT_TRUE(r.ReportEvents("half", 1, Stored(HeldFor(two_, 16, 100))).ok());
  ResolveResult res = Resolve(r, two_);
  ASSERT_EQ(res.workers.size(), 3u);  // other-model is not listed
  EXPECT_EQ(res.workers[0].worker_id, "full");
  EXPECT_EQ(res.workers[0].matched_tokens, 192);
  EXPECT_EQ(res.workers[0].matched_chunks, 1);  // chunk 0 covered by a full block of chunk 1
  EXPECT_EQ(res.workers[1].worker_id, "half");
  EXPECT_EQ(res.workers[1].matched_tokens, 96);
  EXPECT_EQ(res.workers[1].matched_chunks, 0);  // chunk 0 ends mid-block
  EXPECT_EQ(res.workers[2].worker_id, "none");
  EXPECT_EQ(res.workers[2].matched_tokens, 0);
  // The registry's tokens agree with the hashing library's block keys: 192 = 12 full blocks.
  std::vector<hash::ChunkSpec> specs = two_.Specs();
  EXPECT_EQ(hash::BlockKeys("m", "", specs, 16).size() * 16, 192u);
}

TEST_F(RegistryTest, BlockAlignedChunksAreFullyHeldAndWalkStopsAtFirstMissingChunk) {
  Registry r(Opts());
  Prompt p{.tokens = {Tokens(32, 1), Tokens(16, 100), Tokens(16, 200)}};
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(p, 16, 64);
  ASSERT_EQ(held.size(), 3u);
  // Without chunk 1 the worker cannot reuse chunk 2 (it is chained after chunk 1).
  std::vector<ChunkEvent> events = Stored({held[0], held[2]});
  ASSERT_TRUE(r.ReportEvents("w", 1, events).ok());
  EXPECT_EQ(Find(Resolve(r, p), "w")->matched_chunks, 1);
  EXPECT_EQ(Find(Resolve(r, p), "w")->matched_tokens, 32);
  ASSERT_TRUE(r.ReportEvents("w", 2, Stored({held[1]})).ok());
  EXPECT_EQ(Find(Resolve(r, p), "w")->matched_chunks, 3);
  EXPECT_EQ(Find(Resolve(r, p), "w")->matched_tokens, 64);
  // Same chunks after another first chunk: different hashes, nothing held.
  Prompt q = p;
  q.tokens[0][0] = 7777;
  EXPECT_EQ(Find(Resolve(r, q), "w")->matched_tokens, 0);
}

// Many workers over one prompt, their holdings reported in the reverse of their registration
// order (so each chunk's holder list is not in worker order): every worker's run still ends at
// its first missing chunk, and chunks held past a gap do not count.
TEST_F(RegistryTest, ManyHoldersEachMatchTheirOwnRun) {
  Registry r(Opts());
  Prompt p{.tokens = {Tokens(16, 1), Tokens(16, 100), Tokens(16, 200), Tokens(16, 300),
                      Tokens(16, 400)}};
  constexpr int kWorkers = 40;
  auto id = [](int k) { return absl::StrCat("w", k); };
  for (int k = 0; k < kWorkers; ++k) ASSERT_TRUE(r.RegisterWorker(Info(id(k))).ok());
  for (int k = kWorkers - 1; k >= 0; --k) {
    std::vector<HeldChunk> held = HeldFor(p, 16, 16 * (k % 6));
    if (k % 7 == 3 && held.size() >= 3) held.erase(held.begin() + 1);  // a gap at chunk 1
    if (held.empty()) continue;
    ASSERT_TRUE(r.ReportEvents(id(k), 1, Stored(held)).ok());
  }
  ResolveResult res = Resolve(r, p);
  ASSERT_EQ(res.workers.size(), static_cast<size_t>(kWorkers));
  for (int k = 0; k < kWorkers; ++k) {
    const int want = k % 7 == 3 && k % 6 >= 3 ? 1 : k % 6;
    const WorkerMatch* m = Find(res, id(k));
    ASSERT_NE(m, nullptr) << id(k);
    EXPECT_EQ(m->matched_chunks, want) << id(k);
    EXPECT_EQ(m->matched_tokens, 16 * want) << id(k);
  }
  // Longest match first, then by id among equals.
  EXPECT_EQ(res.workers.front().matched_chunks, 5);
}

// Hashes come from the network: a worker (buggy, or one that built a colliding report) can say
// it holds a prompt's chunk with positions and held_tokens far past where that chunk really
// ends. Resolve places the chunks itself, so it never answers more than the prompt holds: the
// gateway passes matched_tokens on as a peer fetch's token count.
TEST_F(RegistryTest, MatchNeverReachesPastThePromptWhateverAWorkerClaims) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("liar")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_EQ(held.size(), 2u);
  HeldChunk claim = held[0];  // the prompt's real first chunk hash, ending at 100
  claim.end = int64_t{1} << 40;
  claim.held_tokens = claim.end;
  claim.tier = KvTier::kHost;
  ASSERT_TRUE(r.ReportEvents("liar", 1, Stored({claim})).ok());
  const ResolveResult res = Resolve(r, two_);
  const WorkerMatch* m = Find(res, "liar");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->matched_tokens, 100);
  EXPECT_EQ(m->matched_host_tokens, 100);
  EXPECT_EQ(m->matched_chunks, 1);
}

// Load comes from workers too: a queue of INT32_MAX running plus INT32_MAX waiting overflowed
// int when the two were added for the order, and the fullest worker was listed first.
TEST_F(RegistryTest, HugeReportedLoadsOrderAsTheLongestQueue) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("full")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("idle")).ok());
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  ASSERT_TRUE(r.Heartbeat("full", WorkerLoad{kMax, kMax, 0, 0}).ok());
  ASSERT_TRUE(r.Heartbeat("idle", WorkerLoad{1, 0, 0, 0}).ok());
  ResolveResult res = Resolve(r, two_);
  ASSERT_EQ(res.workers.size(), 2u);
  EXPECT_EQ(res.workers[0].worker_id, "idle");
  EXPECT_EQ(res.workers[1].worker_id, "full");
}

// Residency per tier: a chunk whose last held block moved to the worker's host tier still
// matches, and the match says how many of its tokens are host-only; a stored event with the GPU
// tier moves it back; the admin view shows each holder's tier.
TEST_F(RegistryTest, HostTierChunksMatchAndCountAsHostTokens) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);  // chunk 0: 96 tokens, chunk 1: 192
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(r.ReportEvents("w", 1, Stored(held)).ok());
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_host_tokens, 0);

  held[1].tier = KvTier::kHost;  // the tail went to host memory, the head stayed on the GPU
  ASSERT_TRUE(r.ReportEvents("w", 2, Stored({held[1]})).ok());
  const ResolveResult res = Resolve(r, two_);  // Find points into it
  const WorkerMatch* m = Find(res, "w");
  EXPECT_EQ(m->matched_tokens, 192);
  EXPECT_EQ(m->matched_host_tokens, 192 - 96);
  absl::StatusOr<ChunkRecord> rec = r.GetChunk(held[1].hash);
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->holders.size(), 1u);
  EXPECT_EQ(rec->holders[0].tier, KvTier::kHost);

  held[0].tier = KvTier::kHost;  // all of it on the host
  ASSERT_TRUE(r.ReportEvents("w", 3, Stored({held[0]})).ok());
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_host_tokens, 192);

  held[0].tier = held[1].tier = KvTier::kGpu;  // restored
  ASSERT_TRUE(r.ReportEvents("w", 4, Stored(held)).ok());
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_host_tokens, 0);
  EXPECT_EQ(r.GetChunk(held[1].hash)->holders[0].tier, KvTier::kGpu);
}

TEST_F(RegistryTest, LeaseExpiryDropsWorkerAndItsResidency) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  ASSERT_TRUE(r.ReportEvents("w", 1, Stored(HeldFor(two_, 16, 200))).ok());
  clock_.AdvanceMs(900);
  ASSERT_TRUE(r.Heartbeat("w", {}).ok());
  clock_.AdvanceMs(900);  // renewed: still alive
  EXPECT_EQ(Resolve(r, two_).workers.size(), 1u);
  clock_.AdvanceMs(200);
  EXPECT_TRUE(Resolve(r, two_).workers.empty());  // expired even before a sweep
  r.Sweep();
  EXPECT_EQ(r.GetStats().leases_expired, 1);
  EXPECT_EQ(r.GetStats().workers, 0);
  absl::StatusOr<ChunkRecord> rec = r.GetChunk(Resolve(r, two_).chunks[0].hash);
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->holders.empty());
  EXPECT_EQ(r.Heartbeat("w", {}).status().code(), absl::StatusCode::kNotFound);
  // Re-registering starts empty.
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_tokens, 0);
}

TEST_F(RegistryTest, RestartThenResyncRestoresResidencyAnswers) {
  auto first = std::make_unique<Registry>(Opts());
  ASSERT_TRUE(first->RegisterWorker(Info("w")).ok());
  ASSERT_TRUE(first->ReportEvents("w", 1, Stored(HeldFor(two_, 16, 200))).ok());
  ResolveResult before = Resolve(*first, two_);
  std::string epoch = first->epoch();
  first.reset();  // registry restart: all soft state gone

  Registry second(Opts());
  EXPECT_NE(second.epoch(), epoch);
  EXPECT_EQ(second.Heartbeat("w", {}).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(second.RegisterWorker(Info("w")).ok());
  absl::StatusOr<int> n = second.Resync("w", HeldFor(two_, 16, 200), 1);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  ResolveResult after = Resolve(second, two_);
  ASSERT_EQ(after.workers.size(), 1u);
  EXPECT_EQ(after.workers[0].matched_tokens, before.workers[0].matched_tokens);
  EXPECT_EQ(after.workers[0].matched_chunks, before.workers[0].matched_chunks);
  // Next batch continues after the resync's sequence number.
  absl::StatusOr<ReportResult> rep = second.ReportEvents("w", 2, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_FALSE(rep->resync_required);
}

TEST_F(RegistryTest, EventGapRequiresResyncAndDuplicatesAreIdempotent) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_FALSE(r.ReportEvents("w", 1, Stored({held[0]}))->resync_required);
  // Duplicate of batch 1 carrying an eviction: ignored, so chunk 0 stays held.
  std::vector<ChunkEvent> evict = {{ChunkEvent::Type::kEvicted, held[0]}};
  absl::StatusOr<ReportResult> dup = r.ReportEvents("w", 1, evict);
  ASSERT_TRUE(dup.ok());
  EXPECT_FALSE(dup->resync_required);
  EXPECT_EQ(dup->applied_seq, 1u);
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_tokens, 96);
  // Gap: batch 3 after 1 is not applied, and later batches wait for the resync.
  absl::StatusOr<ReportResult> gap = r.ReportEvents("w", 3, Stored({held[1]}));
  ASSERT_TRUE(gap.ok());
  EXPECT_TRUE(gap->resync_required);
  EXPECT_EQ(gap->applied_seq, 1u);
  EXPECT_TRUE(r.ReportEvents("w", 2, Stored({held[1]}))->resync_required);
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_tokens, 96);
  EXPECT_EQ(r.GetStats().resyncs_requested, 1);
  ASSERT_TRUE(r.Resync("w", held, 10).ok());
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_tokens, 192);
  EXPECT_FALSE(r.ReportEvents("w", 11, evict)->resync_required);
  EXPECT_EQ(Find(Resolve(r, two_), "w")->matched_tokens, 0);
}

TEST_F(RegistryTest, BadWorkerRequestsFailClearlyWithoutTouchingOthers) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("good")).ok());
  ASSERT_TRUE(r.ReportEvents("good", 1, Stored(HeldFor(two_, 16, 200))).ok());
  EXPECT_EQ(r.Heartbeat("ghost", {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.ReportEvents("ghost", 1, {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Resync("ghost", {}, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.DeregisterWorker("ghost").code(), absl::StatusCode::kNotFound);
  absl::Status bad_id = r.Heartbeat("bad id\n", {}).status();
  EXPECT_EQ(bad_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_id.message().find("worker_id"), std::string::npos);
  EXPECT_EQ(r.RegisterWorker(Info("")).status().code(), absl::StatusCode::kInvalidArgument);
  WorkerInfo no_block = Info("x");
  no_block.block_size = 0;
  EXPECT_NE(r.RegisterWorker(no_block).status().message().find("block_size"), std::string::npos);
  for (const std::string& numerics : {std::string(129, 'a'), std::string("cpu\n")}) {
    WorkerInfo bad_numerics = Info("x");
    bad_numerics.kv_numerics = numerics;
    absl::Status s = r.RegisterWorker(bad_numerics).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("kv_numerics"), std::string::npos) << s;
  }
  WorkerInfo longest = Info("x");
  longest.kv_numerics = std::string(128, 'a');
  EXPECT_TRUE(r.RegisterWorker(longest).ok());
  EXPECT_EQ(r.ReportEvents("good", 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A malformed event rejects the whole batch and does not advance the sequence number.
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  HeldChunk broken = held[1];
  broken.held_tokens = broken.end + 1;
  absl::Status s = r.ReportEvents("good", 2, Stored({held[0], broken})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("events[1].chunk.held_tokens"), std::string::npos) << s;
  EXPECT_FALSE(r.ReportEvents("good", 2, {})->resync_required);
  EXPECT_EQ(Find(Resolve(r, two_), "good")->matched_tokens, 192);
}

TEST_F(RegistryTest, OversizeAndMalformedResolvesNameTheField) {
  RegistryOptions o = Opts();
  o.max_chunks_per_request = 2;
  o.max_tokens_per_request = 150;
  Registry r(o);
  Prompt three{.tokens = {{1}, {2}, {3}}};
  std::vector<hash::ChunkSpec> specs = three.Specs();
  absl::Status s = r.Resolve({"m", "", specs}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_chunks_per_request"), std::string::npos) << s;
  specs = two_.Specs();
  s = r.Resolve({"m", "", specs}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("chunks[1].token_ids"), std::string::npos) << s;
  Prompt unkind{.tokens = {{1}}, .kinds = {0}};
  specs = unkind.Specs();
  s = r.Resolve({"m", "", specs}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunks[0].kind"), std::string::npos) << s;
  EXPECT_EQ(r.Resolve({"", "", specs}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Resolve({"m", "", {}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RegistryTest, LruCapForgetsLeastRecentlyUsedButKeepsPinned) {
  RegistryOptions o = Opts();
  o.max_chunks = 3;
  o.num_shards = 1;
  Registry r(o);
  std::vector<Hash128> hashes;
  for (int i = 0; i < 3; ++i) {
    hashes.push_back(Resolve(r, Prompt{.tokens = {{i}}}).chunks[0].hash);
    clock_.AdvanceMs(1);
  }
  ASSERT_TRUE(r.PinChunk(hashes[0], 60, std::nullopt).ok());
  Resolve(r, Prompt{.tokens = {{1}}});    // touch hashes[1]
  Resolve(r, Prompt{.tokens = {{100}}});  // over the cap: hashes[2] is the LRU unpinned one
  EXPECT_EQ(r.GetStats().chunks, 3);
  EXPECT_EQ(r.GetStats().chunks_forgotten, 1);
  EXPECT_TRUE(r.GetChunk(hashes[0]).ok());
  EXPECT_TRUE(r.GetChunk(hashes[1]).ok());
  EXPECT_EQ(r.GetChunk(hashes[2]).status().code(), absl::StatusCode::kNotFound);
}

// Events naming `n` chunks with sequential hashes from `first` on: the hash pattern that used
// to land every chunk in one shard (shard = hi % 64).
std::vector<ChunkEvent> SequentialStored(uint64_t first, int n, bool vary_hi) {
  std::vector<ChunkEvent> e;
  for (int i = 0; i < n; ++i) {
    uint64_t v = first + static_cast<uint64_t>(i);
    Hash128 h = vary_hi ? Hash128{v << 6, 1} : Hash128{0, v};
    e.push_back({ChunkEvent::Type::kStored, HeldChunk{h, 0, 16, 16, Hash128{}, 1}});
  }
  return e;
}

TEST_F(RegistryTest, SequentialHashesSpreadOverShardsAndFillTheWholeCap) {
  for (bool vary_hi : {false, true}) {
    RegistryOptions o = Opts();
    o.max_chunks = 1024;  // 64 shards of 16
    Registry r(o);
    ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
    for (uint64_t seq = 1; seq <= 4; ++seq) {
      ASSERT_TRUE(r.ReportEvents("a", seq, SequentialStored(seq * 4096, 4096, vary_hi)).ok());
    }
    // 16k distinct chunks went in: every shard is full, so the table holds its configured cap
    // (with hi % 64 shard selection it held one shard's 16).
    EXPECT_EQ(r.GetStats().chunks, 1024) << "vary_hi=" << vary_hi;
    EXPECT_EQ(r.GetStats().chunks_forgotten, 4 * 4096 - 1024) << "vary_hi=" << vary_hi;
  }
}

TEST_F(RegistryTest, HeldSetsShrinkWithTheTableAndNeverExceedItsCap) {
  RegistryOptions o = Opts();
  o.max_chunks = 1024;
  Registry r(o);
  ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("b")).ok());
  // "b" holds a few chunks the table will forget once "a" floods it.
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_TRUE(r.ReportEvents("b", 1, Stored(held)).ok());
  for (uint64_t seq = 1; seq <= 20; ++seq) {
    ASSERT_TRUE(r.ReportEvents("a", seq, SequentialStored(seq * 65536, 4096, false)).ok());
    RegistryStats s = r.GetStats();
    std::vector<WorkerRecord> w = r.ListWorkers();
    ASSERT_EQ(w.size(), 2u);
    // Every chunk "a" is recorded as holding is one the table still knows.
    ASSERT_LE(w[0].chunks, s.chunks) << "after batch " << seq;
    ASSERT_LE(s.chunks, o.max_chunks);
  }
  std::vector<WorkerRecord> w = r.ListWorkers();
  EXPECT_EQ(w[0].chunks, 1024);  // "a" holds every chunk the table kept
  EXPECT_EQ(w[1].chunks, 0);     // "b"'s chunks were forgotten, and left its set with them
  EXPECT_EQ(r.GetChunk(held[0].hash).status().code(), absl::StatusCode::kNotFound);
  // Dropping "a" empties every holder list it was in.
  ASSERT_TRUE(r.DeregisterWorker("a").ok());
  int64_t total = 0;
  absl::StatusOr<std::vector<ChunkRecord>> all = r.ListChunks(10000, "", &total);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(total, 1024);
  for (const ChunkRecord& c : *all) ASSERT_TRUE(c.holders.empty());
  // A resync of more chunks than the cap records at most the cap.
  ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
  std::vector<HeldChunk> many;
  for (const ChunkEvent& e : SequentialStored(1u << 30, 5000, true)) many.push_back(e.chunk);
  absl::StatusOr<int> recorded = r.Resync("a", many, 7);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, 1024);
  EXPECT_EQ(r.ListWorkers()[0].chunks, 1024);
}

TEST_F(RegistryTest, PinsReachHoldersAndExpire) {
  RegistryOptions o = Opts();
  o.lease_ms = 60'000;
  Registry r(o);
  ASSERT_TRUE(r.RegisterWorker(Info("holder")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("bystander")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  // Pinning before any worker reports it needs the chunk's metadata.
  EXPECT_EQ(r.PinChunk(held[0].hash, 5, std::nullopt).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<int64_t> until = r.PinChunk(held[0].hash, 5, held[0]);
  ASSERT_TRUE(until.ok()) << until.status();
  EXPECT_EQ(*until, clock_.NowMs() + 5000);
  EXPECT_EQ(r.PinChunk(held[0].hash, 0, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(r.ReportEvents("holder", 1, Stored(held)).ok());
  EXPECT_EQ(r.Heartbeat("holder", {})->pinned_hashes, std::vector<Hash128>{held[0].hash});
  EXPECT_TRUE(r.Heartbeat("bystander", {})->pinned_hashes.empty());
  EXPECT_EQ(r.GetChunk(held[0].hash)->pinned_until_ms, *until);
  clock_.AdvanceMs(5000);
  EXPECT_TRUE(r.Heartbeat("holder", {})->pinned_hashes.empty());
  EXPECT_EQ(r.GetChunk(held[0].hash)->pinned_until_ms, 0);
  ASSERT_TRUE(r.PinChunk(held[1].hash, 5, std::nullopt).ok());
  ASSERT_TRUE(r.UnpinChunk(held[1].hash).ok());
  EXPECT_TRUE(r.Heartbeat("holder", {})->pinned_hashes.empty());
}

TEST_F(RegistryTest, EvictEverywhereTellsHoldersOnceAndForgetsTheChunk) {
  Registry r(Opts());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(r.RegisterWorker(Info(id)).ok());
  ASSERT_TRUE(r.ReportEvents("a", 1, Stored(held)).ok());
  ASSERT_TRUE(r.ReportEvents("b", 1, Stored({held[1]})).ok());
  EXPECT_EQ(*r.EvictChunk(held[1].hash), 2);
  EXPECT_EQ(r.GetChunk(held[1].hash).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Heartbeat("a", {})->evict_hashes, std::vector<Hash128>{held[1].hash});
  EXPECT_TRUE(r.Heartbeat("a", {})->evict_hashes.empty());
  EXPECT_EQ(r.Heartbeat("b", {})->evict_hashes.size(), 1u);
  EXPECT_TRUE(r.Heartbeat("c", {})->evict_hashes.empty());
  EXPECT_EQ(r.EvictChunk(held[1].hash).status().code(), absl::StatusCode::kNotFound);
}

// A worker's report names a chunk's positions, and the first writer of a chunk's facts used to
// keep them: a worker could plant a false start and end that the admin views then showed. The
// registry's own placement (Resolve hashes the tokens itself) replaces them.
TEST_F(RegistryTest, ResolvePlacementReplacesAWorkersClaimedPositions) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("liar")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_EQ(held.size(), 2u);
  held[1].start = 5000;
  held[1].end = 9000;
  ASSERT_TRUE(r.ReportEvents("liar", 1, Stored(held)).ok());
  auto end_of = [&](const hash::Hash128& h) {
    absl::StatusOr<std::vector<ChunkRecord>> all = r.ListChunks(10, "", nullptr);
    EXPECT_TRUE(all.ok());
    for (const ChunkRecord& c : *all) {
      if (c.hash == h) return std::pair<int64_t, int64_t>(c.start, c.end);
    }
    return std::pair<int64_t, int64_t>(-1, -1);
  };
  EXPECT_EQ(end_of(held[1].hash), std::make_pair(int64_t{5000}, int64_t{9000}));
  ResolveResult res = Resolve(r, two_);
  ASSERT_EQ(res.chunks.size(), 2u);
  EXPECT_EQ(res.chunks[1].hash, held[1].hash);
  EXPECT_EQ(end_of(held[1].hash), std::make_pair(int64_t{100}, int64_t{200}));
}

TEST_F(RegistryTest, AdminViewsAndStats) {
  Registry r(Opts());
  ASSERT_TRUE(r.RegisterWorker(Info("a")).ok());
  ASSERT_TRUE(r.RegisterWorker(Info("b")).ok());
  ASSERT_TRUE(r.ReportEvents("a", 1, Stored(HeldFor(two_, 16, 200))).ok());
  ASSERT_TRUE(r.Heartbeat("b", WorkerLoad{3, 4, 10, 20}).ok());
  Resolve(r, two_);  // hit
  clock_.AdvanceMs(10);
  Resolve(r, Prompt{.tokens = {Tokens(3, 500)}});  // miss, most recent
  int64_t total = 0;
  absl::StatusOr<std::vector<ChunkRecord>> all = r.ListChunks(0, "", &total);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(total, 3);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].end, 3);  // most recently used first
  absl::StatusOr<std::vector<ChunkRecord>> of_a = r.ListChunks(10, "a", nullptr);
  ASSERT_EQ(of_a->size(), 2u);
  EXPECT_EQ((*of_a)[0].holders.size(), 1u);
  EXPECT_EQ((*of_a)[0].holders[0].worker_id, "a");
  EXPECT_EQ(r.ListChunks(10001, "", nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<WorkerRecord> workers = r.ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].chunks, 2);
  EXPECT_EQ(workers[0].applied_seq, 1u);
  EXPECT_EQ(workers[1].load.waiting, 4);
  RegistryStats s = r.GetStats();
  EXPECT_EQ(s.resolves, 2);
  EXPECT_EQ(s.resolve_hits, 1);
  EXPECT_EQ(s.workers, 2);
  EXPECT_EQ(s.chunks, 3);
}

}  // namespace
}  // namespace cascade::registry
