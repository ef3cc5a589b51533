// RegistryAgent against an in-process registry (through RegistryClient, with faults injected
// between them): it registers and reports what the engine holds, resyncs after a lost batch and
// after a registry restart, heartbeats the engine's load, applies the registry's evictions and
// pins, and deregisters.
#include "gpu_worker/service/registry_agent.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cache_service/registry/registry.h"
#include "common/log.h"
#include "common/mutex.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/trace_backend.h"

namespace cascade::worker {
namespace {

using registry::Registry;
using registry::RegistryClient;

constexpr int kBlock = 8;

// Forwards to whichever registry is current (a restart swaps it) and fails calls on request.
class FaultyClient final : public RegistryClient {
 public:
  explicit FaultyClient(Registry* r) : inner_(registry::NewInProcessRegistryClient(r)) {}

  void SwapRegistry(Registry* r) {
    MutexLock lock(&mu_);
    inner_ = registry::NewInProcessRegistryClient(r);
  }
  void FailNextReports(int n) {
    MutexLock lock(&mu_);
    fail_reports_ = n;
  }
  void SetDown(bool down) {
    MutexLock lock(&mu_);
    down_ = down;
  }
  int resyncs() const {
    MutexLock lock(&mu_);
    return resyncs_;
  }
  int registrations() const {
    MutexLock lock(&mu_);
    return registrations_;
  }

  absl::StatusOr<registry::ResolveResult> Resolve(const registry::ResolveInput& in) override {
    return Down();
  }
  absl::StatusOr<int64_t> PinChunk(const registry::Hash128&, int64_t,
                                   const std::optional<registry::HeldChunk>&) override {
    return Down();
  }
  absl::StatusOr<registry::RegisterResult> RegisterWorker(
      const registry::WorkerInfo& info) override {
    MutexLock lock(&mu_);
    if (down_) return Down();
    ++registrations_;
    return inner_->RegisterWorker(info);
  }
  absl::StatusOr<registry::HeartbeatResult> Heartbeat(std::string_view worker_id,
                                                      const registry::WorkerLoad& load) override {
    MutexLock lock(&mu_);
    if (down_) return Down();
    return inner_->Heartbeat(worker_id, load);
  }
  absl::StatusOr<registry::ReportResult> ReportEvents(
      std::string_view worker_id, uint64_t seq,
      std::span<const registry::ChunkEvent> events) override {
    MutexLock lock(&mu_);
    if (down_) return Down();
    if (fail_reports_ > 0) {
      --fail_reports_;
      return absl::UnavailableError("injected: the batch was lost");
    }
    return inner_->ReportEvents(worker_id, seq, events);
  }
  absl::StatusOr<int> Resync(std::string_view worker_id,
                             std::span<const registry::HeldChunk> chunks, uint64_t seq) override {
    MutexLock lock(&mu_);
    if (down_) return Down();
    ++resyncs_;
    return inner_->Resync(worker_id, chunks, seq);
  }
  absl::Status Deregister(std::string_view worker_id) override {
    MutexLock lock(&mu_);
    if (down_) return Down();
    return inner_->Deregister(worker_id);
  }

 private:
  static absl::Status Down() { return absl::UnavailableError("injected: registry down"); }

  mutable Mutex mu_;
  std::unique_ptr<RegistryClient> inner_ ABSL_GUARDED_BY(mu_);
  int fail_reports_ ABSL_GUARDED_BY(mu_) = 0;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int resyncs_ ABSL_GUARDED_BY(mu_) = 0;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

// Polls `cond` for up to 5 s.
bool Eventually(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// The engine every test here runs: the trace backend, 64 blocks of kBlock tokens, vocabulary 97.
std::unique_ptr<engine::Engine> TraceEngine() {
  engine::EngineOptions eo;
  eo.model_name = "trace";
  return engine::NewEngine(eo, std::make_unique<engine::testing::TraceBackend>(64, kBlock, 97));
}

// Worker w1's agent over that engine, heartbeating every 20 ms.
AgentOptions TraceAgent() {
  AgentOptions ao;
  ao.worker_id = "w1";
  ao.address = "127.0.0.1:1";
  ao.model = "trace";
  ao.block_size = kBlock;
  ao.max_context = 4096;
  ao.vocab_size = 97;
  ao.heartbeat_ms = 20;
  return ao;
}

class RegistryAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_unique<Registry>(registry::RegistryOptions{});
    engine_ = TraceEngine();
    auto client = std::make_unique<FaultyClient>(registry_.get());
    client_ = client.get();
    agent_ = RegistryAgent::Start(TraceAgent(), engine_.get(), std::move(client));
  }

  // Runs a prompt of one 24-token chunk filled with `fill` (three full blocks) through the engine
  // and tells the agent; returns the chunk's hash.
  hash::Hash128 Serve(int32_t fill) {
    engine::Request r;
    r.chunks = {engine::ChunkInput{1, std::vector<int32_t>(24, fill), ""}};
    r.sampling.max_tokens = 1;
    engine::testing::Result res = engine::testing::RunOne(*engine_, r);
    agent_->OnStep();
    return res.chunks.at(0).hash;
  }

  bool RegistryHolds(Registry& reg, const hash::Hash128& h) {
    auto rec = reg.GetChunk(h);
    if (!rec.ok()) return false;
    for (const auto& holder : rec->holders) {
      if (holder.worker_id == "w1") return true;
    }
    return false;
  }

  std::unique_ptr<Registry> registry_;
  std::unique_ptr<engine::Engine> engine_;
  FaultyClient* client_ = nullptr;  // owned by the agent
  std::unique_ptr<RegistryAgent> agent_;
};

TEST_F(RegistryAgentTest, RegistersAndReportsWhatTheEngineStores) {
  ASSERT_TRUE(Eventually([&] { return agent_->registered(); }));
  const hash::Hash128 h = Serve(3);
  EXPECT_TRUE(Eventually([&] { return RegistryHolds(*registry_, h); }));
  const auto workers = registry_->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].info.address, "127.0.0.1:1");
  EXPECT_EQ(workers[0].info.block_size, kBlock);
  EXPECT_EQ(workers[0].info.kv_capacity_blocks, 64);
  EXPECT_EQ(workers[0].info.kv_numerics, "trace");  // Backend::KvNumerics, for the router
}

TEST_F(RegistryAgentTest, HeartbeatsCarryTheEnginesLoad) {
  ASSERT_TRUE(Eventually([&] { return agent_->registered(); }));
  Serve(3);  // three blocks stay cached, unreferenced: still free
  EXPECT_TRUE(Eventually([&] {
    const auto w = registry_->ListWorkers();
    return w.size() == 1 && w[0].load.total_kv_blocks == 64 &&
           w[0].load.free_kv_blocks == engine_->Stats().free_blocks;
  }));
}

TEST_F(RegistryAgentTest, ALostBatchIsSettledByAResync) {
  ASSERT_TRUE(Eventually([&] { return agent_->registered(); }));
  ASSERT_TRUE(Eventually([&] { return client_->resyncs() >= 1; })) << "no resync after joining";
  const int resyncs = client_->resyncs();
  client_->FailNextReports(1);
  const hash::Hash128 h = Serve(4);
  EXPECT_TRUE(Eventually([&] { return RegistryHolds(*registry_, h); }))
      << "the chunk of the lost batch never reached the registry";
  EXPECT_GT(client_->resyncs(), resyncs);
}

TEST_F(RegistryAgentTest, ARestartedRegistryLearnsEverythingHeldAgain) {
  const hash::Hash128 a = Serve(5);
  ASSERT_TRUE(Eventually([&] { return RegistryHolds(*registry_, a); }));
  const int joins = client_->registrations();
  // The registry goes away, then comes back empty with a new epoch.
  client_->SetDown(true);
  EXPECT_TRUE(Eventually([&] { return !agent_->registered(); }));
  const hash::Hash128 b = Serve(6);  // stored while the registry was away
  auto restarted = std::make_unique<Registry>(registry::RegistryOptions{});
  ASSERT_NE(restarted->epoch(), registry_->epoch());
  client_->SwapRegistry(restarted.get());
  client_->SetDown(false);
  EXPECT_TRUE(
      Eventually([&] { return RegistryHolds(*restarted, a) && RegistryHolds(*restarted, b); }));
  EXPECT_GT(client_->registrations(), joins);
  agent_->Stop();  // before `restarted` goes
}

TEST_F(RegistryAgentTest, RegistryEvictionsReachTheEngine) {
  const hash::Hash128 h = Serve(7);
  ASSERT_TRUE(Eventually([&] { return RegistryHolds(*registry_, h); }));
  ASSERT_TRUE(registry_->EvictChunk(h).ok());
  // The next heartbeat carries the eviction; the engine applies it at its next step.
  EXPECT_TRUE(Eventually([&] {
    (void)engine_->Step();
    for (const auto& e : engine_->HeldChunks()) {
      if (e.hash == h) return false;
    }
    return true;
  }));
}

TEST_F(RegistryAgentTest, RegistryPinsKeepAChunkThroughPressure) {
  const hash::Hash128 h = Serve(8);
  ASSERT_TRUE(Eventually([&] { return RegistryHolds(*registry_, h); }));
  ASSERT_TRUE(registry_->PinChunk(h, 60, std::nullopt).ok());
  // The pin arrives with a heartbeat and takes effect at the engine's next step: the chunk's
  // blocks are then referenced, no longer free.
  const int64_t free_before = engine_->Stats().free_blocks;
  EXPECT_TRUE(Eventually([&] {
    (void)engine_->Step();
    return engine_->Stats().free_blocks == free_before - 3;
  }));
}

// One 24-token prompt under 23 chunk boundaries: every second chunk is held through the same last
// block, past the engine's max_chunks_per_block (8). The chunks it drops for the cap are withdrawn
// from the registry too: in the end the registry says w1 holds exactly what the engine holds.
TEST_F(RegistryAgentTest, ChunksTheEngineDropsForItsPerBlockCapLeaveTheRegistry) {
  ASSERT_TRUE(Eventually([&] { return agent_->registered(); }));
  std::vector<int32_t> tokens(24);
  for (int32_t i = 0; i < 24; ++i) tokens[i] = i + 1;
  std::vector<hash::Hash128> served, tails;
  for (int split = 1; split < 24; ++split) {
    engine::Request r;
    r.chunks = {engine::ChunkInput{1, {tokens.begin(), tokens.begin() + split}, ""},
                engine::ChunkInput{2, {tokens.begin() + split, tokens.end()}, ""}};
    r.sampling.max_tokens = 1;
    const engine::testing::Result res = engine::testing::RunOne(*engine_, r);
    ASSERT_TRUE(res.status.ok()) << res.status;
    for (const engine::ChunkPlacement& c : res.chunks) served.push_back(c.hash);
    tails.push_back(res.chunks.at(1).hash);
    agent_->OnStep();
  }
  auto engine_holds = [&](const hash::Hash128& h) {
    for (const engine::ChunkEvent& c : engine_->HeldChunks()) {
      if (c.hash == h) return true;
    }
    return false;
  };
  EXPECT_TRUE(Eventually([&] {
    for (const hash::Hash128& h : served) {
      if (RegistryHolds(*registry_, h) != engine_holds(h)) return false;
    }
    return true;
  })) << "the registry and the engine disagree on what w1 holds";
  int tails_held = 0;
  for (const hash::Hash128& h : tails) tails_held += RegistryHolds(*registry_, h) ? 1 : 0;
  EXPECT_LE(tails_held, 8) << "chunks over one block piled up in the registry";
  EXPECT_GT(tails_held, 0);
}

// A registry that answers and refuses (here its --max_workers, already reached) is logged as a
// refusal naming why, not as an outage, and the worker stays unregistered.
TEST(RegistryAgentRefusalTest, ARefusedRegistrationIsLoggedAsRefusedWithTheReason) {
  registry::RegistryOptions ro;
  ro.max_workers = 1;
  Registry reg(ro);
  registry::WorkerInfo other;
  other.worker_id = "w0";
  other.address = "127.0.0.1:2";
  other.model = "trace";
  other.block_size = kBlock;
  other.max_context = 4096;
  other.vocab_size = 97;
  ASSERT_TRUE(reg.RegisterWorker(other).ok());
  Mutex mu;
  std::vector<std::string> lines;
  common::SetLogSink([&](std::string_view line) {
    MutexLock lock(&mu);
    lines.emplace_back(line);
  });
  auto engine = TraceEngine();
  auto agent =
      RegistryAgent::Start(TraceAgent(), engine.get(), registry::NewInProcessRegistryClient(&reg));
  const bool logged = Eventually([&] {
    MutexLock lock(&mu);
    for (const std::string& l : lines) {
      if (l.find("registry_refused") != std::string::npos) return true;
    }
    return false;
  });
  agent.reset();
  common::SetLogSink(nullptr);
  ASSERT_TRUE(logged);
  MutexLock lock(&mu);
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find("registry_unreachable"), std::string::npos) << l;
    if (l.find("registry_refused") == std::string::npos) continue;
    EXPECT_NE(l.find("RESOURCE_EXHAUSTED"), std::string::npos) << l;
    EXPECT_NE(l.find("--max_workers"), std::string::npos) << l;
  }
  for (const registry::WorkerRecord& w : reg.ListWorkers()) EXPECT_NE(w.info.worker_id, "w1");
}

TEST_F(RegistryAgentTest, DeregisterLeavesTheRegistry) {
  ASSERT_TRUE(Eventually([&] { return registry_->ListWorkers().size() == 1; }));
  agent_->Deregister();
  EXPECT_TRUE(registry_->ListWorkers().empty());
  agent_->Deregister();  // a second call is a no-op
}

}  // namespace
}  // namespace cascade::worker
