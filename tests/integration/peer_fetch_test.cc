// Peer KV fetch over real gRPC on loopback (CPU workers, internal mTLS): a worker whose request
// names a peer holding the prompt's prefix pulls those blocks (FetchKv) and serves it with the
// tokens and logprob bits of a cold run; a corrupted, truncated, mislabelled or stalled
// (deadline) transfer, and a holder killed mid-transfer, are detected and the prompt is
// prefilled with the same exact tokens; a cancelled request stops its fetch and holds no blocks;
// GetStats and the metrics count fetches and fallbacks. Through the gateway, the router's fetch
// plan reaches the worker it chose, and none is planned between workers of other block sizes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "common/metrics.h"
#include "gpu_worker/service/kv_serve.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using cascade::v2::WorkerServiceGenerateRequest;
using cascade::v2::WorkerServiceGenerateResponse;

// A 300-token system chunk (ids depend on `salt`, so each case has its own prefix) and a query,
// sampled with a fixed seed and logprobs.
WorkerServiceGenerateRequest Prompt(int salt) {
  WorkerServiceGenerateRequest r;
  r.set_request_id("peer-" + std::to_string(salt));
  auto* sys = r.add_chunks();
  sys->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
  for (int i = 0; i < 300; ++i) sys->add_token_ids(10 + (i * 7919 + salt * 104729) % 2000);
  auto* q = r.add_chunks();
  q->set_kind(cascade::v2::CHUNK_KIND_QUERY);
  for (int i = 0; i < 9; ++i) q->add_token_ids(20 + i * 3 + salt);
  r.mutable_sampling()->set_temperature(0.9f);
  r.mutable_sampling()->set_seed(1234);
  r.mutable_sampling()->set_max_tokens(6);
  r.mutable_sampling()->set_logprobs(2);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

struct WorkerReply {
  grpc::Status status;
  int64_t cached_tokens = -1;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;  // sampled and top logprobs, as bits
};

void AddBits(float f, std::vector<uint32_t>* out) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  out->push_back(u);
}

// Generate on worker `i` as the gateway would call it, naming worker `peer` (-1: none).
WorkerReply CallWorker(Stack& stack, int i, WorkerServiceGenerateRequest req, int peer = -1,
                       grpc::ClientContext* ctx_in = nullptr) {
  if (peer >= 0) {
    req.mutable_peer()->set_worker_id(stack.worker(peer).worker_id());
    req.mutable_peer()->set_address(stack.worker(peer).address());
    req.mutable_peer()->set_tokens(300);
  }
  auto stub = WorkerStubAsGateway(stack.worker(i).address());
  grpc::ClientContext own;
  grpc::ClientContext* ctx = ctx_in != nullptr ? ctx_in : &own;
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(ctx, req);
  WorkerReply r;
  WorkerServiceGenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_start()) r.cached_tokens = m.start().cached_tokens();
    if (m.has_tokens()) {
      r.tokens.insert(r.tokens.end(), m.tokens().token_ids().begin(), m.tokens().token_ids().end());
      for (const auto& lp : m.tokens().logprobs()) {
        AddBits(lp.sampled().logprob(), &r.logprob_bits);
        for (const auto& t : lp.top()) AddBits(t.logprob(), &r.logprob_bits);
      }
    }
  }
  r.status = reader->Finish();
  return r;
}

void ExpectSameOutput(const WorkerReply& got, const WorkerReply& cold) {
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, cold.tokens);
  EXPECT_EQ(got.logprob_bits, cold.logprob_bits) << "logprobs differ in their bits";
  EXPECT_EQ(got.tokens.size(), 6u);
  EXPECT_EQ(got.logprob_bits.size(), 18u);
}

// The metrics' count of peer fetches with `result` on a registry.
double FetchCount(const common::MetricsRegistry& m, const std::string& result) {
  const std::string text = m.RenderText();
  const std::string key = "result=\"" + result + "\"";
  size_t pos = 0;
  while ((pos = text.find("cascade:peer_fetches_total{", pos)) != std::string::npos) {
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol - pos);
    pos = eol;
    if (line.find(key) != std::string::npos) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

// Two CPU workers with host tiers, each with its own metrics registry; w0 holds, w1 fetches.
struct PeerStack {
  explicit PeerStack(absl::Duration fetch_timeout = absl::Seconds(30)) {
    StackOptions o;
    o.workers = 2;
    o.host_kv_bytes = 64 << 20;
    o.tweak_worker = [this, fetch_timeout](int i, worker::WorkerConfig* w) {
      w->server.metrics = &metrics[i];
      w->peer_fetch.timeout = fetch_timeout;
    };
    stack = std::make_unique<Stack>(o);
  }
  common::MetricsRegistry metrics[2];
  std::unique_ptr<Stack> stack;
};

TEST(PeerFetchTest, FetchedPrefixGivesTheColdTokensAndLogprobBits) {
  PeerStack p;
  Stack& s = *p.stack;
  const WorkerReply cold = CallWorker(s, 0, Prompt(1));  // w0 computes and now holds it
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.cached_tokens, 0);
  const WorkerReply got = CallWorker(s, 1, Prompt(1), /*peer=*/0);
  ExpectSameOutput(got, cold);
  EXPECT_EQ(got.cached_tokens, 288) << "the 18 full blocks of the 300-token chunk came from w0";
  const auto st = s.WorkerStats(1);
  EXPECT_EQ(st.peer_fetches(), 1);
  EXPECT_EQ(st.peer_fetch_fallbacks(), 0);
  EXPECT_EQ(st.peer_fetched_blocks(), 18);
  EXPECT_EQ(st.prefix_cache_hits_host(), 288);
  EXPECT_EQ(st.prompt_tokens_computed(), 309 - 288);
  EXPECT_EQ(s.WorkerStats(0).peer_served_blocks(), 18);
  EXPECT_EQ(FetchCount(p.metrics[1], "ok"), 1);
  // A worker that holds the prefix itself fetches nothing.
  const WorkerReply again = CallWorker(s, 1, Prompt(1), /*peer=*/0);
  ExpectSameOutput(again, cold);
  EXPECT_EQ(s.WorkerStats(1).peer_fetches(), 1);
  EXPECT_EQ(s.WorkerStats(0).peer_served_blocks(), 18);
}

struct FaultCase {
  const char* name;
  worker::FetchFaults faults;
  const char* result;  // the metric's label
};

class PeerFetchFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(PeerFetchFaultTest, BadTransferIsDetectedAndThePromptPrefilledExactly) {
  const FaultCase& c = GetParam();
  const bool stall = c.faults.stall_after >= 0;
  PeerStack p(stall ? absl::Milliseconds(300) : absl::Seconds(30));
  Stack& s = *p.stack;
  const WorkerReply cold = CallWorker(s, 0, Prompt(2));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  s.worker(0).service().SetFetchFaultsForTesting(c.faults);
  const WorkerReply got = CallWorker(s, 1, Prompt(2), /*peer=*/0);
  ExpectSameOutput(got, cold);
  EXPECT_EQ(got.cached_tokens, 0) << "nothing of a bad transfer may count as cached";
  const auto st = s.WorkerStats(1);
  EXPECT_EQ(st.peer_fetches(), 0);
  EXPECT_EQ(st.peer_fetch_fallbacks(), 1);
  EXPECT_EQ(st.peer_fetched_blocks(), 0);
  EXPECT_EQ(st.prompt_tokens_computed(), 309);
  EXPECT_EQ(FetchCount(p.metrics[1], c.result), 1) << p.metrics[1].RenderText();
  EXPECT_EQ(FetchCount(p.metrics[1], "ok"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, PeerFetchFaultTest,
    ::testing::Values(FaultCase{"FlippedByte", {.corrupt_block = 5}, "checksum"},
                      FaultCase{"Truncated", {.truncate_after = 7}, "truncated"},
                      FaultCase{"WrongKey", {.wrong_key_block = 3}, "wrong_key"},
                      FaultCase{"StalledPastTheDeadline", {.stall_after = 4}, "deadline"}),
    [](const ::testing::TestParamInfo<FaultCase>& i) { return std::string(i.param.name); });

TEST(PeerFetchTest, HolderKilledMidTransferLosesNoRequest) {
  PeerStack p;
  Stack& s = *p.stack;
  const WorkerReply cold = CallWorker(s, 0, Prompt(3));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  s.worker(0).service().SetFetchFaultsForTesting({.stall_after = 4});
  WorkerReply got;
  std::thread t([&] { got = CallWorker(s, 1, Prompt(3), /*peer=*/0); });
  // The holder has copied the blocks out and sent four; kill it while the transfer is open.
  ASSERT_TRUE(WaitFor([&] { return s.WorkerStats(0).peer_served_blocks() > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  s.DrainWorker(0, absl::ZeroDuration());
  t.join();
  ExpectSameOutput(got, cold);
  EXPECT_EQ(got.cached_tokens, 0);
  EXPECT_EQ(s.WorkerStats(1).peer_fetch_fallbacks(), 1);
  EXPECT_EQ(FetchCount(p.metrics[1], "unavailable"), 1) << p.metrics[1].RenderText();
}

TEST(PeerFetchTest, CancelDuringAFetchEndsItAndHoldsNoBlocks) {
  PeerStack p;
  Stack& s = *p.stack;
  const WorkerReply cold = CallWorker(s, 0, Prompt(4));
  ASSERT_TRUE(cold.status.ok());
  s.worker(0).service().SetFetchFaultsForTesting({.stall_after = 2});
  grpc::ClientContext ctx;
  WorkerReply got;
  std::thread t([&] { got = CallWorker(s, 1, Prompt(4), /*peer=*/0, &ctx); });
  ASSERT_TRUE(WaitFor([&] { return s.WorkerStats(0).peer_served_blocks() > 0; }));
  const auto asked = std::chrono::steady_clock::now();
  ctx.TryCancel();
  t.join();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(5))
      << "the cancel waited for the 30 s fetch deadline";
  // The fetch ended (its callback ran), was not counted as used or as a fallback, and neither
  // worker holds a block for it.
  EXPECT_TRUE(WaitFor([&] { return FetchCount(p.metrics[1], "cancelled") == 1; }));
  const auto st1 = s.WorkerStats(1), st0 = s.WorkerStats(0);
  EXPECT_EQ(st1.peer_fetches() + st1.peer_fetch_fallbacks(), 0);
  EXPECT_EQ(st1.peer_fetched_blocks(), 0);
  EXPECT_EQ(st1.running() + st1.waiting(), 0);
  EXPECT_EQ(st1.used_kv_blocks(), 0);
  EXPECT_EQ(st0.used_kv_blocks(), 0);
  // Both go on serving: without the fault the same request fetches and matches the cold run.
  s.worker(0).service().SetFetchFaultsForTesting({});
  const WorkerReply after = CallWorker(s, 1, Prompt(4), /*peer=*/0);
  ExpectSameOutput(after, cold);
  EXPECT_EQ(after.cached_tokens, 288);
  EXPECT_EQ(s.WorkerStats(1).peer_fetches(), 1);
}

TEST(PeerFetchTest, HolderRefusesAnotherLayoutAndTheGatewaysRole) {
  PeerStack p;
  Stack& s = *p.stack;
  const WorkerReply cold = CallWorker(s, 0, Prompt(5));
  ASSERT_TRUE(cold.status.ok());
  // A peer asking with another block layout (as a CUDA worker's bf16 blocks would be) is refused.
  auto ch = common::MakeChannel(s.worker(0).address(),
                                common::InternalClientTls(common::testing::TestCerts::Default().For(
                                                              common::Role::kWorker, "w1"),
                                                          common::kWorkerServerName));
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto stub = cascade::v2::WorkerService::NewStub(*ch);
  cascade::v2::FetchKvRequest req;
  req.set_model(s.worker(0).loop().engine().options().model_name);
  req.set_backend("cuda");
  req.set_block_bytes(s.worker(0).loop().engine().backend().KvBlockBytes() / 2);
  req.set_block_size(16);
  req.add_block_keys(std::string(32, '0'));
  grpc::ClientContext ctx;
  auto reader = stub->FetchKv(&ctx, req);
  cascade::v2::FetchKvResponse m;
  EXPECT_FALSE(reader->Read(&m));
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  // The same layout computed under other numerics (Backend::KvNumerics) is refused too: its bits
  // would not be the ones this worker computes cold.
  {
    cascade::v2::FetchKvRequest other = req;
    // (A control byte in it comes back escaped: the message echoes input through Excerpt.)
    other.set_backend(s.worker(0).loop().engine().backend().KvNumerics() + "/other\x01");
    other.set_block_bytes(s.worker(0).loop().engine().backend().KvBlockBytes());
    other.set_block_size(s.worker(0).loop().engine().backend().BlockSize());
    grpc::ClientContext octx;
    auto r2 = stub->FetchKv(&octx, other);
    EXPECT_FALSE(r2->Read(&m));
    const grpc::Status st2 = r2->Finish();
    EXPECT_EQ(st2.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st2.error_message();
    EXPECT_NE(st2.error_message().find("/other\\x01"), std::string::npos) << st2.error_message();
  }
  // The gateway's role may not pull KV from a worker.
  auto gw = cascade::v2::WorkerService::NewStub(s.WorkerChannel(0, common::Role::kGateway));
  grpc::ClientContext gctx;
  auto greader = gw->FetchKv(&gctx, req);
  EXPECT_FALSE(greader->Read(&m));
  EXPECT_EQ(greader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// Malformed FetchKv requests get a clear status with a bounded message and no blocks: another
// model, no keys, too many keys, a key that is not 32 hex characters; the holder serves on.
TEST(PeerFetchTest, HolderRefusesMalformedRequestsWithBoundedMessages) {
  PeerStack p;
  Stack& s = *p.stack;
  ASSERT_TRUE(CallWorker(s, 0, Prompt(6)).status.ok());
  auto ch = common::MakeChannel(s.worker(0).address(),
                                common::InternalClientTls(common::testing::TestCerts::Default().For(
                                                              common::Role::kWorker, "w1"),
                                                          common::kWorkerServerName));
  ASSERT_TRUE(ch.ok()) << ch.status();
  auto stub = cascade::v2::WorkerService::NewStub(*ch);
  engine::Engine& engine = s.worker(0).loop().engine();
  auto valid = [&] {
    cascade::v2::FetchKvRequest r;
    r.set_model(engine.options().model_name);
    r.set_backend(engine.backend().Name());
    r.set_block_bytes(engine.backend().KvBlockBytes());
    r.set_block_size(engine.backend().BlockSize());
    r.add_block_keys(std::string(32, '0'));
    return r;
  };
  auto refused = [&](const cascade::v2::FetchKvRequest& r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub->FetchKv(&ctx, r);
    cascade::v2::FetchKvResponse m;
    EXPECT_FALSE(reader->Read(&m)) << "a malformed request got a message";
    return reader->Finish();
  };
  cascade::v2::FetchKvRequest r = valid();
  r.set_model(std::string(100000, 'm'));
  grpc::Status st = refused(r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_LT(st.error_message().size(), 1024u) << "the model name was echoed unbounded";

  r = valid();
  r.clear_block_keys();
  st = refused(r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("block_keys"), std::string::npos) << st.error_message();

  r = valid();
  for (int i = 0; i < worker::kMaxFetchBlocks; ++i) r.add_block_keys(std::string(32, '0'));
  st = refused(r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();

  r = valid();
  r.add_block_keys(std::string(32, 'z'));
  st = refused(r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("block_keys[1]"), std::string::npos) << st.error_message();

  // The holder still serves requests.
  EXPECT_TRUE(CallWorker(s, 0, Prompt(7)).status.ok());
}

// The request again through the gateway while worker `holder` runs a long stream of its own (seen
// by the registry's load), so the router weighs sending it elsewhere with a fetch plan.
Reply GenerateWhileHolderBusy(Stack& s, int holder, const cascade::v2::GenerateRequest& req) {
  EXPECT_TRUE(s.WaitForIdleLoad());
  WorkerServiceGenerateRequest busy = Prompt(6);
  busy.mutable_sampling()->set_max_tokens(100000 / 100);
  grpc::ClientContext busy_ctx;
  std::thread t([&] { CallWorker(s, holder, busy, -1, &busy_ctx); });
  EXPECT_TRUE(WaitFor([&] {
    for (const auto& w : s.registry()->ListWorkers()) {
      if (w.info.worker_id == s.worker(holder).worker_id() && w.load.running > 0) return true;
    }
    return false;
  }));
  Reply again = Generate(s.gateway(), req);
  busy_ctx.TryCancel();
  t.join();
  return again;
}

// Fetch weights under which the tiny model's fetched token costs ~0.001 of a prefill.
void CheapFetch(gateway::GatewayConfig* g) {
  g->fetch.bandwidth = 1e9;
  g->fetch.prefill_tokens_per_s = 1000;
  g->fetch.overhead_ms = 0;
}

// Through the gateway: the holder is busy, so the router sends the request to the idle worker
// with a plan to fetch from the holder, which it does; the output is the first request's.
TEST(PeerFetchTest, RouterSendsTheFetchPlanToTheWorkerItChooses) {
  StackOptions o;
  o.workers = 2;
  o.host_kv_bytes = 64 << 20;
  o.tweak_gateway = CheapFetch;
  Stack s(o);
  const std::string sys = LongSystemPrompt();
  cascade::v2::GenerateRequest req = Req(sys, "Which rule is first?", 6);
  const Reply first = Generate(s.gateway(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const int holder = s.WorkerIndex(first.start.worker_id());
  ASSERT_GE(holder, 0);
  const int other = 1 - holder;
  const Reply again = GenerateWhileHolderBusy(s, holder, req);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.start.worker_id(), s.worker(other).worker_id());
  EXPECT_EQ(again.tokens, first.tokens);
  const auto st = s.WorkerStats(other);
  EXPECT_EQ(st.peer_fetches(), 1);
  EXPECT_GT(st.peer_fetched_blocks(), 0);
  EXPECT_EQ(again.start.cached_tokens(), st.peer_fetched_blocks() * 16);
}

// The same through the gateway, but the workers cut their KV into blocks of 16 and 32 tokens: the
// holder would refuse the other's fetch, and the router, knowing both block sizes from the
// registry, plans none (a planned one would show as a fallback on the worker that tried it).
TEST(PeerFetchTest, RouterPlansNoFetchFromAHolderOfAnotherBlockSize) {
  StackOptions o;
  o.workers = 2;
  o.host_kv_bytes = 64 << 20;
  o.tweak_worker = [](int i, worker::WorkerConfig* w) { w->block_size = i == 0 ? 16 : 32; };
  o.tweak_gateway = CheapFetch;
  Stack s(o);
  cascade::v2::GenerateRequest req = Req(LongSystemPrompt(), "Which rule is first?", 6);
  const Reply first = Generate(s.gateway(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const int holder = s.WorkerIndex(first.start.worker_id());
  ASSERT_GE(holder, 0);
  const Reply again = GenerateWhileHolderBusy(s, holder, req);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  for (int i = 0; i < 2; ++i) {
    const auto st = s.WorkerStats(i);
    EXPECT_EQ(st.peer_fetches(), 0) << "worker " << i;
    EXPECT_EQ(st.peer_fetch_fallbacks(), 0) << "worker " << i;
  }
}

}  // namespace
}  // namespace cascade::testing
