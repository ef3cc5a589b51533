// Streaming reactors of the gateway: Generate (server stream), Chat (bidi, one turn at a time)
// and RegisterChunk (unary over a one-token turn). Each is the TurnSink of its turn(s): events
// are queued and written one at a time; queued deltas merge while a write is in flight, so a
// slow client gets fewer, larger messages and a fast one gets every token at once.
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/raw_request.h"
#include "services/gateway/turn.h"

namespace cascade::gateway {
namespace {

using cascade::v1::GenerateResponse;

void MergeDelta(cascade::v1::TokenDelta* into, const cascade::v1::TokenDelta& from) {
  into->mutable_token_ids()->MergeFrom(from.token_ids());
  into->mutable_text()->append(from.text());
  into->mutable_logprobs()->MergeFrom(from.logprobs());
}

GenerateResponse& EventOf(GenerateResponse& r) { return r; }
GenerateResponse& EventOf(cascade::v1::ChatResponse& r) { return *r.mutable_event(); }

// The write side both streaming reactors share: items queue while a write is in flight and go
// out one at a time, and a delta queued behind another merges into it. Not thread-safe: the
// owning reactor holds its mutex around every call.
template <typename Item>
class WriteQueue {
 public:
  void Push(Item item) {
    if (EventOf(item).has_delta() && !queue_.empty() && EventOf(queue_.back()).has_delta()) {
      MergeDelta(EventOf(queue_.back()).mutable_delta(), EventOf(item).delta());
      return;
    }
    queue_.push_back(std::move(item));
  }
  // The next item serialized into `buf`, marking a write in flight; false when a write is in
  // flight already, nothing is queued, or the client is gone.
  bool Next(grpc::ByteBuffer* buf) {
    if (writing_ || queue_.empty() || broken_) return false;
    SerializeToByteBuffer(queue_.front(), buf);  // the last write is done with `buf`
    queue_.pop_front();
    writing_ = true;
    return true;
  }
  // A write completed; a failed one means the client is gone: the rest is dropped. Returns
  // true on failure (the caller cancels its turn).
  bool Done(bool ok) {
    writing_ = false;
    if (ok) return false;
    broken_ = true;
    queue_.clear();
    return true;
  }
  bool writing() const { return writing_; }

 private:
  std::deque<Item> queue_;
  bool writing_ = false;
  bool broken_ = false;
};

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public TurnSink {
 public:
  GenerateReactor(GatewayService* svc, grpc::CallbackServerContext* ctx) : svc_(svc), ctx_(ctx) {}

  void Begin(const grpc::ByteBuffer& raw) {
    absl::StatusOr<cascade::v1::GenerateRequest> parsed =
        ParseRawRequest<cascade::v1::GenerateRequest>(raw);
    grpc::Status st = svc_->CheckAuth(ctx_);
    if (st.ok()) st = ToGrpc(parsed.status());
    const cascade::v1::GenerateRequest& req = parsed.ok() ? *parsed : cascade::v1::GenerateRequest::default_instance();
    if (st.ok() && !svc_->TryAdmit()) {
      st = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "the gateway is at its concurrency limit (--max_concurrent); retry later");
    } else if (st.ok()) {
      admitted_ = true;
    }
    absl::StatusOr<Prompt> prompt = absl::InternalError("unset");
    if (st.ok()) st = ToGrpc(CheckModel(req.model(), svc_->options().limits));
    if (st.ok()) {
      prompt = BuildPrompt(req.chunks(), req.sampling(), req.cache_salt(),
                           !req.has_add_generation_prompt() || req.add_generation_prompt(),
                           svc_->tokenizer(), svc_->options().limits);
      st = ToGrpc(prompt.status());
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      turn_done_ = true;
      final_ = st;
      MaybeWriteLocked();
      return;
    }
    TurnParams p;
    p.request_id = req.request_id().empty() ? svc_->NewRequestId() : req.request_id();
    p.request = ToWorkerRequest(*prompt, p.request_id, svc_->options().limits.model_name);
    p.workers = svc_->Route(*prompt);
    p.stop = prompt->stop;
    p.deadline = svc_->DeadlineFor(ctx_);
    p.max_attempts = svc_->options().max_attempts;
    p.resume_mid_stream = svc_->options().resume_mid_stream;
    // Not under mu_: the turn may report back (TurnDone) before Start returns.
    std::shared_ptr<Turn> t =
        Turn::Start(std::move(p), svc_->pool(), svc_->tokenizer(), this, svc_->metrics());
    {
      std::lock_guard<std::mutex> lock(mu_);
      turn_ = t;
    }
    if (ctx_->IsCancelled()) t->Cancel();  // OnCancel may have run before turn_ was set
  }

  void Emit(GenerateResponse ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.Push(std::move(ev));
    MaybeWriteLocked();
  }

  void TurnDone(const grpc::Status& status, const TurnResult&) override {
    std::lock_guard<std::mutex> lock(mu_);
    turn_done_ = true;
    final_ = status;
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<Turn> cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writes_.Done(ok)) cancel = turn_;
      MaybeWriteLocked();
    }
    if (cancel) cancel->Cancel();
  }

  void OnCancel() override {
    std::shared_ptr<Turn> t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = turn_;
    }
    if (t) t->Cancel();
  }

  void OnDone() override {
    if (admitted_) svc_->Release();
    delete this;
  }

 private:
  void MaybeWriteLocked() {
    if (finish_called_) return;
    if (writes_.Next(&current_)) {
      StartWrite(&current_);
      return;
    }
    if (writes_.writing()) return;
    if (turn_done_) {
      finish_called_ = true;
      Finish(final_);
    }
  }

  GatewayService* const svc_;
  grpc::CallbackServerContext* const ctx_;
  bool admitted_ = false;
  std::mutex mu_;
  std::shared_ptr<Turn> turn_;
  WriteQueue<GenerateResponse> writes_;
  grpc::ByteBuffer current_;
  grpc::Status final_;
  bool turn_done_ = false, finish_called_ = false;
};

class ChatReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                          public TurnSink {
 public:
  ChatReactor(GatewayService* svc, grpc::CallbackServerContext* ctx) : svc_(svc), ctx_(ctx) {
    grpc::Status st = svc_->CheckAuth(ctx_);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      EndLocked(st);
      return;
    }
    StartRead(&raw_req_);
  }

  void OnReadDone(bool ok) override {
    absl::StatusOr<TurnParams> params = absl::CancelledError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {  // the client closed its side: finish once the last turn's events are written
        EndLocked(grpc::Status::OK);
        return;
      }
      absl::StatusOr<cascade::v1::ChatRequest> parsed =
          ParseRawRequest<cascade::v1::ChatRequest>(raw_req_);
      if (!parsed.ok()) {
        EndLocked(ToGrpc(parsed.status()));
        return;
      }
      req_ = std::move(*parsed);
      params = PrepareTurnLocked();
      if (!params.ok()) {
        EndLocked(ToGrpc(params.status()));
        return;
      }
    }
    // Not under mu_: the turn may report back (TurnDone) before Start returns.
    std::shared_ptr<Turn> t =
        Turn::Start(std::move(*params), svc_->pool(), svc_->tokenizer(), this, svc_->metrics());
    bool cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (turn_active_) turn_ = t;
      cancel = ctx_->IsCancelled();
    }
    if (cancel) t->Cancel();
  }

  void Emit(GenerateResponse ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    cascade::v1::ChatResponse wrapped;
    wrapped.set_turn(turn_index_);
    wrapped.set_session_id(session_id_);
    *wrapped.mutable_event() = std::move(ev);
    writes_.Push(std::move(wrapped));
    MaybeWriteLocked();
  }

  void TurnDone(const grpc::Status& status, const TurnResult& result) override {
    std::lock_guard<std::mutex> lock(mu_);
    turn_active_ = false;
    if (admitted_) {
      svc_->Release();
      admitted_ = false;
    }
    if (!status.ok()) {
      EndLocked(status);
      return;
    }
    // The session goes on: this turn's prompt pieces, then the answer closed as ChatML does.
    for (PromptChunk& c : pending_) history_.push_back(std::move(c));
    pending_.clear();
    PromptChunk answer{cascade::v1::CHUNK_KIND_ASSISTANT, result.tokens, ""};
    auto close = svc_->tokenizer().Encode("<|im_end|>\n");
    if (close.ok()) answer.tokens.insert(answer.tokens.end(), close->begin(), close->end());
    history_tokens_ += static_cast<int64_t>(answer.tokens.size());
    history_.push_back(std::move(answer));
    sticky_ = result.worker_address;
    ++turn_index_;
    if (!ended_) StartRead(&raw_req_);
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<Turn> cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writes_.Done(ok)) cancel = turn_;
      MaybeWriteLocked();
    }
    if (cancel) cancel->Cancel();
  }

  void OnCancel() override {
    std::shared_ptr<Turn> t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = turn_active_ ? turn_ : nullptr;
    }
    if (t) t->Cancel();
  }

  void OnDone() override {
    if (admitted_) svc_->Release();
    delete this;
  }

 private:
  absl::StatusOr<TurnParams> PrepareTurnLocked() {
    if (turn_index_ == 0) {
      absl::Status st = CheckModel(req_.model(), svc_->options().limits);
      if (!st.ok()) return st;
      salt_ = req_.cache_salt();
      session_id_ = req_.session_id().empty() ? svc_->NewRequestId() : req_.session_id();
    } else if (!req_.model().empty() && req_.model() != svc_->options().limits.model_name) {
      return absl::InvalidArgumentError("model: must not change within a session");
    }
    auto prompt = BuildPrompt(req_.chunks(), req_.sampling(), salt_, true, svc_->tokenizer(),
                              svc_->options().limits);
    if (!prompt.ok()) return prompt.status();
    const int64_t total = history_tokens_ + prompt->num_tokens + prompt->sampling.max_tokens;
    if (total > svc_->options().limits.max_context) {
      return absl::InvalidArgumentError(
          absl::StrCat("the session (", history_tokens_, " tokens so far) plus this turn would "
                       "exceed the context length (", svc_->options().limits.max_context, ")"));
    }
    if (!svc_->TryAdmit()) {
      return absl::ResourceExhaustedError(
          "the gateway is at its concurrency limit (--max_concurrent); retry later");
    }
    admitted_ = true;
    pending_ = prompt->chunks;
    for (const PromptChunk& c : pending_) history_tokens_ += static_cast<int64_t>(c.tokens.size());
    Prompt full = *prompt;
    full.chunks = history_;
    full.chunks.insert(full.chunks.end(), pending_.begin(), pending_.end());
    full.num_tokens = history_tokens_;

    TurnParams p;
    p.request_id = absl::StrCat(session_id_, "/", turn_index_);
    p.request = ToWorkerRequest(full, p.request_id, svc_->options().limits.model_name);
    p.workers = svc_->Route(full, sticky_);
    p.stop = full.stop;
    p.deadline = svc_->DeadlineFor(ctx_);
    p.max_attempts = svc_->options().max_attempts;
    p.resume_mid_stream = svc_->options().resume_mid_stream;
    turn_active_ = true;
    return p;
  }

  void EndLocked(const grpc::Status& st) {
    if (ended_) return;
    ended_ = true;
    final_ = st;
    MaybeWriteLocked();
  }

  void MaybeWriteLocked() {
    if (finish_called_) return;
    if (writes_.Next(&current_)) {
      StartWrite(&current_);
      return;
    }
    if (writes_.writing()) return;
    if (ended_ && !turn_active_) {
      finish_called_ = true;
      Finish(final_);
    }
  }

  GatewayService* const svc_;
  grpc::CallbackServerContext* const ctx_;
  std::mutex mu_;
  grpc::ByteBuffer raw_req_;
  cascade::v1::ChatRequest req_;
  std::string session_id_, salt_, sticky_;
  std::vector<PromptChunk> history_, pending_;
  int64_t history_tokens_ = 0;
  int32_t turn_index_ = 0;
  bool admitted_ = false, turn_active_ = false, ended_ = false;
  std::shared_ptr<Turn> turn_;
  WriteQueue<cascade::v1::ChatResponse> writes_;
  grpc::ByteBuffer current_;
  grpc::Status final_;
  bool finish_called_ = false;
};

// RegisterChunk: prefill the chunks with a one-token turn on the chosen worker, pinned there.
class RegisterSink final : public TurnSink {
 public:
  RegisterSink(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out,
               registry::RegistryClient* registry, int64_t ttl_s, GatewayService* svc)
      : reactor_(reactor), out_(out), registry_(registry), ttl_s_(ttl_s), svc_(svc) {}

  void Emit(GenerateResponse ev) override {
    if (!ev.has_start()) return;
    *response_.mutable_chunks() = ev.start().chunks();
    response_.set_worker_id(ev.start().worker_id());
  }

  void TurnDone(const grpc::Status& status, const TurnResult&) override {
    if (status.ok() && registry_ != nullptr && ttl_s_ > 0) {
      std::string parent;
      for (const auto& c : response_.chunks()) {
        auto h = hash::Hash128::FromHex(c.hash());
        if (!h) continue;
        registry::HeldChunk held;
        held.hash = *h;
        held.start = c.start();
        held.end = c.end();
        held.kind = c.kind();
        if (auto p = hash::Hash128::FromHex(parent)) held.parent_hash = *p;
        registry_->PinChunk(*h, ttl_s_, held).IgnoreError();  // routing hint only
        parent = c.hash();
      }
    }
    svc_->Release();
    if (status.ok()) SerializeToByteBuffer(response_, out_);
    reactor_->Finish(status);
    delete this;
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const out_;
  cascade::v1::RegisterChunkResponse response_;
  registry::RegistryClient* const registry_;
  const int64_t ttl_s_;
  GatewayService* const svc_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GatewayService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto* r = new GenerateReactor(this, context);
  r->Begin(*request);
  return r;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GatewayService::Chat(
    grpc::CallbackServerContext* context) {
  return new ChatReactor(this, context);
}

grpc::ServerUnaryReactor* GatewayService::RegisterChunk(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<cascade::v1::RegisterChunkRequest> parsed =
      ParseRawRequest<cascade::v1::RegisterChunkRequest>(*raw);
  grpc::Status st = CheckAuth(context);
  if (st.ok()) st = ToGrpc(parsed.status());
  const cascade::v1::RegisterChunkRequest* request =
      parsed.ok() ? &*parsed : &cascade::v1::RegisterChunkRequest::default_instance();
  if (st.ok()) st = ToGrpc(CheckModel(request->model(), options_.limits));
  if (st.ok() && (request->pin_ttl_seconds() < 0 || request->pin_ttl_seconds() > options_.max_pin_ttl_s)) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("pin_ttl_seconds must be in [0, ", options_.max_pin_ttl_s, "]"));
  }
  cascade::v1::SamplingParams one;
  one.set_max_tokens(1);
  one.set_temperature(0);
  absl::StatusOr<Prompt> prompt = absl::InternalError("unset");
  if (st.ok()) {
    prompt = BuildPrompt(request->chunks(), one, request->cache_salt(), false, *tokenizer_, options_.limits);
    st = ToGrpc(prompt.status());
  }
  if (st.ok() && !TryAdmit()) {
    st = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the gateway is at its concurrency limit");
  }
  if (!st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  TurnParams p;
  p.request_id = NewRequestId();
  p.request = ToWorkerRequest(*prompt, p.request_id, options_.limits.model_name);
  p.request.set_pin_ttl_seconds(request->pin_ttl_seconds());
  p.workers = Route(*prompt);
  p.deadline = DeadlineFor(context);
  p.max_attempts = options_.max_attempts;
  auto* sink = new RegisterSink(reactor, response, registry_, request->pin_ttl_seconds(), this);
  Turn::Start(std::move(p), pool_, *tokenizer_, sink, metrics_);
  return reactor;
}

}  // namespace cascade::gateway
