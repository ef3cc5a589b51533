// Registry agent; see registry_agent.h.
#include "gpu_worker/service/registry_agent.h"

#include <chrono>

#include "common/log.h"

namespace cascade::worker {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void WithDeadline(grpc::ClientContext* ctx, int64_t ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

void ToProto(const engine::ChunkEvent& e, cascade::v1::HeldChunk* c) {
  c->set_hash(e.hash.ToHex());
  c->set_start(e.start);
  c->set_end(e.end);
  c->set_held_tokens(e.held_tokens);
  if (!e.parent.IsZero()) c->set_parent_hash(e.parent.ToHex());
  c->set_kind(static_cast<cascade::v1::ChunkKind>(e.kind));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegistryAgent>> RegistryAgent::Start(const AgentOptions& options,
                                                                     engine::Engine* engine) {
  common::ClientChannelOptions co;
  co.tls = options.tls;
  auto channel = common::MakeChannel(options.registry_address, co);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<RegistryAgent> a(new RegistryAgent(options, engine, *channel));
  a->thread_ = std::thread([p = a.get()] { p->Run(); });
  return a;
}

RegistryAgent::RegistryAgent(const AgentOptions& options, engine::Engine* engine,
                             std::shared_ptr<grpc::Channel> channel)
    : options_(options), engine_(engine), stub_(cascade::v1::ChunkRegistry::NewStub(channel)) {}

RegistryAgent::~RegistryAgent() { Stop(); }

void RegistryAgent::OnStep() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

bool RegistryAgent::registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registered_;
}

void RegistryAgent::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RegistryAgent::Deregister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return;
    left_ = true;
  }
  Stop();
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 1000);
  cascade::v1::DeregisterWorkerRequest req;
  req.set_worker_id(options_.worker_id);
  cascade::v1::DeregisterWorkerResponse resp;
  grpc::Status s = stub_->DeregisterWorker(&ctx, req, &resp);
  common::LogInfo("registry_deregister", {{"worker_id", options_.worker_id}, {"ok", s.ok()}});
}

bool RegistryAgent::Register() {
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 2000);
  cascade::v1::RegisterWorkerRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_address(options_.address);
  req.set_model(options_.model);
  req.set_kv_capacity_blocks(engine_->Stats().total_blocks);
  req.set_block_size(options_.block_size);
  req.set_max_context(options_.max_context);
  req.set_vocab_size(options_.vocab_size);
  cascade::v1::RegisterWorkerResponse resp;
  grpc::Status s = stub_->RegisterWorker(&ctx, req, &resp);
  if (!s.ok()) {
    // Log the first failure and then every 30th, so a registry outage does not flood the log.
    if (failures_++ % 30 == 0) {
      common::LogWarn("registry_unreachable", {{"address", options_.registry_address},
                                              {"error", s.error_message()},
                                              {"hint", "the worker keeps serving; retrying"}});
    }
    return false;
  }
  failures_ = 0;
  epoch_ = resp.registry_epoch();
  needs_resync_ = true;
  common::LogInfo("registry_registered", {{"worker_id", options_.worker_id}, {"epoch", epoch_}});
  std::lock_guard<std::mutex> lock(mu_);
  registered_ = true;
  return true;
}

bool RegistryAgent::Resync() {
  engine_->TakeChunkEvents();  // the snapshot below covers them
  cascade::v1::ResyncRequest req;
  req.set_worker_id(options_.worker_id);
  for (const engine::ChunkEvent& e : engine_->HeldChunks()) ToProto(e, req.add_chunks());
  req.set_seq(next_seq_ - 1);
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 5000);
  cascade::v1::ResyncResponse resp;
  grpc::Status s = stub_->Resync(&ctx, req, &resp);
  if (!s.ok()) return false;
  needs_resync_ = false;
  return true;
}

void RegistryAgent::Heartbeat() {
  engine::EngineStats st = engine_->Stats();
  sent_running_ = st.running;
  sent_waiting_ = st.waiting;
  cascade::v1::HeartbeatRequest req;
  req.set_worker_id(options_.worker_id);
  auto* load = req.mutable_load();
  load->set_running(st.running);
  load->set_waiting(st.waiting);
  load->set_free_kv_blocks(st.free_blocks);
  load->set_total_kv_blocks(st.total_blocks);
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 2000);
  cascade::v1::HeartbeatResponse resp;
  grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  if (!s.ok() || resp.registry_epoch() != epoch_) {
    // NOT_FOUND (lease expired) or a restarted registry: join again and resync.
    std::lock_guard<std::mutex> lock(mu_);
    registered_ = false;
    return;
  }
  std::vector<hash::Hash128> evict;
  for (const std::string& h : resp.evict_hashes()) {
    if (auto x = hash::Hash128::FromHex(h)) evict.push_back(*x);
  }
  if (!evict.empty()) engine_->EvictChunks(evict);
  // Pinned chunks are renewed every heartbeat for a few intervals: they stay cached while the
  // registry lists them and lapse soon after it stops (unpin, pin expiry, or registry gone).
  std::vector<hash::Hash128> pinned;
  for (const std::string& h : resp.pinned_hashes()) {
    if (auto x = hash::Hash128::FromHex(h)) pinned.push_back(*x);
  }
  if (!pinned.empty()) engine_->PinChunks(pinned, 3 * options_.heartbeat_ms + 1000);
}

void RegistryAgent::Report() {
  std::vector<engine::ChunkEvent> events = engine_->TakeChunkEvents();
  if (events.empty()) return;
  cascade::v1::ReportEventsRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_seq(next_seq_);
  for (const engine::ChunkEvent& e : events) {
    auto* ev = req.add_events();
    ev->set_type(e.stored ? cascade::v1::ChunkEvent::TYPE_STORED
                          : cascade::v1::ChunkEvent::TYPE_EVICTED);
    ToProto(e, ev->mutable_chunk());
  }
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 2000);
  cascade::v1::ReportEventsResponse resp;
  grpc::Status s = stub_->ReportEvents(&ctx, req, &resp);
  ++next_seq_;
  // A failed call may or may not have applied: a resync settles it either way.
  if (!s.ok() || resp.resync_required()) needs_resync_ = true;
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    std::lock_guard<std::mutex> lock(mu_);
    registered_ = false;
  }
}

void RegistryAgent::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                   [&] { return stop_ || wake_; });
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
