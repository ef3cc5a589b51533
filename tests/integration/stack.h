// An in-process Cascade stack for integration tests: registry, workers and gateway, each a real
// gRPC server on a loopback port, on the tiny random model. Servers can be stopped one by one
// (registry outage, worker death).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache_service/registry/registry.h"
#include "cache_service/server/registry_service.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "cascade/v2/worker.grpc.pb.h"
#include "common/server_runner.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/service/worker_server.h"
#include "services/gateway/gateway_server.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/test_certs.h"

namespace cascade::testing {

// Generates the tiny model once per test binary, in a directory removed when the binary exits
// (workers load it by path and the gateway reads its tokenizer, whenever a test starts them).
inline const std::string& TinyModelDir() {
  static const test_support::ScratchDir scratch("cascade-it");
  static const std::string dir = [] {
    std::string d = scratch.path() + "/tiny";
    auto cfg = model::PresetConfig("tiny");
    absl::Status s = model::WriteRandomModel(d, cfg, 7, model::DefaultTokenizerDir());
    if (!s.ok()) {
      ADD_FAILURE() << "cannot write the tiny model: " << s << " (run scripts/setup.sh)";
    }
    return d;
  }();
  return dir;
}

inline common::ServerOptions TestServerOptions(const std::string& name) {
  common::ServerOptions o;
  o.name = name;
  o.host = "127.0.0.1";
  o.port = 0;
  o.handle_signals = false;
  o.print_ready_line = false;
  o.drain_timeout = absl::Seconds(2);
  return o;
}

struct StackOptions {
  int workers = 2;
  int64_t kv_blocks = 512;
  int block_size = 16;
  int64_t host_kv_bytes = -1;  // the workers' --host_kv_bytes (-1: auto)
  int max_concurrent = 64;
  std::string auth_token;
  bool registry = true;
  bool metrics = false;                 // serve /metrics on worker 0 and the gateway (free ports)
  bool resume = true;                   // gateway --resume_mid_stream
  bool static_workers = true;           // also pass the workers as the gateway's --workers fallback
  gateway::AdmissionOptions admission;  // the gateway's (max_pending is max_concurrent)
  int http_port = -1;                   // the gateway's OpenAI HTTP front: 0 a free port
  // The gateway's --default_max_tokens (short, so tests that leave max_tokens unset stay quick);
  // 0 keeps the shipped default (worker::kDefaultMaxTokens).
  int32_t default_max_tokens = 16;
  // Internal RPCs run with mTLS and roles (common::testing::TestCerts) unless this is set.
  bool insecure_internal = false;
  // Last changes to worker i's and the gateway's configuration, when set.
  std::function<void(int, worker::WorkerConfig*)> tweak_worker;
  std::function<void(gateway::GatewayConfig*)> tweak_gateway;
};

// --internal_* for a component of the test stack, or --insecure_internal.
inline common::InternalAuthOptions StackAuth(bool insecure, common::Role role,
                                             std::string_view worker_id = "") {
  if (insecure) return {.insecure = true};
  return common::testing::TestCerts::Default().For(role, worker_id);
}

class Stack {
 public:
  explicit Stack(const StackOptions& o = {}) : options_(o) {
    if (o.registry) StartRegistry();
    for (int i = 0; i < o.workers; ++i) StartWorker(i);
    auto gw = gateway::GatewayServer::Start(GatewayConfig());
    EXPECT_TRUE(gw.ok()) << gw.status();
    gateway_ = std::move(*gw);
    auto ch = grpc::CreateChannel(gateway_->address(), grpc::InsecureChannelCredentials());
    stub_ = cascade::v2::GatewayService::NewStub(ch);
  }
  // The gateway's configuration for this stack (another replica may start with it too).
  gateway::GatewayConfig GatewayConfig() const {
    const StackOptions& o = options_;
    gateway::GatewayConfig g;
    g.server = TestServerOptions("cascade-gateway");
    g.model_dir = TinyModelDir();
    if (o.registry) g.registry_address = registry_address_;
    if (o.static_workers || !o.registry) {
      for (auto& w : workers_) g.workers += (g.workers.empty() ? "" : ",") + w->address();
    }
    g.gateway.max_concurrent = o.max_concurrent;
    g.gateway.admission = o.admission;
    g.http_port = o.http_port;
    g.gateway.auth_token = o.auth_token;
    g.gateway.resume_mid_stream = o.resume;
    if (o.default_max_tokens > 0) g.gateway.limits.default_max_tokens = o.default_max_tokens;
    g.internal_auth = StackAuth(o.insecure_internal, common::Role::kGateway);
    if (o.metrics) g.server.metrics_port = 0;
    if (o.tweak_gateway) o.tweak_gateway(&g);
    return g;
  }
  ~Stack() {
    gateway_.reset();
    workers_.clear();
    StopRegistry();
  }

  // `port` 0 picks a free one; a restart passes the old port so clients find it again.
  void StartRegistry(int port = 0) {
    registry::RegistryOptions ro;
    ro.lease_ms = 3000;
    registry_ = std::make_unique<registry::Registry>(ro);
    registry_service_ = std::make_unique<registry::RegistryService>(
        registry_.get(), nullptr, /*check_worker_identity=*/!options_.insecure_internal);
    common::ServerOptions so = TestServerOptions("cascade-registry");
    so.port = port;
    if (!options_.insecure_internal) {
      so.internal_auth = {StackAuth(false, common::Role::kRegistry),
                          registry::RegistryMethodPolicy()};
    }
    registry_runner_ = std::make_unique<common::ServerRunner>(so);
    registry_runner_->AddService(
        {registry_service_.get(), cascade::v2::ChunkRegistryService::service_full_name()});
    ASSERT_TRUE(registry_runner_->Start().ok());
    registry_address_ = registry_runner_->local_address();
    registry_port_ = registry_runner_->port();
  }
  void RestartRegistry() {
    StopRegistry();
    StartRegistry(registry_port_);
  }
  void StopRegistry() {
    if (registry_runner_) registry_runner_->Shutdown(absl::Milliseconds(100));
    registry_runner_.reset();
    registry_service_.reset();
    registry_.reset();
  }

  void StartWorker(int i) {
    worker::WorkerConfig w;
    w.server = TestServerOptions("cascade-worker");
    w.model_dir = TinyModelDir();
    w.backend = "cpu";
    w.kv_blocks = options_.kv_blocks;
    w.host_kv_bytes = options_.host_kv_bytes;
    w.block_size = options_.block_size;
    w.threads = 1;
    w.worker_id = "w" + std::to_string(i);
    if (options_.metrics && i == 0) w.server.metrics_port = 0;
    w.heartbeat_ms = 100;
    if (options_.registry) w.registry_address = registry_address_;
    w.internal_auth = StackAuth(options_.insecure_internal, common::Role::kWorker, w.worker_id);
    if (options_.tweak_worker) options_.tweak_worker(i, &w);
    auto s = worker::WorkerServer::Start(w);
    ASSERT_TRUE(s.ok()) << s.status();
    workers_.push_back(std::move(*s));
  }

  // Stops worker i the way SIGTERM does (drain: not serving, in-flight streams finish, up to
  // `drain`), from any thread. Its slot stays (worker(i) must not be used afterwards).
  void DrainWorker(int i, absl::Duration drain) { workers_[i]->Shutdown(drain); }

  cascade::v2::GatewayService::Stub& gateway() { return *stub_; }
  gateway::GatewayServer& gateway_server() { return *gateway_; }
  worker::WorkerServer& worker(int i) { return *workers_[i]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  registry::Registry* registry() { return registry_.get(); }
  const std::string& registry_address() const { return registry_address_; }

  // A channel to worker i as `role` would dial it (plaintext when insecure_internal).
  std::shared_ptr<grpc::Channel> WorkerChannel(int i, common::Role role = common::Role::kAdmin) {
    auto ch =
        common::MakeChannel(workers_[i]->address(),
                            common::InternalClientTls(StackAuth(options_.insecure_internal, role),
                                                      common::kWorkerServerName));
    EXPECT_TRUE(ch.ok()) << ch.status();
    return *ch;
  }
  // The worker's engine counters over its gRPC GetStats (as admin).
  cascade::v2::WorkerServiceGetStatsResponse WorkerStats(int i) {
    auto stub = cascade::v2::WorkerService::NewStub(WorkerChannel(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    cascade::v2::WorkerServiceGetStatsResponse st;
    cascade::v2::WorkerServiceGetStatsRequest req;
    EXPECT_TRUE(stub->GetStats(&ctx, req, &st).ok());
    return st;
  }
  // Waits until the registry sees every worker idle, so routing is decided by the prefix alone
  // (a busy holder is passed over on purpose: see router.h). The registry's load is what the
  // last heartbeat said, so zero there is not enough: a heartbeat sent while the previous request
  // ran can land after it, and the next Resolve would see that worker busy. So: every worker
  // idle by its own account first, then a heartbeat from each after that, reporting zero.
  bool WaitForIdleLoad(int ms = 5000);

  int WorkerIndex(const std::string& worker_id) {
    for (int i = 0; i < num_workers(); ++i) {
      if (workers_[i]->worker_id() == worker_id) return i;
    }
    return -1;
  }

 private:
  StackOptions options_;
  std::unique_ptr<registry::Registry> registry_;
  std::unique_ptr<registry::RegistryService> registry_service_;
  std::unique_ptr<common::ServerRunner> registry_runner_;
  std::string registry_address_;
  int registry_port_ = 0;
  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
  std::unique_ptr<gateway::GatewayServer> gateway_;
  std::unique_ptr<cascade::v2::GatewayService::Stub> stub_;
};

// A Worker stub that calls as the gateway (Worker/Generate is its RPC under internal auth).
inline std::unique_ptr<cascade::v2::WorkerService::Stub> WorkerStubAsGateway(
    const std::string& address) {
  auto channel =
      common::MakeChannel(address, common::testing::TestCerts::Default().Client(
                                       common::Role::kGateway, common::kWorkerServerName));
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? cascade::v2::WorkerService::NewStub(*channel) : nullptr;
}

// Polls `pred` every 20 ms for up to `ms`.
template <typename Pred>
bool WaitFor(Pred pred, int ms = 5000) {
  for (int waited = 0; waited < ms; waited += 20) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

inline bool Stack::WaitForIdleLoad(int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count()));
  };
  const bool idle = WaitFor(
      [&] {
        for (int i = 0; i < num_workers(); ++i) {
          if (workers_[i] == nullptr) continue;  // stopped by the test
          const auto st = WorkerStats(i);
          if (st.running() + st.waiting() != 0) return false;
        }
        return true;
      },
      left());
  if (!idle) return false;
  // A heartbeat renews the worker's lease: a later expiry is a heartbeat that arrived after now.
  std::map<std::string, int64_t> lease;
  for (const auto& w : registry_->ListWorkers()) lease[w.info.worker_id] = w.lease_expires_ms;
  return WaitFor(
      [&] {
        for (const auto& w : registry_->ListWorkers()) {
          if (w.lease_expires_ms <= lease[w.info.worker_id]) return false;
          if (w.load.running + w.load.waiting != 0) return false;
        }
        return true;
      },
      left());
}

// A finished Generate stream, gathered.
struct Reply {
  grpc::Status status;
  cascade::v2::GenerateStart start;
  std::vector<int32_t> tokens;
  std::vector<std::string> texts;  // each delta's text
  std::string text;
  std::vector<cascade::v2::LogprobEntry> logprobs;         // the generated tokens'
  std::vector<cascade::v2::LogprobEntry> prompt_logprobs;  // sampling.prompt_logprobs
  int prompt_logprob_deltas = 0;                           // deltas that carried some
  int most_prompt_logprobs_a_delta = 0;
  cascade::v2::GenerateFinish finish;
  bool has_finish = false;
};

// `on_start` (optional) runs when the start message arrives.
inline Reply Generate(cascade::v2::GatewayService::Stub& stub,
                      const cascade::v2::GenerateRequest& req, int timeout_ms = 60000,
                      const std::vector<std::pair<std::string, std::string>>& md = {},
                      const std::function<void()>& on_start = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  for (auto& [k, v] : md) ctx.AddMetadata(k, v);
  auto reader = stub.Generate(&ctx, req);
  Reply r;
  cascade::v2::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_start()) {
      r.start = m.start();
      if (on_start) on_start();
    }
    if (m.has_delta()) {
      r.tokens.insert(r.tokens.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
      r.texts.push_back(m.delta().text());
      r.text += m.delta().text();
      r.logprobs.insert(r.logprobs.end(), m.delta().logprobs().begin(), m.delta().logprobs().end());
      r.prompt_logprobs.insert(r.prompt_logprobs.end(), m.delta().prompt_logprobs().begin(),
                               m.delta().prompt_logprobs().end());
      if (m.delta().prompt_logprobs_size() > 0) {
        ++r.prompt_logprob_deltas;
        r.most_prompt_logprobs_a_delta =
            std::max(r.most_prompt_logprobs_a_delta, m.delta().prompt_logprobs_size());
      }
    }
    if (m.has_finish()) {
      r.finish = m.finish();
      r.has_finish = true;
    }
  }
  r.status = reader->Finish();
  return r;
}

inline cascade::v2::GenerateRequest Req(const std::string& system, const std::string& query,
                                        int max_tokens = 8) {
  cascade::v2::GenerateRequest r;
  if (!system.empty()) {
    auto* c = r.add_chunks();
    c->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
    c->set_text(system);
  }
  auto* q = r.add_chunks();
  q->set_kind(cascade::v2::CHUNK_KIND_QUERY);
  q->set_text(query);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

inline std::string LongSystemPrompt() {
  std::string s = "You are Cascade's test assistant. ";
  for (int i = 0; i < 12; ++i) {
    s += "Rule " + std::to_string(i) +
         ": answer briefly, cite the context, and never invent facts. ";
  }
  return s;
}

}  // namespace cascade::testing
