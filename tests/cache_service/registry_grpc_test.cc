// The registry over real gRPC on loopback: the service, the gRPC RegistryClient and the shared
// plumbing's server runner, with the core on a fake clock, with internal auth on (each call made
// with the role it needs: ClusterClient). Covers hashing agreement, leases, restart + resync,
// event gaps and repeats, admin RPCs, errors and deadlines.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "cache_service/client/grpc_registry_client.h"
#include "cache_service/registry/registry.h"
#include "cache_service/server/registry_service.h"
#include "cascade/v2/registry.grpc.pb.h"
#include "common/server_runner.h"
#include "common/transport.h"
#include "tests/cache_service/registry_test_util.h"
#include "tests/common/test_certs.h"

namespace cascade::registry {
namespace {

using testing::HeldFor;
using testing::Info;
using testing::Prompt;
using testing::Stored;
using testing::Tokens;
namespace v2 = ::cascade::v2;
using common::Role;
using common::testing::TestCerts;

// A gRPC channel to the registry presenting `role`'s test certificate.
std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address, Role role,
                                         std::string_view worker_id = "") {
  auto ch = common::MakeChannel(
      address, TestCerts::Default().Client(role, common::kRegistryServerName, worker_id));
  EXPECT_TRUE(ch.ok()) << ch.status();
  return ch.ok() ? *ch : nullptr;
}

// A RegistryClient that makes each call with the identity the registry requires: Resolve and
// PinChunk as the gateway, a worker's calls with that worker's certificate (w0's for an id
// without one, which the registry refuses). Thread-safe.
class ClusterClient final : public RegistryClient {
 public:
  explicit ClusterClient(std::string address)
      : address_(std::move(address)),
        gateway_(NewGrpcRegistryClient(ChannelAs(address_, Role::kGateway))) {}

  absl::StatusOr<ResolveResult> Resolve(const ResolveInput& in) override {
    return gateway_->Resolve(in);
  }
  absl::StatusOr<int64_t> PinChunk(const Hash128& hash, int64_t ttl_s,
                                   const std::optional<HeldChunk>& chunk) override {
    return gateway_->PinChunk(hash, ttl_s, chunk);
  }
  absl::StatusOr<RegisterResult> RegisterWorker(const WorkerInfo& info) override {
    return As(info.worker_id).RegisterWorker(info);
  }
  absl::StatusOr<HeartbeatResult> Heartbeat(std::string_view id, const WorkerLoad& load) override {
    return As(id).Heartbeat(id, load);
  }
  absl::StatusOr<ReportResult> ReportEvents(std::string_view id, uint64_t seq,
                                            std::span<const ChunkEvent> events) override {
    return As(id).ReportEvents(id, seq, events);
  }
  absl::StatusOr<int> Resync(std::string_view id, std::span<const HeldChunk> chunks,
                             uint64_t seq) override {
    return As(id).Resync(id, chunks, seq);
  }
  absl::Status Deregister(std::string_view id) override { return As(id).Deregister(id); }

 private:
  RegistryClient& As(std::string_view worker_id) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string id(worker_id);
    auto it = workers_.find(id);
    if (it == workers_.end()) {
      const bool has_cert = common::ValidateWorkerIdForCert(id).ok() &&
                            std::filesystem::exists(TestCerts::Default().paths().worker_cert(id));
      it = workers_
               .emplace(id, NewGrpcRegistryClient(
                                ChannelAs(address_, Role::kWorker, has_cert ? id : "w0")))
               .first;
    }
    return *it->second;
  }

  const std::string address_;
  const std::unique_ptr<RegistryClient> gateway_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<RegistryClient>> workers_;
};

// One registry server: core + service + runner on 127.0.0.1.
class Server {
 public:
  Server(FakeClock* clock, int port = 0, RegistryOptions options = {}) {
    options.clock = clock;
    options.lease_ms = 1000;
    registry_ = std::make_unique<Registry>(options);
    service_ = std::make_unique<RegistryService>(registry_.get(), &metrics_);
    common::ServerOptions so;
    so.internal_auth = {TestCerts::Default().For(Role::kRegistry), RegistryMethodPolicy()};
    so.name = "cascade-registry";
    so.host = "127.0.0.1";
    so.port = port;
    so.handle_signals = false;
    so.print_ready_line = false;
    so.metrics = &metrics_;
    runner_ = std::make_unique<common::ServerRunner>(so);
    runner_->AddService({service_.get(), v2::ChunkRegistryService::service_full_name()});
    absl::Status s = runner_->Start();
    EXPECT_TRUE(s.ok()) << s;
  }
  ~Server() { runner_->Shutdown(absl::Seconds(1)); }

  std::string address() const { return runner_->local_address(); }
  int port() const { return runner_->port(); }
  Registry& registry() { return *registry_; }
  // A raw stub presenting `role`'s certificate (admin RPCs by default).
  std::unique_ptr<v2::ChunkRegistryService::Stub> Stub(Role role = Role::kAdmin,
                                                       std::string_view worker_id = "") {
    return v2::ChunkRegistryService::NewStub(ChannelAs(address(), role, worker_id));
  }

 private:
  common::MetricsRegistry metrics_;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<RegistryService> service_;
  std::unique_ptr<common::ServerRunner> runner_;
};

class RegistryGrpcTest : public ::testing::Test {
 protected:
  ResolveResult Resolve(RegistryClient& c, const Prompt& p) {
    std::vector<hash::ChunkSpec> specs = p.Specs();
    absl::StatusOr<ResolveResult> r = c.Resolve({p.model, p.salt, specs});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ResolveResult{};
  }

  FakeClock clock_;
  Prompt two_{.tokens = {Tokens(100, 1), Tokens(100, 1000)}, .kinds = {1, 3}};
};

TEST_F(RegistryGrpcTest, HashesAndPositionsOverGrpcEqualTheHashingLibrary) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  Prompt p = two_;
  p.salt = "tenant";
  p.chunk_salts = {"", "doc"};
  ResolveResult a = Resolve(*client, p);
  std::vector<hash::ChunkSpec> specs = p.Specs();
  std::vector<hash::PlacedChunk> want = hash::PlaceChunks(p.model, p.salt, specs);
  ASSERT_EQ(a.chunks.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a.chunks[i].hash, want[i].hash);
    EXPECT_EQ(a.chunks[i].start, want[i].start);
    EXPECT_EQ(a.chunks[i].end, want[i].end);
  }
  EXPECT_EQ(a.chunks[0].start, 0);
  EXPECT_EQ(a.chunks[1].start, a.chunks[0].end);
  EXPECT_EQ(Resolve(*client, p).chunks[1].hash, a.chunks[1].hash);
  Prompt other_prefix = p, other_salt = p, other_model = p;
  other_prefix.tokens[0][0] = -5;
  other_salt.salt = "tenant-2";
  other_model.model = "other";
  for (const Prompt& q : {other_prefix, other_salt, other_model}) {
    EXPECT_NE(Resolve(*client, q).chunks[1].hash, a.chunks[1].hash);
  }
  // The wire format is the library's hex.
  v2::ResolveRequest req;
  req.set_model("m");
  v2::ResolveChunk* c = req.add_chunks();
  c->set_kind(v2::CHUNK_KIND_SYSTEM);
  for (int32_t t : {1, 2, 3}) c->add_token_ids(t);
  v2::ResolveResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(server.Stub()->Resolve(&ctx, req, &resp).ok());
  std::vector<int32_t> toks = {1, 2, 3};
  EXPECT_EQ(resp.chunks(0).hash(), hash::ChunkHash({}, "m", {}, 1, toks).ToHex());
}

TEST_F(RegistryGrpcTest, ResidencyFollowsBlockKeysAndLeaseExpiryDropsTheWorker) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  ASSERT_TRUE(client->RegisterWorker(Info("w1")).ok());
  ASSERT_TRUE(client->RegisterWorker(Info("w2")).ok());
  ASSERT_TRUE(client->ReportEvents("w1", 1, Stored(HeldFor(two_, 16, 200))).ok());
  ResolveResult r = Resolve(*client, two_);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].worker_id, "w1");
  std::vector<hash::ChunkSpec> specs = two_.Specs();
  EXPECT_EQ(r.workers[0].matched_tokens,
            static_cast<int64_t>(hash::BlockKeys("m", "", specs, 16).size() * 16));
  clock_.AdvanceMs(600);
  ASSERT_TRUE(client->Heartbeat("w2", {}).ok());
  clock_.AdvanceMs(600);  // w1 silent for 1200 ms > lease
  r = Resolve(*client, two_);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].worker_id, "w2");
  EXPECT_EQ(client->Heartbeat("w1", {}).status().code(), absl::StatusCode::kNotFound);
}

// A worker's KV numerics go from RegisterWorker to its match in every Resolve and to ListWorkers
// (the router keeps fetches between equal numerics); a worker that sent none reads as unknown, and
// a re-registration replaces them.
TEST_F(RegistryGrpcTest, KvNumericsTravelFromRegisterToResolveAndListWorkers) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  WorkerInfo w1 = Info("w1");
  w1.kv_numerics = "cuda/v1/G1/a95658a7fb833b51";
  ASSERT_TRUE(client->RegisterWorker(w1).ok());
  ASSERT_TRUE(client->RegisterWorker(Info("w2")).ok());  // an older worker: none sent
  ASSERT_TRUE(client->ReportEvents("w1", 1, Stored(HeldFor(two_, 16, 200))).ok());
  std::map<std::string, std::string> numerics;
  for (const WorkerMatch& m : Resolve(*client, two_).workers) numerics[m.worker_id] = m.kv_numerics;
  EXPECT_EQ(numerics, (std::map<std::string, std::string>{{"w1", w1.kv_numerics}, {"w2", ""}}));

  w1.kv_numerics = "cpu";
  ASSERT_TRUE(client->RegisterWorker(w1).ok());
  ResolveResult r = Resolve(*client, two_);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].worker_id, "w1");
  EXPECT_EQ(r.workers[0].kv_numerics, "cpu");
  v2::ListWorkersResponse listed;
  grpc::ClientContext ctx;
  ASSERT_TRUE(server.Stub()->ListWorkers(&ctx, v2::ListWorkersRequest(), &listed).ok());
  ASSERT_EQ(listed.workers_size(), 2);
  EXPECT_EQ(listed.workers(0).worker_id(), "w1");
  EXPECT_EQ(listed.workers(0).kv_numerics(), "cpu");
  EXPECT_EQ(listed.workers(1).kv_numerics(), "");
}

// A worker's block size goes from RegisterWorker to its match in every Resolve (the router keeps
// fetches between equal block sizes), and a re-registration replaces it.
TEST_F(RegistryGrpcTest, BlockSizeTravelsFromRegisterToResolve) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  WorkerInfo w1 = Info("w1");
  w1.block_size = 32;
  ASSERT_TRUE(client->RegisterWorker(w1).ok());
  ASSERT_TRUE(client->RegisterWorker(Info("w2")).ok());  // Info's 16
  ASSERT_TRUE(client->ReportEvents("w1", 1, Stored(HeldFor(two_, 32, 200))).ok());
  std::map<std::string, int32_t> sizes;
  for (const WorkerMatch& m : Resolve(*client, two_).workers) sizes[m.worker_id] = m.block_size;
  EXPECT_EQ(sizes, (std::map<std::string, int32_t>{{"w1", 32}, {"w2", 16}}));

  w1.block_size = 64;
  ASSERT_TRUE(client->RegisterWorker(w1).ok());
  ResolveResult r = Resolve(*client, two_);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].worker_id, "w1");
  EXPECT_EQ(r.workers[0].block_size, 64);
  EXPECT_EQ(r.workers[1].block_size, 16);
}

// Tiers over the wire: a host-tier chunk reported through the client comes back in Resolve as
// host tokens and in GetChunk as the holder's tier; a tier that is not a KvTier is refused.
TEST_F(RegistryGrpcTest, HostTierResidencyTravelsOverTheWire) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  ASSERT_TRUE(client->RegisterWorker(Info("w1")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  held[1].tier = KvTier::kHost;
  ASSERT_TRUE(client->ReportEvents("w1", 1, Stored(held)).ok());
  ResolveResult r = Resolve(*client, two_);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_tokens, 192);
  EXPECT_EQ(r.workers[0].matched_host_tokens, 96);

  v2::GetChunkRequest get_req;
  get_req.set_hash(held[1].hash.ToHex());
  v2::GetChunkResponse got;
  grpc::ClientContext c1;
  ASSERT_TRUE(server.Stub()->GetChunk(&c1, get_req, &got).ok());
  const v2::ChunkRecord& rec = got.chunk();
  ASSERT_EQ(rec.holders_size(), 1);
  EXPECT_EQ(rec.holders(0).tier(), v2::KV_TIER_HOST);

  v2::ReportEventsRequest bad;
  bad.set_worker_id("w1");
  bad.set_seq(2);
  v2::ChunkEvent* e = bad.add_events();
  e->set_type(v2::ChunkEvent::TYPE_STORED);
  e->mutable_chunk()->set_hash(held[0].hash.ToHex());
  e->mutable_chunk()->set_end(100);
  e->mutable_chunk()->set_tier(static_cast<v2::KvTier>(9));
  v2::ReportEventsResponse resp;
  grpc::ClientContext c2;
  grpc::Status gs = server.Stub(Role::kWorker, "w1")->ReportEvents(&c2, bad, &resp);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(gs.error_message().find("events[0].chunk.tier"), std::string::npos)
      << gs.error_message();
}

TEST_F(RegistryGrpcTest, RegistryRestartFollowedByResyncRestoresResidencyAnswers) {
  auto server = std::make_unique<Server>(&clock_);
  int port = server->port();
  auto client = std::make_unique<ClusterClient>(server->address());
  absl::StatusOr<RegisterResult> reg = client->RegisterWorker(Info("w"));
  ASSERT_TRUE(reg.ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_TRUE(client->ReportEvents("w", 1, Stored(held)).ok());
  ResolveResult before = Resolve(*client, two_);
  server.reset();
  EXPECT_FALSE(client->Heartbeat("w", {}).ok());  // registry away: UNAVAILABLE

  server = std::make_unique<Server>(&clock_, port);  // same address, empty state
  // The worker's recovery: heartbeats fail with UNAVAILABLE until the channel reconnects, then
  // with NOT_FOUND; so it re-registers (new epoch) and resyncs.
  absl::Status hb = client->Heartbeat("w", {}).status();
  for (int i = 0; i < 100 && hb.code() == absl::StatusCode::kUnavailable; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    hb = client->Heartbeat("w", {}).status();
  }
  EXPECT_EQ(hb.code(), absl::StatusCode::kNotFound) << hb;
  EXPECT_EQ(Resolve(*client, two_).workers.size(), 0u);
  absl::StatusOr<RegisterResult> again = client->RegisterWorker(Info("w"));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->registry_epoch, reg->registry_epoch);
  absl::StatusOr<int> n = client->Resync("w", held, 1);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  ResolveResult after = Resolve(*client, two_);
  ASSERT_EQ(after.workers.size(), 1u);
  EXPECT_EQ(after.workers[0].matched_tokens, before.workers[0].matched_tokens);
  EXPECT_EQ(after.workers[0].matched_chunks, before.workers[0].matched_chunks);
}

TEST_F(RegistryGrpcTest, EventGapTriggersResyncAndRepeatsAreIdempotent) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  ASSERT_TRUE(client->RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_FALSE(client->ReportEvents("w", 1, Stored({held[0]}))->resync_required);
  absl::StatusOr<ReportResult> repeat = client->ReportEvents("w", 1, Stored({held[0]}));
  ASSERT_TRUE(repeat.ok());
  EXPECT_FALSE(repeat->resync_required);
  EXPECT_EQ(repeat->applied_seq, 1u);
  absl::StatusOr<ReportResult> gap = client->ReportEvents("w", 5, Stored({held[1]}));
  ASSERT_TRUE(gap.ok());
  EXPECT_TRUE(gap->resync_required);
  EXPECT_EQ(Resolve(*client, two_).workers[0].matched_tokens, 96);
  ASSERT_TRUE(client->Resync("w", held, 5).ok());
  EXPECT_EQ(Resolve(*client, two_).workers[0].matched_tokens, 192);
  EXPECT_FALSE(client->ReportEvents("w", 6, {})->resync_required);
  EXPECT_EQ(server.registry().GetStats().resyncs_requested, 1);
}

TEST_F(RegistryGrpcTest, AdminRpcsListInspectPinEvictWorkersAndStats) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  auto stub = server.Stub();
  ASSERT_TRUE(client->RegisterWorker(Info("w")).ok());
  std::vector<HeldChunk> held = HeldFor(two_, 16, 200);
  ASSERT_TRUE(client->ReportEvents("w", 1, Stored(held)).ok());
  ASSERT_TRUE(client->Heartbeat("w", WorkerLoad{2, 1, 50, 100}).ok());
  Resolve(*client, two_);

  v2::ListChunksRequest list_req;
  v2::ListChunksResponse list;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->ListChunks(&c1, list_req, &list).ok());
  EXPECT_EQ(list.total(), 2);
  ASSERT_EQ(list.chunks_size(), 2);

  v2::GetChunkRequest get_req;
  get_req.set_hash(held[1].hash.ToHex());
  v2::GetChunkResponse got;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub->GetChunk(&c2, get_req, &got).ok());
  ASSERT_TRUE(got.has_chunk());
  const v2::ChunkRecord& rec = got.chunk();
  EXPECT_EQ(rec.hash(), held[1].hash.ToHex());
  EXPECT_EQ(rec.start(), 100);
  EXPECT_EQ(rec.num_tokens(), 100);
  EXPECT_EQ(rec.parent_hash(), held[0].hash.ToHex());
  ASSERT_EQ(rec.holders_size(), 1);
  EXPECT_EQ(rec.holders(0).held_tokens(), 192);
  EXPECT_GT(rec.last_used_ms(), 0);

  absl::StatusOr<int64_t> until = client->PinChunk(held[0].hash, 30, std::nullopt);
  ASSERT_TRUE(until.ok()) << until.status();
  absl::StatusOr<HeartbeatResult> hb = client->Heartbeat("w", {});
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->pinned_hashes, std::vector<Hash128>{held[0].hash});
  v2::UnpinChunkRequest unpin;
  unpin.set_hash(held[0].hash.ToHex());
  v2::UnpinChunkResponse unpinned;
  grpc::ClientContext c3;
  ASSERT_TRUE(stub->UnpinChunk(&c3, unpin, &unpinned).ok());

  v2::EvictChunkRequest evict;
  evict.set_hash(held[1].hash.ToHex());
  v2::EvictChunkResponse evicted;
  grpc::ClientContext c4;
  ASSERT_TRUE(stub->EvictChunk(&c4, evict, &evicted).ok());
  EXPECT_EQ(evicted.workers(), 1);
  hb = client->Heartbeat("w", {});
  EXPECT_TRUE(hb->pinned_hashes.empty());
  EXPECT_EQ(hb->evict_hashes, std::vector<Hash128>{held[1].hash});

  v2::ListWorkersResponse workers;
  grpc::ClientContext c5;
  ASSERT_TRUE(stub->ListWorkers(&c5, v2::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).chunks(), 1);
  EXPECT_EQ(workers.workers(0).block_size(), 16);
  EXPECT_EQ(workers.workers(0).lease_expires_ms(), clock_.NowMs() + 1000);

  v2::GetStatsResponse stats;
  grpc::ClientContext c6;
  ASSERT_TRUE(stub->GetStats(&c6, v2::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.resolves(), 1);
  EXPECT_EQ(stats.resolve_hits(), 1);
  EXPECT_EQ(stats.workers(), 1);
}

TEST_F(RegistryGrpcTest, BadRequestsGetClearStatusesAndLeaveOthersAlone) {
  RegistryOptions o;
  o.max_chunks_per_request = 4;
  o.max_tokens_per_request = 150;
  Server server(&clock_, 0, o);
  auto client = std::make_unique<ClusterClient>(server.address());
  auto stub = server.Stub();
  ASSERT_TRUE(client->RegisterWorker(Info("good")).ok());
  ASSERT_TRUE(client->ReportEvents("good", 1, Stored(HeldFor(two_, 16, 200))).ok());

  std::vector<hash::ChunkSpec> specs = two_.Specs();
  absl::Status s = client->Resolve({"m", "", specs}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_tokens_per_request"), std::string::npos) << s;
  EXPECT_EQ(client->Heartbeat("nobody", {}).status().code(), absl::StatusCode::kNotFound);
  // An id no certificate can name is refused before the registry looks at it.
  EXPECT_EQ(client->ReportEvents("bad/id", 1, {}).status().code(),
            absl::StatusCode::kPermissionDenied);

  v2::GetChunkRequest get_req;
  get_req.set_hash("not-a-hash");
  v2::GetChunkResponse rec;
  grpc::ClientContext c1;
  grpc::Status gs = stub->GetChunk(&c1, get_req, &rec);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(gs.error_message().find("hash"), std::string::npos);

  v2::ReportEventsRequest bad_events;
  bad_events.set_worker_id("good");
  bad_events.set_seq(2);
  bad_events.add_events()->mutable_chunk()->set_hash("zz");
  v2::ReportEventsResponse resp;
  grpc::ClientContext c2;
  gs = server.Stub(Role::kWorker, "good")->ReportEvents(&c2, bad_events, &resp);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(gs.error_message().find("events[0].type"), std::string::npos) << gs.error_message();

  // None of that touched the good worker.
  Prompt first_only{.tokens = {two_.tokens[0]}, .kinds = {1}};
  ResolveResult r = Resolve(*client, first_only);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_tokens, 96);
  EXPECT_FALSE(client->ReportEvents("good", 2, {})->resync_required);
}

// The refusal quotes the id it was asked to act for, which the caller chose: escaped, so control
// bytes never reach a client's status or a log raw.
TEST_F(RegistryGrpcTest, AnotherWorkersIdComesBackEscapedInThePermissionError) {
  Server server(&clock_);
  v2::HeartbeatRequest req;
  req.set_worker_id(std::string("evil\x01\n\\", 7));
  v2::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = server.Stub(Role::kWorker, "w0")->Heartbeat(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("cascade://worker/w0 may not act for worker "
                                    "'evil\\x01\\x0a\\x5c'"),
            std::string::npos)
      << st.error_message();
  for (char c : st.error_message()) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
}

TEST_F(RegistryGrpcTest, CallsToAnAbsentRegistryFailFastWithinTheDeadline) {
  GrpcRegistryClientOptions o;
  o.resolve_timeout_ms = 200;
  o.timeout_ms = 200;
  auto client = NewGrpcRegistryClient("127.0.0.1:1", o);
  auto start = std::chrono::steady_clock::now();
  std::vector<hash::ChunkSpec> specs = two_.Specs();
  absl::Status s = client->Resolve({"m", "", specs}).status();
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST_F(RegistryGrpcTest, ConcurrentResolvesWhileEventsStreamIn) {
  Server server(&clock_);
  auto client = std::make_unique<ClusterClient>(server.address());
  std::vector<Prompt> prompts;
  for (int i = 0; i < 8; ++i)
    prompts.push_back(Prompt{.tokens = {Tokens(64, 1), Tokens(32, i * 100)}});
  for (int w = 0; w < 3; ++w)
    ASSERT_TRUE(client->RegisterWorker(Info("w" + std::to_string(w))).ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        const Prompt& p = prompts[(t + i) % prompts.size()];
        std::vector<hash::ChunkSpec> specs = p.Specs();
        absl::StatusOr<ResolveResult> r = client->Resolve({p.model, p.salt, specs});
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->chunks[1].start, 64);
        for (const WorkerMatch& m : r->workers) ASSERT_LE(m.matched_tokens, 96);
      }
    });
  }
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      std::string id = "w" + std::to_string(w);
      for (uint64_t seq = 1; seq <= 60; ++seq) {
        const Prompt& p = prompts[seq % prompts.size()];
        absl::StatusOr<ReportResult> r = client->ReportEvents(id, seq, Stored(HeldFor(p, 16, 96)));
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(r->resync_required);
      }
    });
  }
  for (size_t i = 4; i < threads.size(); ++i) threads[i].join();
  stop.store(true);
  for (size_t i = 0; i < 4; ++i) threads[i].join();
  ResolveResult r = Resolve(*client, prompts[0]);
  ASSERT_EQ(r.workers.size(), 3u);
  for (const WorkerMatch& m : r.workers) EXPECT_EQ(m.matched_tokens, 96);
}

}  // namespace
}  // namespace cascade::registry
