// Registry agent; see registry_agent.h.
#include "gpu_worker/service/registry_agent.h"

#include <chrono>
#include <vector>

#include "cache_service/client/grpc_registry_client.h"
#include "common/log.h"

namespace cascade::worker {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

registry::HeldChunk ToHeld(const engine::ChunkEvent& e) {
  registry::HeldChunk c;
  c.hash = e.hash;
  c.start = e.start;
  c.end = e.end;
  c.held_tokens = e.held_tokens;
  c.parent_hash = e.parent;
  c.kind = e.kind;
  c.tier = e.tier == engine::KvTier::kHost ? registry::KvTier::kHost : registry::KvTier::kGpu;
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegistryAgent>> RegistryAgent::Start(const AgentOptions& options,
                                                                    engine::Engine* engine) {
  common::ClientChannelOptions co;
  co.tls = options.tls;
  auto channel = common::MakeChannel(options.registry_address, co);
  if (!channel.ok()) return channel.status();
  registry::GrpcRegistryClientOptions ro;
  ro.timeout_ms = 2000;
  ro.resync_timeout_ms = 5000;  // a resync carries everything the worker holds
  return Start(options, engine, registry::NewGrpcRegistryClient(*channel, ro));
}

std::unique_ptr<RegistryAgent> RegistryAgent::Start(
    const AgentOptions& options, engine::Engine* engine,
    std::unique_ptr<registry::RegistryClient> client) {
  std::unique_ptr<RegistryAgent> a(new RegistryAgent(options, engine, std::move(client)));
  a->thread_ = std::thread([p = a.get()] { p->Run(); });
  return a;
}

RegistryAgent::RegistryAgent(const AgentOptions& options, engine::Engine* engine,
                             std::unique_ptr<registry::RegistryClient> client)
    : options_(options), engine_(engine), client_(std::move(client)) {}

RegistryAgent::~RegistryAgent() { Stop(); }

void RegistryAgent::OnStep() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.SignalAll();
}

bool RegistryAgent::registered() const {
  MutexLock lock(&mu_);
  return registered_;
}

void RegistryAgent::SetRegistered(bool registered) {
  MutexLock lock(&mu_);
  registered_ = registered;
}

void RegistryAgent::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void RegistryAgent::Deregister() {
  {
    MutexLock lock(&mu_);
    if (left_) return;
    left_ = true;
  }
  Stop();
  absl::Status s = client_->Deregister(options_.worker_id);
  common::LogInfo("registry_deregister", {{"worker_id", options_.worker_id}, {"ok", s.ok()}});
}

bool RegistryAgent::Register() {
  registry::WorkerInfo info;
  info.worker_id = options_.worker_id;
  info.address = options_.address;
  info.model = options_.model;
  info.kv_capacity_blocks = engine_->Stats().total_blocks;
  info.block_size = options_.block_size;
  info.max_context = options_.max_context;
  info.vocab_size = options_.vocab_size;
  info.kv_numerics = engine_->backend().KvNumerics();  // fixed once the backend is built
  absl::StatusOr<registry::RegisterResult> r = client_->RegisterWorker(info);
  if (!r.ok()) {
    // Log the first failure and then every 30th, so a registry outage does not flood the log.
    // A registry that answered and refused (a bad field, its --max_workers) is not an outage:
    // retrying alone will not fix it, so the line says so.
    const bool unreachable =
        absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status());
    if (failures_++ % 30 == 0) {
      common::LogWarn(
          unreachable ? "registry_unreachable" : "registry_refused",
          {{"address", options_.registry_address},
           {"code", absl::StatusCodeToString(r.status().code())},
           {"error", std::string(r.status().message())},
           {"hint", unreachable ? "the worker keeps serving; retrying"
                                : "the registry refused this worker: fix what the error names "
                                  "(this worker's flags or the registry's limits); the worker "
                                  "keeps serving without routing by cache and retries"}});
    }
    return false;
  }
  failures_ = 0;
  epoch_ = r->registry_epoch;
  needs_resync_ = true;
  common::LogInfo("registry_registered", {{"worker_id", options_.worker_id}, {"epoch", epoch_}});
  SetRegistered(true);
  return true;
}

bool RegistryAgent::Resync() {
  engine_->TakeChunkEvents();  // the snapshot below covers them
  std::vector<registry::HeldChunk> held;
  for (const engine::ChunkEvent& e : engine_->HeldChunks()) held.push_back(ToHeld(e));
  if (!client_->Resync(options_.worker_id, held, next_seq_ - 1).ok()) return false;
  needs_resync_ = false;
  return true;
}

void RegistryAgent::Heartbeat() {
  engine::EngineStats st = engine_->Stats();
  sent_running_ = st.running;
  sent_waiting_ = st.waiting;
  registry::WorkerLoad load;
  load.running = st.running;
  load.waiting = st.waiting;
  load.free_kv_blocks = st.free_blocks;
  load.total_kv_blocks = st.total_blocks;
  absl::StatusOr<registry::HeartbeatResult> r = client_->Heartbeat(options_.worker_id, load);
  if (!r.ok() || r->registry_epoch != epoch_) {
    // NOT_FOUND (lease expired) or a restarted registry: join again and resync.
    SetRegistered(false);
    return;
  }
  if (!r->evict_hashes.empty()) engine_->EvictChunks(r->evict_hashes);
  // Pinned chunks are renewed every heartbeat for a few intervals: they stay cached while the
  // registry lists them and lapse soon after it stops (unpin, pin expiry, or registry gone).
  if (!r->pinned_hashes.empty()) {
    engine_->PinChunks(r->pinned_hashes, 3 * options_.heartbeat_ms + 1000);
  }
}

void RegistryAgent::Report() {
  std::vector<engine::ChunkEvent> events = engine_->TakeChunkEvents();
  if (events.empty()) return;
  std::vector<registry::ChunkEvent> batch;
  batch.reserve(events.size());
  for (const engine::ChunkEvent& e : events) {
    batch.push_back(
        {e.stored ? registry::ChunkEvent::Type::kStored : registry::ChunkEvent::Type::kEvicted,
         ToHeld(e)});
  }
  absl::StatusOr<registry::ReportResult> r =
      client_->ReportEvents(options_.worker_id, next_seq_, batch);
  ++next_seq_;
  // A failed call may or may not have applied: a resync settles it either way.
  if (!r.ok() || r->resync_required) needs_resync_ = true;
  if (r.status().code() == absl::StatusCode::kNotFound) SetRegistered(false);
}

void RegistryAgent::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      cv_.WaitFor(&mu_, std::chrono::milliseconds(options_.heartbeat_ms),
                  [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; });
      if (stop_) return;
      wake_ = false;
    }
    if (!registered()) {
      engine_->TakeChunkEvents();  // a resync after registering covers them
      if (!Register()) continue;
      last_heartbeat_ms_ = NowMs();
    }
    if (needs_resync_ && !Resync()) continue;
    Report();
    // Heartbeat on the interval, and also soon after the load changes: routing weighs running
    // and waiting sequences, and a count one interval stale sends requests away from the worker
    // that holds their prefix.
    const engine::EngineStats st = engine_->Stats();
    const bool load_changed = st.running != sent_running_ || st.waiting != sent_waiting_;
    const int64_t since = NowMs() - last_heartbeat_ms_;
    if (since >= options_.heartbeat_ms || (load_changed && since >= kMinHeartbeatGapMs)) {
      last_heartbeat_ms_ = NowMs();
      Heartbeat();
    }
  }
}

}  // namespace cascade::worker
