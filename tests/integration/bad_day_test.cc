// Regression tests for issue 9's findings against the gateway: ids that cannot be gRPC metadata,
// token ids with no text, unbounded echoes in errors, token ids against the prompt memory bound,
// and admission that follows what the workers can serve. Each fails on the code before the fix
// (a dead gateway, a dropped token, a 100 KB message, INVALID_ARGUMENT after a full parse, a
// worker running every request at once).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "cache_service/server/registry_service.h"
#include "gpu_worker/service/worker_service.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using ::testing::HasSubstr;

TEST(BadDayTest, IdsThatCannotBeMetadataAreRefusedAndTheGatewayLivesOn) {
  Stack stack({.workers = 1});
  const std::vector<std::string> bad_ids = {"abc\ndef", std::string("a\0b", 3), "s\xc3\xa9",
                                            "with space", std::string(20000, 'x')};
  for (const std::string& id : bad_ids) {
    auto req = Req("sys", "q", 2);
    req.set_request_id(id);
    Reply r = Generate(stack.gateway(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr("request_id"));
    EXPECT_LE(r.status.error_message().size(), 200u);
  }
  for (const std::string& id : bad_ids) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stack.gateway().Chat(&ctx);
    cascade::v2::ChatRequest req;
    req.set_session_id(id);
    auto* c = req.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_QUERY);
    c->set_text("hi");
    req.mutable_sampling()->set_max_tokens(2);
    stream->Write(req);
    stream->WritesDone();
    cascade::v2::ChatResponse resp;
    while (stream->Read(&resp)) {
    }
    grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("session_id"));
  }
  // The gateway is alive and serves a good id (the printable ASCII ones travel as metadata).
  auto good = Req("sys", "q", 2);
  good.set_request_id("req-42_a.b:c/d");
  Reply ok = Generate(stack.gateway(), good);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.start.request_id(), "req-42_a.b:c/d");
}

TEST(BadDayTest, EchoedInputIsBoundedInEveryErrorMessage) {
  Stack stack({.workers = 1});
  // A stream on the same channel must not be disturbed by a huge error (a grpc-js client's
  // connection stalled on a 100 KB status message).
  grpc::ClientContext bg_ctx;
  bg_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto bg = stack.gateway().Generate(&bg_ctx, Req("sys", "background", 30));
  const std::string huge(100000, 'm');
  {
    auto req = Req("sys", "q", 2);
    req.set_model(huge);
    Reply r = Generate(stack.gateway(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(r.status.error_message(), HasSubstr("model"));
    EXPECT_THAT(r.status.error_message(), HasSubstr("(100000 bytes)"));
    EXPECT_LE(r.status.error_message().size(), 1024u);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    cascade::v2::TokenizeRequest req;
    req.set_model(huge);
    req.set_text("hello");
    cascade::v2::TokenizeResponse resp;
    grpc::Status st = stack.gateway().Tokenize(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LE(st.error_message().size(), 1024u);
  }
  {
    // Straight at the worker (as the gateway), which echoes the model too.
    auto stub = cascade::v2::WorkerService::NewStub(stack.WorkerChannel(0, common::Role::kGateway));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    cascade::v2::WorkerServiceGenerateRequest req;
    req.set_model(huge);
    auto* c = req.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_RAW);
    c->add_token_ids(5);
    req.mutable_sampling()->set_max_tokens(1);
    auto reader = stub->Generate(&ctx, req);
    cascade::v2::WorkerServiceGenerateResponse m;
    while (reader->Read(&m)) {
    }
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LE(st.error_message().size(), 1024u);
  }
  cascade::v2::GenerateResponse m;
  int64_t completion = 0;
  while (bg->Read(&m)) {
    if (m.has_finish()) completion = m.finish().usage().completion_tokens();
  }
  EXPECT_TRUE(bg->Finish().ok());
  EXPECT_EQ(completion, 30);
}

TEST(BadDayTest, TokenIdsCountAgainstThePromptMemoryBound) {
  Stack stack({.workers = 1});
  // 1.2M ids of one wire byte each: 1.2 MB on the wire, 4.8 MB as ids, over the 4 MB bound.
  auto req = Req("", "q", 2);
  auto* c = req.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_RAW);
  c->mutable_token_ids()->mutable_ids()->Resize(1200000, 5);
  Reply r = Generate(stack.gateway(), req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("token ids"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("--max_prompt_bytes"));
  // 3M ids of three wire bytes: refused before parsing, by size.
  c->mutable_token_ids()->mutable_ids()->Resize(3000000, 100000);
  r = Generate(stack.gateway(), req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  Reply ok = Generate(stack.gateway(), Req("sys", "q", 2));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

// A Worker service whose Generate follows a script, to drive the gateway's relay exactly: what a
// real model emits (an id beyond the tokenizer's 151669 texts) and how a real worker dies.
class ScriptedWorker final : public cascade::v2::WorkerService::Service {
 public:
  using Script =
      std::function<grpc::Status(int call, const cascade::v2::WorkerServiceGenerateRequest&,
                                 grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>*)>;
  explicit ScriptedWorker(Script script, std::atomic<int>* calls)
      : script_(std::move(script)), calls_(calls) {
    grpc::ServerBuilder b;
    // Served like a real worker: mTLS with roles, under worker w0's certificate.
    auto creds = common::MakeInternalServerCredentials(
        {StackAuth(false, common::Role::kWorker, "w0"), worker::WorkerMethodPolicy()});
    EXPECT_TRUE(creds.ok()) << creds.status();
    b.AddListeningPort("127.0.0.1:0", *creds, &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~ScriptedWorker() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status Generate(
      grpc::ServerContext*, const cascade::v2::WorkerServiceGenerateRequest* req,
      grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>* w) override {
    return script_(calls_->fetch_add(1), *req, w);
  }

 private:
  Script script_;
  std::atomic<int>* calls_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

void SendStart(grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>* w, int64_t prompt) {
  cascade::v2::WorkerServiceGenerateResponse m;
  m.mutable_start()->set_worker_id("scripted");
  m.mutable_start()->set_prompt_tokens(prompt);
  w->Write(m);
}
void SendTokens(grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>* w,
                std::vector<int32_t> ids) {
  cascade::v2::WorkerServiceGenerateResponse m;
  m.mutable_tokens()->mutable_token_ids()->Assign(ids.begin(), ids.end());
  w->Write(m);
}
void SendFinish(grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>* w) {
  cascade::v2::WorkerServiceGenerateResponse m;
  m.mutable_finish()->set_finish_reason(cascade::v2::FINISH_REASON_LENGTH);
  w->Write(m);
}

std::unique_ptr<gateway::GatewayServer> GatewayOver(const std::vector<std::string>& workers) {
  gateway::GatewayConfig g;
  g.server = TestServerOptions("cascade-gateway");
  g.model_dir = TinyModelDir();
  for (const auto& w : workers) g.workers += (g.workers.empty() ? "" : ",") + w;
  g.internal_auth = StackAuth(false, common::Role::kGateway);
  auto gw = gateway::GatewayServer::Start(g);
  EXPECT_TRUE(gw.ok()) << gw.status();
  return gw.ok() ? std::move(*gw) : nullptr;
}

constexpr int32_t kNoTextId = 151700;  // a model id past the tokenizer's texts

TEST(BadDayTest, AnIdWithNoTextReachesTheClientAndTheUsage) {
  std::atomic<int> calls{0};
  ScriptedWorker worker(
      [](int, const auto& req, auto* w) {
        SendStart(w, 10);
        SendTokens(w, {100, kNoTextId});
        SendTokens(w, {200});
        SendFinish(w);
        return grpc::Status::OK;
      },
      &calls);
  auto gw = GatewayOver({worker.address()});
  ASSERT_NE(gw, nullptr);
  auto stub = cascade::v2::GatewayService::NewStub(
      grpc::CreateChannel(gw->address(), grpc::InsecureChannelCredentials()));
  Reply r = Generate(*stub, Req("sys", "q", 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{100, kNoTextId, 200}));
  EXPECT_EQ(r.finish.usage().completion_tokens(), 3);
}

TEST(BadDayTest, AResumedStreamCarriesAnIdWithNoTextIntoTheResumePrompt) {
  std::atomic<int> calls{0};
  std::mutex mu;
  cascade::v2::WorkerServiceGenerateRequest resumed;
  auto script = [&](int call, const cascade::v2::WorkerServiceGenerateRequest& req,
                    grpc::ServerWriter<cascade::v2::WorkerServiceGenerateResponse>* w) {
    if (call == 0) {  // the first worker emits two tokens, then dies
      SendStart(w, 10);
      SendTokens(w, {100, kNoTextId});
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker killed");
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      resumed = req;
    }
    SendStart(w, 12);
    SendTokens(w, {300});
    SendFinish(w);
    return grpc::Status::OK;
  };
  ScriptedWorker a(script, &calls), b(script, &calls);
  auto gw = GatewayOver({a.address(), b.address()});
  ASSERT_NE(gw, nullptr);
  auto stub = cascade::v2::GatewayService::NewStub(
      grpc::CreateChannel(gw->address(), grpc::InsecureChannelCredentials()));
  Reply r = Generate(*stub, Req("sys", "q", 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{100, kNoTextId, 300}));
  EXPECT_EQ(r.finish.usage().completion_tokens(), 3);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GT(resumed.chunks_size(), 0);
  const auto& last = resumed.chunks(resumed.chunks_size() - 1);
  EXPECT_EQ(last.kind(), cascade::v2::CHUNK_KIND_ASSISTANT);
  EXPECT_EQ(std::vector<int32_t>(last.token_ids().begin(), last.token_ids().end()),
            (std::vector<int32_t>{100, kNoTextId}));
  EXPECT_EQ(resumed.sampling().max_tokens(), 1);
}

// A gateway config for start-up checks: the tiny model and one worker address nothing listens on.
gateway::GatewayConfig UnreachableWorkerGateway() {
  gateway::GatewayConfig g;
  g.server = TestServerOptions("cascade-gateway");
  g.model_dir = TinyModelDir();
  g.workers = "127.0.0.1:1";
  return g;
}

TEST(BadDayTest, BadAdmissionFlagsAreRefusedAtStartWithTheirNames) {
  for (auto mutate : std::vector<std::function<void(gateway::AdmissionOptions&)>>{
           [](auto& a) { a.initial_limit = 0; }, [](auto& a) { a.latency_tolerance = 1.0; },
           [](auto& a) { a.queue_timeout = absl::Seconds(-1); },
           [](auto& a) { a.tpot_target = absl::Milliseconds(-1); },
           [](auto& a) { a.max_limit = 2; }}) {
    gateway::GatewayConfig g = UnreachableWorkerGateway();
    mutate(g.gateway.admission);
    auto gw = gateway::GatewayServer::Start(g);
    ASSERT_FALSE(gw.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(gw.status()));
    EXPECT_THAT(std::string(gw.status().message()), HasSubstr("--admission_initial_limit"));
  }
}

TEST(BadDayTest, ANegativeRouteRecentMsIsRefusedAtStart) {
  gateway::GatewayConfig g = UnreachableWorkerGateway();
  g.gateway.route_recent_ms = -1;
  auto gw = gateway::GatewayServer::Start(g);
  ASSERT_FALSE(gw.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(gw.status()));
  EXPECT_THAT(std::string(gw.status().message()), HasSubstr("--route_recent_ms -1: need >= 0"));
}

TEST(BadDayTest, AnUnknownReasoningParserIsRefusedAtStart) {
  gateway::GatewayConfig g = UnreachableWorkerGateway();
  g.reasoning_parser = "deepseek_r1";
  auto gw = gateway::GatewayServer::Start(g);
  ASSERT_FALSE(gw.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(gw.status()));
  EXPECT_THAT(std::string(gw.status().message()),
              HasSubstr("--reasoning_parser='deepseek_r1': must be qwen3 or empty (off)"));
}

TEST(BadDayTest, BadHttpThreadsAreRefusedAtStartWithTheFlagsName) {
  for (int threads : {0, -3, gateway::kMaxHttpThreads + 1, 1 << 20}) {
    gateway::GatewayConfig g = UnreachableWorkerGateway();
    g.http_port = 0;
    g.http_threads = threads;
    auto gw = gateway::GatewayServer::Start(g);
    ASSERT_FALSE(gw.ok()) << threads;
    EXPECT_TRUE(absl::IsInvalidArgument(gw.status()));
    EXPECT_THAT(std::string(gw.status().message()), HasSubstr("--http_threads"));
  }
  // With the HTTP API off, the flag is not looked at.
  gateway::GatewayConfig g = UnreachableWorkerGateway();
  g.internal_auth = StackAuth(false, common::Role::kGateway);
  g.http_port = -1;
  g.http_threads = 0;
  auto gw = gateway::GatewayServer::Start(g);
  ASSERT_TRUE(gw.ok()) << gw.status();
}

TEST(BadDayTest, AClientMayResendAnIdWithNoText) {
  Stack stack({.workers = 1});
  cascade::v2::GenerateRequest r;
  auto* c = r.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_RAW);
  for (int id : {9707, kNoTextId}) c->mutable_token_ids()->add_ids(id);
  r.set_add_generation_prompt(false);
  r.mutable_sampling()->set_max_tokens(2);
  Reply rep = Generate(stack.gateway(), r);
  ASSERT_TRUE(rep.status.ok()) << rep.status.error_message();
}

TEST(BadDayTest, OverloadIsRefusedAndAWorkerNeverRunsMoreThanItsLimit) {
  gateway::AdmissionOptions a;
  a.adaptive = false;
  a.initial_limit = 2;
  a.queue_timeout = absl::Milliseconds(300);
  Stack stack({.workers = 1, .max_concurrent = 256, .admission = a});
  constexpr int kClients = 12;
  std::atomic<bool> done{false};
  std::atomic<int> peak{0};
  std::thread watcher([&] {
    while (!done) {
      auto st = stack.WorkerStats(0);
      peak = std::max<int>(peak, st.running() + st.waiting());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      replies[i] = Generate(stack.gateway(), Req("sys", "question " + std::to_string(i), 40));
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  watcher.join();
  int ok = 0, refused = 0;
  for (const Reply& r : replies) {
    if (r.status.ok()) {
      ++ok;
      EXPECT_EQ(r.finish.usage().completion_tokens(), 40);
    } else {
      ++refused;
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << r.status.error_message();
      EXPECT_THAT(r.status.error_message(), HasSubstr("queue_timeout"));
    }
  }
  EXPECT_GE(ok, 2);
  EXPECT_GE(refused, 1) << "12 requests of 40 tokens on a limit of 2 within 300 ms";
  EXPECT_LE(peak.load(), 2) << "the worker ran more requests than its admission limit";
}

// Serves `service` as the registry (the gateway's mTLS role checks pass); sets `*port`.
std::unique_ptr<grpc::Server> StartFakeRegistry(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  auto creds = common::MakeInternalServerCredentials(
      {StackAuth(false, common::Role::kRegistry), registry::RegistryMethodPolicy()});
  EXPECT_TRUE(creds.ok()) << creds.status();
  b.AddListeningPort("127.0.0.1:0", *creds, port);
  b.RegisterService(service);
  return b.BuildAndStart();
}

// A registry that accepts connections and answers nothing (a hung process, a black-holed
// network): each Resolve waits for its caller's deadline.
class HungRegistry final : public cascade::v2::ChunkRegistryService::Service {
 public:
  HungRegistry() : server_(StartFakeRegistry(this, &port_)) {}
  ~HungRegistry() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int calls() const { return calls_; }

  grpc::Status Resolve(grpc::ServerContext* ctx, const cascade::v2::ResolveRequest*,
                       cascade::v2::ResolveResponse*) override {
    ++calls_;
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
  }

 private:
  int port_ = 0;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

TEST(BadDayTest, AHungRegistryCostsOneTimeoutNotOneARequest) {
  HungRegistry registry;
  Stack stack({.workers = 1, .registry = false, .tweak_gateway = [&](gateway::GatewayConfig* g) {
                 g->registry_address = registry.address();
               }});
  // Each Resolve waits 500 ms (the gateway's resolve timeout) on a gRPC thread of the gateway;
  // after the first, the registry's breaker skips it for 1 s (then one probe, then 2 s), and the
  // requests route on load alone, at once.
  constexpr int kRequests = 12;
  for (int i = 0; i < kRequests; ++i) {
    Reply r = Generate(stack.gateway(), Req("sys", "q" + std::to_string(i), 2));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_GE(registry.calls(), 1);
  EXPECT_LE(registry.calls(), 4) << "every request waited for the hung registry";
}

// A registry that answers, slowly: each Resolve waits until `want` of them are in flight at
// once (or 400 ms, under the gateway's 500 ms resolve timeout), then answers with no matches.
class SlowRegistry final : public cascade::v2::ChunkRegistryService::Service {
 public:
  explicit SlowRegistry(int want) : want_(want), server_(StartFakeRegistry(this, &port_)) {}
  ~SlowRegistry() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

  grpc::Status Resolve(grpc::ServerContext*, const cascade::v2::ResolveRequest*,
                       cascade::v2::ResolveResponse*) override {
    std::unique_lock<std::mutex> lock(mu_);
    peak_ = std::max(peak_, ++inflight_);
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::milliseconds(400), [&] { return peak_ >= want_; });
    --inflight_;
    return grpc::Status::OK;
  }
  // PinChunk likewise, counted apart, waiting up to 2.5 s (under the client's 3 s deadline).
  int pin_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return pin_peak_;
  }
  grpc::Status PinChunk(grpc::ServerContext*, const cascade::v2::PinChunkRequest*,
                        cascade::v2::PinChunkResponse* resp) override {
    std::unique_lock<std::mutex> lock(mu_);
    pin_peak_ = std::max(pin_peak_, ++pin_inflight_);
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::milliseconds(2500), [&] { return pin_peak_ >= want_; });
    --pin_inflight_;
    resp->set_pinned_until_ms(1);
    return grpc::Status::OK;
  }

 private:
  const int want_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int inflight_ = 0, peak_ = 0, pin_inflight_ = 0, pin_peak_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Runs call(i) for i in [0, n) on n threads at once; how many returned true.
int RunAtOnce(int n, const std::function<bool(int)>& call) {
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { ok += call(i); });
  for (std::thread& t : clients) t.join();
  return ok.load();
}

TEST(BadDayTest, ASlowRegistryHoldsNoGatewayThread) {
  // The gateway asked the registry synchronously on gRPC's reaction threads (two on a 2-core
  // machine), so a registry taking 300 ms capped it near 7 requests/s, token relay included.
  constexpr int kRequests = 16;
  SlowRegistry registry(kRequests);
  Stack stack({.workers = 1, .registry = false, .tweak_gateway = [&](gateway::GatewayConfig* g) {
                 g->registry_address = registry.address();
               }});
  EXPECT_EQ(
      RunAtOnce(
          kRequests,
          [&](int i) {
            return Generate(stack.gateway(), Req("sys", "q" + std::to_string(i), 2)).status.ok();
          }),
      kRequests);
  EXPECT_EQ(registry.peak(), kRequests) << "the gateway's Resolve calls queued behind each other";
}

TEST(BadDayTest, ABurstReachesTheRegistryOnlyUpToMaxConcurrent) {
  // Requests being routed were not counted against --max_concurrent: a burst put every request in
  // front of the registry, and all but max_concurrent were refused only once resolved.
  constexpr int kRequests = 12, kMax = 4;
  SlowRegistry registry(kRequests);  // each Resolve waits 400 ms (fewer than 12 ever come)
  Stack stack({.workers = 1, .registry = false, .tweak_gateway = [&](gateway::GatewayConfig* g) {
                 g->registry_address = registry.address();
                 g->gateway.max_concurrent = kMax;
               }});
  std::atomic<int> refused{0};
  const int ok = RunAtOnce(kRequests, [&](int i) {
    const Reply r = Generate(stack.gateway(), Req("sys", "q" + std::to_string(i), 2));
    if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_NE(r.status.error_message().find("--max_concurrent"), std::string::npos)
          << r.status.error_message();
      ++refused;
    } else {
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    }
    return r.status.ok();
  });
  EXPECT_GE(ok, 1);
  EXPECT_EQ(ok + refused.load(), kRequests);
  EXPECT_LE(registry.peak(), kMax) << "more requests were routed at once than --max_concurrent";
}

TEST(BadDayTest, RegisterChunkPinsWithoutHoldingAThread) {
  // RegisterChunk's pins ran synchronously on the callback thread of the worker call that ended
  // its turn (a few threads for the whole gateway), so a slow registry had only a few in flight.
  constexpr int kRequests = 16;
  SlowRegistry registry(kRequests);
  Stack stack({.workers = 1, .registry = false, .tweak_gateway = [&](gateway::GatewayConfig* g) {
                 g->registry_address = registry.address();
               }});
  auto register_chunk = [&](int i) {
    cascade::v2::RegisterChunkRequest req;
    auto* c = req.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
    c->set_text("system prompt number " + std::to_string(i));
    req.set_pin_ttl_seconds(60);
    cascade::v2::RegisterChunkResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status st = stack.gateway().RegisterChunk(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return st.ok() && resp.chunks_size() == 1;
  };
  EXPECT_EQ(RunAtOnce(kRequests, register_chunk), kRequests);
  EXPECT_EQ(registry.pin_peak(), kRequests) << "the gateway's pins queued behind each other";
}

}  // namespace
}  // namespace cascade::testing
