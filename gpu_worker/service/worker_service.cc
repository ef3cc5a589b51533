// Worker service: one write reactor per Generate stream. Engine outputs arrive on the engine
// thread and are queued; the reactor writes one message at a time and merges queued token
// messages while a write is in flight (common/write_queue.h, shared with the gateway), so a slow
// reader costs fewer, larger messages rather than an unbounded queue of small ones. Cancellation
// (client cancel, deadline, disconnect) cancels the sequence, which frees its KV blocks within one
// engine step.
#include "gpu_worker/service/worker_service.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/chunk_hash.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/write_queue.h"
#include "gpu_worker/engine/sampling_wire.h"
#include "gpu_worker/service/worker_metrics.h"

namespace cascade::worker {
namespace {

using common::ToGrpc;

using cascade::v2::WorkerServiceGenerateResponse;

void ToProto(const engine::LogprobEntry& e, cascade::v2::LogprobEntry* p) {
  p->mutable_sampled()->set_token_id(e.sampled.token_id);
  p->mutable_sampled()->set_logprob(e.sampled.logprob);
  for (const auto& t : e.top) {
    auto* x = p->add_top();
    x->set_token_id(t.token_id);
    x->set_logprob(t.logprob);
  }
  p->set_rank(e.rank);
}

// engine::FinishReason mirrors cascade.v2.FinishReason value for value, so the cast is exact.
constexpr bool SameValue(engine::FinishReason e, cascade::v2::FinishReason p) {
  return static_cast<int>(e) == static_cast<int>(p);
}
static_assert(SameValue(engine::FinishReason::kNone, cascade::v2::FINISH_REASON_UNSPECIFIED));
static_assert(SameValue(engine::FinishReason::kStop, cascade::v2::FINISH_REASON_STOP));
static_assert(SameValue(engine::FinishReason::kLength, cascade::v2::FINISH_REASON_LENGTH));
static_assert(SameValue(engine::FinishReason::kStopString, cascade::v2::FINISH_REASON_STOP_STRING));
static_assert(SameValue(engine::FinishReason::kCancelled, cascade::v2::FINISH_REASON_CANCELLED));
static_assert(SameValue(engine::FinishReason::kError, cascade::v2::FINISH_REASON_ERROR));

cascade::v2::FinishReason ToProto(engine::FinishReason r) {
  return static_cast<cascade::v2::FinishReason>(static_cast<int>(r));
}

// The status a sequence's stream ends with: the engine's own for a sequence it ended early
// (kError, or kCancelled by a shutdown), OK for one that finished (its Finish message says how).
absl::Status FinalStatus(const engine::SequenceOutput& o) {
  if (o.finish_reason == engine::FinishReason::kError && o.status.ok()) {
    return absl::InternalError("the engine ended the sequence with an error");
  }
  return o.status;
}

// Token messages queued behind a write in flight become one.
bool MergeTokens(WorkerServiceGenerateResponse& into, const WorkerServiceGenerateResponse& from) {
  if (!into.has_tokens() || !from.has_tokens()) return false;
  into.mutable_tokens()->mutable_token_ids()->MergeFrom(from.tokens().token_ids());
  into.mutable_tokens()->mutable_logprobs()->MergeFrom(from.tokens().logprobs());
  into.mutable_tokens()->mutable_prompt_logprobs()->MergeFrom(from.tokens().prompt_logprobs());
  return true;
}

class GenerateReactor : public grpc::ServerWriteReactor<WorkerServiceGenerateResponse> {
 public:
  // gate: the stream was counted in there (Leave() when its RPC is done); nullptr: not counted.
  GenerateReactor(std::string worker_id, engine::EngineLoop* loop, common::StreamGate* gate)
      : worker_id_(std::move(worker_id)), loop_(loop), gate_(gate) {}

  // Starts the sequence; on error finishes the RPC with that status.
  void Begin(absl::StatusOr<engine::Request> req) {
    if (!req.ok()) {
      Finish(ToGrpc(req.status()));
      return;
    }
    MutexLock lock(&mu_);
    // The sink keeps the reactor alive (see OnDone) until the final output is queued.
    auto id =
        loop_->Submit(std::move(*req), [this](const engine::SequenceOutput& o) { OnOutput(o); });
    if (!id.ok()) {
      finished_ = true;
      pending_status_ = ToGrpc(id.status());
      MaybeWriteLocked();
      return;
    }
    seq_id_ = *id;
    submitted_ = true;
    if (cancelled_) loop_->Cancel(seq_id_);  // cancelled while a peer fetch ran
  }

  // Pulls the plan's blocks from the peer first; the sequence starts when the fetch ends, with
  // the verified blocks, or without them (prefilling them) whatever went wrong.
  void BeginWithFetch(engine::Request req, FetchPlan plan, WorkerService* service,
                      std::chrono::system_clock::time_point deadline) {
    {
      MutexLock lock(&mu_);
      pending_ = std::move(req);
      fetching_ = true;
    }
    // Not under mu_: the callback may run inline.
    std::shared_ptr<PeerFetchCall> call = service->fetcher()->Fetch(
        std::move(plan), deadline,
        [this, service](FetchOutcome o) { OnFetched(service, std::move(o)); });
    bool cancel;
    {
      MutexLock lock(&mu_);
      fetch_ = call;
      cancel = cancelled_;
    }
    if (cancel) call->Cancel();
  }

  void OnCancel() override {
    uint64_t id = 0;
    std::shared_ptr<PeerFetchCall> fetch;
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      if (fetching_) fetch = fetch_;
      if (submitted_ && !finished_) id = seq_id_;
    }
    if (fetch) fetch->Cancel();  // OnFetched then finishes the RPC
    if (id != 0) loop_->Cancel(id);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    // A failed write: the client is gone; the sequence is cancelled through OnCancel. Finish
    // once the engine has sent its final output.
    writes_.Done(ok);
    MaybeWriteLocked();
  }

  void OnDone() override {
    if (gate_ != nullptr) gate_->Leave();
    bool release;
    {
      MutexLock lock(&mu_);
      done_ = true;
      release = (!submitted_ || finished_) && !fetching_;
    }
    // The engine may still hold the sink, or a fetch its callback; the last of OnDone, the
    // final output and the fetch's end deletes.
    if (release) delete this;
  }

 private:
  void OnFetched(WorkerService* service, FetchOutcome o) {
    engine::Request req;
    bool gone;  // OnDone ran (Finish cannot precede this; be safe): this is the last owner
    {
      MutexLock lock(&mu_);
      fetching_ = false;
      fetch_.reset();
      if (cancelled_ && !done_) {
        o.result = FetchResult::kCancelled;  // neither used nor a fallback
        service->CountFetch(o);
        MaybeWriteLocked();  // finishes CANCELLED: nothing was submitted
        return;
      }
      gone = done_;
      if (!gone) req = std::move(pending_);
    }
    if (gone) {
      delete this;
      return;
    }
    service->CountFetch(o);
    if (o.result == FetchResult::kOk) req.peer_blocks = std::move(o.blocks);
    Begin(std::move(req));
  }

  void OnOutput(const engine::SequenceOutput& o) {
    bool del = false;
    {
      MutexLock lock(&mu_);
      if (o.started) {
        WorkerServiceGenerateResponse m;
        auto* s = m.mutable_start();
        s->set_worker_id(worker_id_);
        s->set_prompt_tokens(o.prompt_tokens);
        s->set_cached_tokens(o.cached_tokens);
        for (const auto& c : o.chunks) {
          auto* ci = s->add_chunks();
          ci->set_hash(c.hash.ToHex());
          ci->set_start(c.start);
          ci->set_end(c.end);
          ci->set_cached_tokens(c.cached_tokens);
          ci->set_kind(static_cast<cascade::v2::ChunkKind>(c.kind));
        }
        writes_.Push(std::move(m));
      }
      if (!o.new_tokens.empty() || !o.prompt_logprobs.empty()) {
        WorkerServiceGenerateResponse m;
        auto* t = m.mutable_tokens();
        for (const auto& lp : o.prompt_logprobs) ToProto(lp, t->add_prompt_logprobs());
        for (int32_t id : o.new_tokens) t->add_token_ids(id);
        for (const auto& lp : o.logprobs) ToProto(lp, t->add_logprobs());
        writes_.Push(std::move(m));  // merges into a queued one when the reader is behind
      }
      if (o.finished) {
        finished_ = true;
        if (absl::Status st = FinalStatus(o); !st.ok()) {
          pending_status_ = ToGrpc(st);
        } else {
          WorkerServiceGenerateResponse m;
          auto* f = m.mutable_finish();
          f->set_finish_reason(ToProto(o.finish_reason));
          f->set_stop_token_id(o.stop_token_id);
          f->mutable_usage()->set_prompt_tokens(o.prompt_tokens);
          f->mutable_usage()->set_cached_tokens(o.cached_tokens);
          f->mutable_usage()->set_completion_tokens(o.completion_tokens);
          writes_.Push(std::move(m));
        }
        del = done_;
      }
      if (!del) MaybeWriteLocked();
    }
    if (del) delete this;
  }

  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writes_.writing() || done_ || finish_called_) return;
    if (!cancelled_ && writes_.Next(&current_)) {
      StartWrite(&current_);
      return;
    }
    if (finished_ || (cancelled_ && !submitted_)) {
      finish_called_ = true;
      Finish(cancelled_ ? grpc::Status::CANCELLED : pending_status_);
    }
  }

  // Set at construction.
  const std::string worker_id_;
  engine::EngineLoop* const loop_;
  common::StreamGate* const gate_;

  Mutex mu_;
  common::CoalescingWriteQueue<WorkerServiceGenerateResponse, MergeTokens> writes_
      ABSL_GUARDED_BY(mu_);
  WorkerServiceGenerateResponse current_ ABSL_GUARDED_BY(mu_);  // the message being written
  grpc::Status pending_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  uint64_t seq_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;       // the engine sent its final output
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;  // Finish() called on the RPC
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  // A peer fetch before the sequence starts (BeginWithFetch).
  engine::Request pending_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PeerFetchCall> fetch_ ABSL_GUARDED_BY(mu_);
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

common::MethodPolicy WorkerMethodPolicy() {
  using common::Role;
  const std::string prefix =
      std::string("/") + cascade::v2::WorkerService::service_full_name() + "/";
  return {{prefix + "Generate", {Role::kGateway}},
          {prefix + "GetStats", {Role::kAdmin}},
          {prefix + "EvictChunks", {Role::kAdmin}},
          {prefix + "FetchKv", {Role::kWorker}}};
}

WorkerService::WorkerService(std::string worker_id, engine::EngineLoop* loop, PeerFetchOptions peer,
                             WorkerMetrics* metrics)
    : worker_id_(std::move(worker_id)),
      loop_(loop),
      fetcher_(peer.enabled ? std::make_unique<PeerFetcher>(std::move(peer)) : nullptr),
      metrics_(metrics) {}

std::optional<FetchPlan> WorkerService::PlanFetch(
    const cascade::v2::WorkerServiceGenerateRequest& r, const engine::Request& req) const {
  if (fetcher_ == nullptr || !r.has_peer() || r.peer().address().empty() ||
      r.peer().worker_id() == worker_id_ || r.peer().tokens() <= 0) {
    return std::nullopt;
  }
  engine::Engine& engine = loop_->engine();
  engine::Backend& backend = engine.backend();
  const int64_t block_bytes = backend.KvBlockBytes();
  const engine::EngineStats stats = engine.Stats();
  if (block_bytes <= 0 || stats.host_total_blocks <= 0) return std::nullopt;  // lands on host
  const int bs = backend.BlockSize();
  int64_t prompt_len = 0;
  for (const engine::ChunkInput& c : req.chunks)
    prompt_len += static_cast<int64_t>(c.tokens.size());
  // The engine computes at least the prompt's last token, and shares whole blocks only.
  const int64_t first = engine.HeldPrefixTokens(req.placed) / bs;
  int64_t last = std::min<int64_t>(r.peer().tokens(), prompt_len - 1) / bs;
  const int64_t cap =
      std::min<int64_t>(fetcher_->options().max_bytes / block_bytes,
                        std::min<int64_t>(stats.host_total_blocks, kMaxFetchBlocks));
  last = std::min(last, first + cap);
  if (last <= first) return std::nullopt;
  const std::vector<hash::ChunkSpec> specs = hash::SpecsOf(req.chunks);
  const std::vector<hash::Hash128> keys =
      hash::BlockKeys(engine.options().model_name, req.placed, specs, bs);
  if (static_cast<int64_t>(keys.size()) < last) return std::nullopt;
  FetchPlan plan;
  plan.address = r.peer().address();
  plan.model = engine.options().model_name;
  plan.backend = backend.KvNumerics();
  plan.block_bytes = block_bytes;
  plan.block_size = bs;
  plan.keys.assign(keys.begin() + first, keys.begin() + last);
  plan.first_parent = first == 0 ? hash::Hash128{} : keys[first - 1];
  return plan;
}

void WorkerService::CountFetch(const FetchOutcome& o) {
  if (metrics_ != nullptr) metrics_->CountFetch(o.result, o.bytes);
  if (o.result == FetchResult::kCancelled) return;
  (o.result == FetchResult::kOk ? fetches_ok_ : fetch_fallbacks_).fetch_add(1);
  if (o.result != FetchResult::kOk) {
    common::LogInfo("peer_fetch_fallback",
                    {{"result", std::string(FetchResultName(o.result))}, {"detail", o.detail}});
  }
}

absl::StatusOr<engine::Request> WorkerService::ToEngineRequest(
    const cascade::v2::WorkerServiceGenerateRequest& r) const {
  engine::Request req;
  // The gateway's ids are a client's id (at most kMaxIdBytes) plus a chat turn suffix.
  if (absl::Status s = common::CheckIdField("request_id", r.request_id(), 2 * common::kMaxIdBytes);
      !s.ok()) {
    return s;
  }
  req.request_id = r.request_id();
  req.cache_salt = r.cache_salt();
  if (r.chunks_size() == 0)
    return absl::InvalidArgumentError("chunks: at least one chunk is required");
  for (int i = 0; i < r.chunks_size(); ++i) {
    const auto& c = r.chunks(i);
    if (c.kind() == cascade::v2::CHUNK_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "].kind must be set"));
    }
    req.chunks.push_back(engine::ChunkInput{static_cast<int32_t>(c.kind()),
                                            {c.token_ids().begin(), c.token_ids().end()},
                                            c.cache_salt()});
  }
  const std::string& model = loop_->engine().options().model_name;
  if (!r.model().empty() && r.model() != model) {
    return absl::InvalidArgumentError(absl::StrCat("model: this worker serves '", model, "', not '",
                                                   common::Excerpt(r.model()), "'"));
  }
  // The one hashing pass of the prompt's chain on this worker: it checks the registry's hashes
  // the gateway sent (a disagreement on model, salt, tokens or the hash definition would
  // otherwise route and cache under keys that mean something else), and the engine keeps it.
  req.placed = hash::PlaceChunks(model, r.cache_salt(), hash::SpecsOf(req.chunks));
  for (int i = 0; i < r.chunks_size(); ++i) {
    const std::string& given = r.chunks(i).hash();
    if (given.empty()) continue;  // the gateway had no registry answer (or a direct caller)
    const std::optional<hash::Hash128> h = hash::Hash128::FromHex(given);
    if (!h) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks[", i, "].hash '", common::Excerpt(given), "' is not 32 hex characters"));
    }
    if (*h != req.placed[i].hash) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks[", i, "].hash ", h->ToHex(), " does not match the worker's hash ",
          req.placed[i].hash.ToHex(), " (gateway and worker disagree on model, salt or tokens)"));
    }
  }
  req.sampling = SamplingFromProto(r.sampling());  // the engine validates it
  // Bounded so that the milliseconds, and the engine's clock plus them, cannot overflow.
  constexpr int64_t kMaxRetentionS = 365 * 24 * 3600;
  if (r.pin_ttl_seconds() < 0 || r.pin_ttl_seconds() > kMaxRetentionS) {
    return absl::InvalidArgumentError(absl::StrCat("pin_ttl_seconds must be in [0, ",
                                                   kMaxRetentionS, "], got ", r.pin_ttl_seconds()));
  }
  req.pin_ttl_ms = r.pin_ttl_seconds() * 1000;
  if (r.retention_seconds() < 0 || r.retention_seconds() > kMaxRetentionS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention_seconds must be in [0, ", kMaxRetentionS, "], got ", r.retention_seconds()));
  }
  req.priority = r.priority();
  req.retention_ms = r.retention_seconds() * 1000;
  req.resumed_tokens = r.resumed_tokens();  // the engine checks it against the prompt
  return req;
}

grpc::ServerWriteReactor<cascade::v2::WorkerServiceGenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context,
    const cascade::v2::WorkerServiceGenerateRequest* request) {
  if (!gate_.Enter()) {
    auto* refused = new GenerateReactor(worker_id_, loop_, nullptr);
    refused->Begin(absl::UnavailableError(absl::StrCat(
        "worker ", worker_id_, " is draining (shutting down); retry on another worker")));
    return refused;
  }
  auto* reactor = new GenerateReactor(worker_id_, loop_, &gate_);
  absl::StatusOr<engine::Request> req = ToEngineRequest(*request);
  std::optional<FetchPlan> plan;
  if (req.ok()) plan = PlanFetch(*request, *req);
  if (plan) {
    reactor->BeginWithFetch(*std::move(req), *std::move(plan), this, context->deadline());
  } else {
    reactor->Begin(std::move(req));
  }
  return reactor;
}

void WorkerService::DrainStreams(absl::Time deadline, absl::Duration linger) {
  gate_.Drain(deadline, linger, absl::StrCat("cascade-worker ", worker_id_));
}

grpc::ServerUnaryReactor* WorkerService::GetStats(grpc::CallbackServerContext* context,
                                                  const cascade::v2::WorkerServiceGetStatsRequest*,
                                                  cascade::v2::WorkerServiceGetStatsResponse* r) {
  engine::EngineStats s = loop_->engine().Stats();
  r->set_worker_id(worker_id_);
  r->set_running(s.running);
  r->set_waiting(s.waiting);
  r->set_total_kv_blocks(s.total_blocks);
  r->set_free_kv_blocks(s.free_blocks);
  r->set_used_kv_blocks(s.used_blocks);
  r->set_cached_kv_blocks(s.cached_blocks);
  r->set_prefix_cache_queries(s.prefix_cache_queries);
  r->set_prefix_cache_hits(s.prefix_cache_hits);
  r->set_preemptions(s.preemptions);
  r->set_prompt_tokens_computed(s.prompt_tokens_computed);
  r->set_generation_tokens(s.generation_tokens);
  r->set_backend(loop_->engine().backend().Name());
  r->set_block_size(loop_->engine().backend().BlockSize());
  r->set_prefix_cache_hits_host(s.prefix_cache_hits_host);
  r->set_host_total_kv_blocks(s.host_total_blocks);
  r->set_host_used_kv_blocks(s.host_used_blocks);
  r->set_host_offloaded_blocks(s.host_offloaded_blocks);
  r->set_host_offloaded_ahead_blocks(s.host_offloaded_ahead_blocks);
  r->set_host_offload_waits(s.host_offload_waits);
  r->set_host_offload_skipped_blocks(s.host_offload_skipped_blocks);
  r->set_host_restored_blocks(s.host_restored_blocks);
  r->set_host_evicted_blocks(s.host_evicted_blocks);
  r->set_peer_fetches(fetches_ok_.load());
  r->set_peer_fetch_fallbacks(fetch_fallbacks_.load());
  r->set_peer_fetched_blocks(s.peer_imported_blocks);
  r->set_peer_served_blocks(s.peer_exported_blocks);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::EvictChunks(grpc::CallbackServerContext* context,
                                                     const cascade::v2::EvictChunksRequest* request,
                                                     cascade::v2::EvictChunksResponse* response) {
  auto* reactor = context->DefaultReactor();
  std::vector<hash::Hash128> hashes;
  for (int i = 0; i < request->hashes_size(); ++i) {
    auto h = hash::Hash128::FromHex(request->hashes(i));
    if (!h) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   absl::StrCat("hashes[", i, "] is not 32 hex characters")));
      return reactor;
    }
    hashes.push_back(*h);
  }
  response->set_chunks(loop_->engine().EvictChunks(hashes));
  loop_->Wake();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace cascade::worker

namespace cascade::worker {

grpc::ServerWriteReactor<cascade::v2::FetchKvResponse>* WorkerService::FetchKv(
    grpc::CallbackServerContext* context, const cascade::v2::FetchKvRequest* request) {
  FetchFaults faults;
  {
    MutexLock lock(&faults_mu_);
    faults = faults_;
  }
  return StartFetchKv(loop_, *request, faults);
}

}  // namespace cascade::worker
