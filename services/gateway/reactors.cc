// Streaming reactors of the gateway: Generate (server stream), Chat (bidi, one turn at a time)
// and RegisterChunk (unary over a one-token turn). Each is the TurnSink of its turn(s): events
// are queued and written one at a time; queued deltas merge while a write is in flight, so a
// slow client gets fewer, larger messages and a fast one gets every token at once.
#include <atomic>
#include <deque>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bounded_text.h"
#include "common/mutex.h"
#include "common/write_queue.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/raw_request.h"
#include "services/gateway/turn.h"

namespace cascade::gateway {
namespace {

using cascade::v2::GenerateResponse;

GenerateResponse& EventOf(GenerateResponse& r) { return r; }
GenerateResponse& EventOf(cascade::v2::ChatResponse& r) { return *r.mutable_event(); }
const GenerateResponse& EventOf(const GenerateResponse& r) { return r; }
const GenerateResponse& EventOf(const cascade::v2::ChatResponse& r) { return r.event(); }

// Token deltas queued behind a write in flight become one message (common/write_queue.h).
template <typename Item>
bool MergeDeltas(Item& into, const Item& from) {
  if (!EventOf(into).has_delta() || !EventOf(from).has_delta()) return false;
  cascade::v2::TokenDelta* d = EventOf(into).mutable_delta();
  const cascade::v2::TokenDelta& f = EventOf(from).delta();
  d->mutable_token_ids()->MergeFrom(f.token_ids());
  d->mutable_text()->append(f.text());
  d->mutable_logprobs()->MergeFrom(f.logprobs());
  return true;
}

template <typename Item>
using WriteQueue = common::CoalescingWriteQueue<Item, MergeDeltas<Item>>;

// Lifetime rules the reactors share. OnDone (which deletes a reactor) may run on a gRPC thread
// as soon as Finish is called, so Finish is the last thing a thread does with a reactor: it is
// decided under the reactor's mutex and issued by a PendingFinish declared before the lock,
// after the lock is released. A thread that enters a reactor from outside gRPC's reactions and
// may outlive its Finish (the admission thread, which starts the turn) holds a ReactorRef; the
// reactor is deleted when gRPC's reference (dropped in OnDone) and every ReactorRef are gone.
template <typename Reactor>
class PendingFinish {
 public:
  explicit PendingFinish(Reactor* r) : r_(r) {}
  ~PendingFinish() {
    if (status_) r_->Finish(*status_);
  }
  void Set(const grpc::Status& s) { status_ = s; }

 private:
  Reactor* const r_;
  std::optional<grpc::Status> status_;
};

template <typename Reactor>
class ReactorRef {
 public:
  explicit ReactorRef(Reactor* r) : r_(r) { r_->refs_.fetch_add(1, std::memory_order_relaxed); }
  ~ReactorRef() { r_->Unref(); }

 private:
  Reactor* const r_;
};

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public TurnSink {
 public:
  GenerateReactor(GatewayService* svc, grpc::CallbackServerContext* ctx) : svc_(svc), ctx_(ctx) {}

  void Begin(const grpc::ByteBuffer& raw) {
    absl::StatusOr<cascade::v2::GenerateRequest> parsed =
        ParseRawRequest<cascade::v2::GenerateRequest>(raw, svc_->max_request_bytes());
    grpc::Status st = svc_->CheckAuth(ctx_);
    if (st.ok()) st = ToGrpc(parsed.status());
    const cascade::v2::GenerateRequest& req =
        parsed.ok() ? *parsed : cascade::v2::GenerateRequest::default_instance();
    absl::StatusOr<Prompt> prompt = absl::InternalError("unset");
    if (st.ok()) st = ToGrpc(CheckModel(req.model(), svc_->options().limits));
    if (st.ok()) st = ToGrpc(common::CheckIdField("request_id", req.request_id()));
    if (st.ok()) {  // refused anyway: skip tokenizing and routing
      MutexLock lock(&mu_);
      st = svc_->HoldRoom(&room_);
    }
    if (st.ok()) {
      prompt = BuildPrompt(req.chunks(), req.sampling(), req.cache_salt(),
                           !req.has_add_generation_prompt() || req.add_generation_prompt(),
                           svc_->tokenizer(), svc_->options().limits,
                           !req.has_enable_thinking() || req.enable_thinking());
      st = ToGrpc(prompt.status());
    }
    if (!st.ok()) {
      PendingFinish<GenerateReactor> fin(this);
      MutexLock lock(&mu_);
      EndLocked(st, &fin);
      return;
    }
    params_ = svc_->NewTurnParams(
        *prompt, req.request_id().empty() ? svc_->NewRequestId() : req.request_id(), ctx_);
    // The answer may come on a gRPC client thread; nothing finishes the RPC meanwhile, and the
    // ReactorRef keeps this alive until the callback is done with it.
    auto hold = std::make_shared<ReactorRef<GenerateReactor>>(this);
    svc_->Route(*prompt, "", &params_.request,
                [this, hold](std::vector<Scored> ranked) { OnRouted(std::move(ranked)); });
  }

  void OnRouted(std::vector<Scored> ranked) {
    PendingFinish<GenerateReactor> fin(this);
    MutexLock lock(&mu_);
    room_.Release();            // Admit counts it from here
    if (ctx_->IsCancelled()) {  // gone while routing (OnCancel had nothing to withdraw)
      EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                &fin);
      return;
    }
    // The grant arrives on the admission thread, never inline, so mu_ may be held here.
    waiting_ = true;
    ticket_ = svc_->Admit(std::move(ranked), params_.deadline,
                          [this](absl::StatusOr<Grant> g) { OnAdmitted(std::move(g)); });
  }

  // On the admission thread; the turn may finish the RPC before Start returns.
  void OnAdmitted(absl::StatusOr<Grant> grant) {
    ReactorRef<GenerateReactor> hold(this);
    PendingFinish<GenerateReactor> fin(this);
    {
      MutexLock lock(&mu_);
      waiting_ = false;
      if (!grant.ok()) {
        EndLocked(ToGrpc(grant.status()), &fin);
        return;
      }
      grant_ = std::move(*grant);
      if (ctx_->IsCancelled()) {  // gone while queued; OnDone gives the slot back
        EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                  &fin);
        return;
      }
      params_.workers = grant_->ranked;
    }
    // Not under mu_: the turn may report back (TurnDone) before Start returns.
    std::shared_ptr<Turn> t =
        Turn::Start(std::move(params_), svc_->pool(), svc_->tokenizer(), this, svc_->metrics());
    bool cancel = false;
    {
      MutexLock lock(&mu_);
      if (!finish_called_) {  // else the context may be gone already
        turn_ = t;
        cancel = ctx_->IsCancelled();  // OnCancel may have run before turn_ was set
      }
    }
    if (cancel) t->Cancel();
  }

  void Emit(GenerateResponse ev) override {
    PendingFinish<GenerateReactor> fin(this);
    MutexLock lock(&mu_);
    writes_.Push(std::move(ev));
    MaybeWriteLocked(&fin);
  }

  void TurnDone(const grpc::Status& status, const TurnResult& result) override {
    PendingFinish<GenerateReactor> fin(this);
    MutexLock lock(&mu_);
    if (grant_) {
      grant_->address = result.slot_address;  // where the slot moved with the turn
      // Given back before the client hears the end (OnDone comes after), so the client's next
      // request finds the room its last one left.
      svc_->Release(*grant_);
      grant_.reset();
    }
    EndLocked(status, &fin);
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<Turn> cancel;
    {
      PendingFinish<GenerateReactor> fin(this);
      MutexLock lock(&mu_);
      if (writes_.Done(ok)) cancel = turn_;
      MaybeWriteLocked(&fin);
    }
    if (cancel) cancel->Cancel();  // touches only the turn: this may be gone
  }

  void OnCancel() override {
    std::shared_ptr<Turn> t;
    {
      PendingFinish<GenerateReactor> fin(this);
      MutexLock lock(&mu_);
      // Still queued: withdraw and end now (else the grant is on its way; OnAdmitted ends it).
      if (waiting_ && svc_->CancelAdmission(ticket_)) {
        waiting_ = false;
        EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                  &fin);
      }
      t = turn_;
    }
    if (t) t->Cancel();
  }

  void OnDone() override {
    if (grant_) svc_->Release(*grant_);
    svc_->LeaveStream();  // counted in by the handler
    Unref();
  }

 private:
  friend class ReactorRef<GenerateReactor>;
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  void EndLocked(const grpc::Status& st, PendingFinish<GenerateReactor>* fin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    turn_done_ = true;
    final_ = st;
    MaybeWriteLocked(fin);
  }

  void MaybeWriteLocked(PendingFinish<GenerateReactor>* fin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_) return;
    if (GenerateResponse next; writes_.Next(&next)) {
      SerializeToByteBuffer(next, &current_);  // the last write is done with current_
      StartWrite(&current_);
      return;
    }
    if (writes_.writing()) return;
    if (turn_done_) {
      finish_called_ = true;
      fin->Set(final_);
    }
  }

  GatewayService* const svc_;
  grpc::CallbackServerContext* const ctx_;
  Mutex mu_;
  TurnParams params_;                          // built in Begin, moved into the turn once admitted
  Admission::Hold room_ ABSL_GUARDED_BY(mu_);  // from Begin until routed (HoldRoom)
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // queued for admission under ticket_
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // The admission slot, given back when the turn ends, else in OnDone (when no other thread
  // touches the reactor; a TurnDone before it happened before the Finish that led to it).
  std::optional<Grant> grant_;
  std::shared_ptr<Turn> turn_ ABSL_GUARDED_BY(mu_);
  WriteQueue<GenerateResponse> writes_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_ ABSL_GUARDED_BY(mu_);  // the write in flight
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  bool turn_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> refs_{1};  // gRPC's (until OnDone) + ReactorRefs
};

class ChatReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                          public TurnSink {
 public:
  ChatReactor(GatewayService* svc, grpc::CallbackServerContext* ctx) : svc_(svc), ctx_(ctx) {
    grpc::Status st = svc_->CheckAuth(ctx_);
    if (!st.ok()) {
      PendingFinish<ChatReactor> fin(this);
      MutexLock lock(&mu_);
      EndLocked(st, &fin);
      return;
    }
    StartRead(&raw_req_);
  }

  void OnReadDone(bool ok) override {
    absl::StatusOr<Prompt> full = absl::InternalError("unset");
    {
      PendingFinish<ChatReactor> fin(this);
      MutexLock lock(&mu_);
      if (!ok) {  // the client closed its side: finish once the last turn's events are written
        EndLocked(grpc::Status::OK, &fin);
        return;
      }
      absl::StatusOr<cascade::v2::ChatRequest> parsed =
          ParseRawRequest<cascade::v2::ChatRequest>(raw_req_, svc_->max_request_bytes());
      if (!parsed.ok()) {
        EndLocked(ToGrpc(parsed.status()), &fin);
        return;
      }
      req_ = std::move(*parsed);
      grpc::Status room = svc_->HoldRoom(&room_);
      if (!room.ok()) {
        EndLocked(room, &fin);
        return;
      }
      full = PrepareTurnLocked();
      if (!full.ok()) {
        room_.Release();
        EndLocked(ToGrpc(full.status()), &fin);
        return;
      }
    }
    // Not under mu_ (the answer may come inline). The turn is active, so nothing finishes the
    // RPC while routing; the ReactorRef keeps this alive until the callback is done with it.
    auto hold = std::make_shared<ReactorRef<ChatReactor>>(this);
    svc_->Route(*full, sticky_, &params_.request,
                [this, hold](std::vector<Scored> ranked) { OnRouted(std::move(ranked)); });
  }

  void OnRouted(std::vector<Scored> ranked) {
    PendingFinish<ChatReactor> fin(this);
    MutexLock lock(&mu_);
    room_.Release();            // Admit counts it from here
    if (ctx_->IsCancelled()) {  // gone while routing (OnCancel had nothing to withdraw)
      AbandonTurnLocked();
      EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                &fin);
      return;
    }
    // The grant arrives on the admission thread, never inline, so mu_ may be held here.
    waiting_ = true;
    ticket_ = svc_->Admit(std::move(ranked), params_.deadline,
                          [this](absl::StatusOr<Grant> g) { OnAdmitted(std::move(g)); });
  }

  // On the admission thread; the turn may finish the RPC before Start returns.
  void OnAdmitted(absl::StatusOr<Grant> grant) {
    ReactorRef<ChatReactor> hold(this);
    PendingFinish<ChatReactor> fin(this);
    {
      MutexLock lock(&mu_);
      waiting_ = false;
      if (grant.ok()) grant_ = std::move(*grant);
      if (!grant.ok() || ctx_->IsCancelled()) {
        AbandonTurnLocked();
        EndLocked(grant.ok() ? grpc::Status(grpc::StatusCode::CANCELLED,
                                            "the client cancelled the request")
                             : ToGrpc(grant.status()),
                  &fin);
        return;
      }
      params_.workers = grant_->ranked;
    }
    // Not under mu_: the turn may report back (TurnDone) before Start returns.
    std::shared_ptr<Turn> t =
        Turn::Start(std::move(params_), svc_->pool(), svc_->tokenizer(), this, svc_->metrics());
    bool cancel = false;
    {
      MutexLock lock(&mu_);
      if (turn_active_ && !finish_called_) {  // else the context may be gone already
        turn_ = t;
        cancel = ctx_->IsCancelled();
      }
    }
    if (cancel) t->Cancel();
  }

  void Emit(GenerateResponse ev) override {
    PendingFinish<ChatReactor> fin(this);
    MutexLock lock(&mu_);
    cascade::v2::ChatResponse wrapped;
    wrapped.set_turn(turn_index_);
    wrapped.set_session_id(session_id_);
    *wrapped.mutable_event() = std::move(ev);
    writes_.Push(std::move(wrapped));
    MaybeWriteLocked(&fin);
  }

  void TurnDone(const grpc::Status& status, const TurnResult& result) override {
    PendingFinish<ChatReactor> fin(this);
    MutexLock lock(&mu_);
    turn_active_ = false;
    if (grant_) {
      grant_->address = result.slot_address;  // where the slot moved with the turn
      svc_->Release(*grant_);
      grant_.reset();
    }
    if (!status.ok()) {
      EndLocked(status, &fin);
      return;
    }
    // The session goes on: this turn's prompt pieces, then the answer closed as ChatML does.
    for (PromptChunk& c : pending_) history_.push_back(std::move(c));
    pending_.clear();
    PromptChunk answer{cascade::v2::CHUNK_KIND_ASSISTANT, result.tokens, ""};
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
      PendingFinish<ChatReactor> fin(this);
      MutexLock lock(&mu_);
      if (writes_.Done(ok)) cancel = turn_;
      MaybeWriteLocked(&fin);
    }
    if (cancel) cancel->Cancel();  // touches only the turn: this may be gone
  }

  void OnCancel() override {
    std::shared_ptr<Turn> t;
    {
      PendingFinish<ChatReactor> fin(this);
      MutexLock lock(&mu_);
      if (waiting_ && svc_->CancelAdmission(ticket_)) {  // withdrawn from the queue
        waiting_ = false;
        AbandonTurnLocked();
        EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                  &fin);
      }
      t = turn_active_ ? turn_ : nullptr;
    }
    if (t) t->Cancel();
  }

  void OnDone() override {
    if (grant_) svc_->Release(*grant_);
    svc_->LeaveStream();  // counted in by the handler
    Unref();
  }

 private:
  friend class ReactorRef<ChatReactor>;
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // A prepared turn that will not run: its prompt does not join the session.
  void AbandonTurnLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const PromptChunk& c : pending_) history_tokens_ -= static_cast<int64_t>(c.tokens.size());
    pending_.clear();
    turn_active_ = false;
  }

  // Validates the message, sets params_ for the next turn and returns the session's whole
  // prompt (history and this turn), which is routed.
  absl::StatusOr<Prompt> PrepareTurnLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (turn_index_ == 0) {
      absl::Status st = CheckModel(req_.model(), svc_->options().limits);
      if (st.ok()) st = common::CheckIdField("session_id", req_.session_id());
      if (!st.ok()) return st;
      salt_ = req_.cache_salt();
      session_id_ = req_.session_id().empty() ? svc_->NewRequestId() : req_.session_id();
    } else if (!req_.model().empty() && req_.model() != svc_->options().limits.model_name) {
      return absl::InvalidArgumentError("model: must not change within a session");
    }
    auto prompt =
        BuildPrompt(req_.chunks(), req_.sampling(), salt_, true, svc_->tokenizer(),
                    svc_->options().limits, !req_.has_enable_thinking() || req_.enable_thinking());
    if (!prompt.ok()) return prompt.status();
    const int64_t total = history_tokens_ + prompt->num_tokens + prompt->sampling.max_tokens();
    if (total > svc_->options().limits.max_context) {
      return absl::InvalidArgumentError(absl::StrCat("the session (", history_tokens_,
                                                     " tokens so far) plus this turn would "
                                                     "exceed the context length (",
                                                     svc_->options().limits.max_context, ")"));
    }
    pending_ = prompt->chunks;
    for (const PromptChunk& c : pending_) history_tokens_ += static_cast<int64_t>(c.tokens.size());
    Prompt full = *prompt;
    full.chunks = history_;
    full.chunks.insert(full.chunks.end(), pending_.begin(), pending_.end());
    full.num_tokens = history_tokens_;

    params_ = svc_->NewTurnParams(full, absl::StrCat(session_id_, "/", turn_index_), ctx_);
    turn_active_ = true;
    return full;
  }

  void EndLocked(const grpc::Status& st, PendingFinish<ChatReactor>* fin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ended_) return;
    ended_ = true;
    final_ = st;
    MaybeWriteLocked(fin);
  }

  void MaybeWriteLocked(PendingFinish<ChatReactor>* fin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_called_) return;
    if (cascade::v2::ChatResponse next; writes_.Next(&next)) {
      SerializeToByteBuffer(next, &current_);  // the last write is done with current_
      StartWrite(&current_);
      return;
    }
    if (writes_.writing()) return;
    if (ended_ && !turn_active_) {
      finish_called_ = true;
      fin->Set(final_);
    }
  }

  GatewayService* const svc_;
  grpc::CallbackServerContext* const ctx_;
  Mutex mu_;
  grpc::ByteBuffer raw_req_;
  cascade::v2::ChatRequest req_;
  std::string session_id_, salt_, sticky_;
  std::vector<PromptChunk> history_, pending_;
  int64_t history_tokens_ = 0;
  int32_t turn_index_ = 0;
  bool turn_active_ = false, ended_ = false;
  TurnParams params_;     // the next turn's, moved into it once admitted
  Admission::Hold room_;  // the next turn's room while it is routed (HoldRoom)
  bool waiting_ = false;  // queued for admission under ticket_
  uint64_t ticket_ = 0;
  std::optional<Grant> grant_;  // the running turn's admission slot
  std::shared_ptr<Turn> turn_ ABSL_GUARDED_BY(mu_);
  WriteQueue<cascade::v2::ChatResponse> writes_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_ ABSL_GUARDED_BY(mu_);  // the write in flight
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> refs_{1};  // gRPC's (until OnDone) + ReactorRefs
};

// RegisterChunk: prefill the chunks with a one-token turn on the chosen worker, pinned there.
// The pins go to the registry at once, asynchronously (TurnDone runs on a worker call's callback
// thread, which a slow registry must not hold); the reply goes out when the last one answers.
class RegisterSink final : public TurnSink {
 public:
  RegisterSink(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out,
               registry::RegistryClient* registry, int64_t ttl_s, GatewayService* svc, Grant grant)
      : reactor_(reactor),
        out_(out),
        registry_(registry),
        ttl_s_(ttl_s),
        svc_(svc),
        grant_(std::move(grant)) {}

  void Emit(GenerateResponse ev) override {
    if (!ev.has_start()) return;
    *response_.mutable_chunks() = ev.start().chunks();
    response_.set_worker_id(ev.start().worker_id());
  }

  void TurnDone(const grpc::Status& status, const TurnResult& result) override {
    grant_.address = result.slot_address;
    status_ = status;
    // The worker's slot goes back now; the pins only wait for the registry.
    svc_->Release(grant_);
    std::vector<registry::HeldChunk> pins;
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
        // A routing hint only: skipped while the registry fails.
        if (svc_->RegistryAllow()) pins.push_back(held);
        parent = c.hash();
      }
    }
    pending_.store(static_cast<int>(pins.size()) + 1);
    for (const registry::HeldChunk& held : pins) {
      registry_->PinChunkAsync(held.hash, ttl_s_, held, [this](absl::StatusOr<int64_t> r) {
        svc_->RegistryDone(r.status());
        Arrive();
      });
    }
    Arrive();
  }

 private:
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const out_;
  cascade::v2::RegisterChunkResponse response_;
  registry::RegistryClient* const registry_;
  const int64_t ttl_s_;
  // One more pin answered (or TurnDone's own share): the last one sends the reply.
  void Arrive() {
    if (pending_.fetch_sub(1) != 1) return;
    if (status_.ok()) SerializeToByteBuffer(response_, out_);
    reactor_->Finish(status_);
    delete this;
  }

  GatewayService* const svc_;
  Grant grant_;
  grpc::Status status_;
  std::atomic<int> pending_{0};  // pins outstanding + 1 until TurnDone has issued them all
};

// A stream refused before anything else (the gateway is draining): finished at once.
template <typename Base>
class Refused final : public Base {
 public:
  Refused() {
    this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the gateway is draining (shutting down); retry on another replica"));
  }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GatewayService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (!EnterStream()) return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>();
  auto* r = new GenerateReactor(this, context);
  r->Begin(*request);
  return r;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GatewayService::Chat(
    grpc::CallbackServerContext* context) {
  if (!EnterStream()) {
    return new Refused<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>();
  }
  return new ChatReactor(this, context);
}

grpc::ServerUnaryReactor* GatewayService::RegisterChunk(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<cascade::v2::RegisterChunkRequest> parsed =
      ParseRawRequest<cascade::v2::RegisterChunkRequest>(*raw, max_request_bytes());
  grpc::Status st = CheckAuth(context);
  if (st.ok()) st = ToGrpc(parsed.status());
  const cascade::v2::RegisterChunkRequest* request =
      parsed.ok() ? &*parsed : &cascade::v2::RegisterChunkRequest::default_instance();
  if (st.ok()) st = ToGrpc(CheckModel(request->model(), options_.limits));
  if (st.ok() &&
      (request->pin_ttl_seconds() < 0 || request->pin_ttl_seconds() > options_.max_pin_ttl_s)) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("pin_ttl_seconds must be in [0, ", options_.max_pin_ttl_s, "]"));
  }
  constexpr int64_t kMaxRetentionS = 365 * 24 * 3600;
  if (st.ok() &&
      (request->retention_seconds() < 0 || request->retention_seconds() > kMaxRetentionS)) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("retention_seconds must be in [0, ", kMaxRetentionS, "], got ",
                                   request->retention_seconds()));
  }
  cascade::v2::SamplingParams one;
  one.set_max_tokens(1);
  one.set_temperature(0);
  absl::StatusOr<Prompt> prompt = absl::InternalError("unset");
  if (st.ok()) {
    prompt = BuildPrompt(request->chunks(), one, request->cache_salt(), false, *tokenizer_,
                         options_.limits);
    st = ToGrpc(prompt.status());
  }
  if (!st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  auto room = std::make_shared<Admission::Hold>();
  st = HoldRoom(room.get());
  if (!st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  auto p = std::make_shared<TurnParams>(NewTurnParams(*prompt, NewRequestId(), context));
  p->request.set_pin_ttl_seconds(request->pin_ttl_seconds());
  p->request.set_priority(request->priority());
  p->request.set_retention_seconds(request->retention_seconds());
  const int64_t ttl_s = request->pin_ttl_seconds();
  // A unary call cannot be withdrawn from the queue; it waits at most the queue timeout.
  Route(*prompt, "", &p->request,
        [this, reactor, response, ttl_s, p, room](std::vector<Scored> ranked) {
          room->Release();  // Admit counts it from here
          Admit(std::move(ranked), p->deadline,
                [this, reactor, response, ttl_s, p](absl::StatusOr<Grant> g) {
                  if (!g.ok()) {
                    reactor->Finish(ToGrpc(g.status()));
                    return;
                  }
                  p->workers = g->ranked;
                  auto* sink =
                      new RegisterSink(reactor, response, registry_, ttl_s, this, std::move(*g));
                  Turn::Start(std::move(*p), pool_, *tokenizer_, sink, metrics_);
                });
        });
  return reactor;
}

}  // namespace cascade::gateway
