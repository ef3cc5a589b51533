// Turn relay; see turn.h. Locking: Turn::mu_ guards the turn's state and is held while calling
// the sink (the sink only takes its own lock). The worker call reports to Upstream, which
// forwards to the Turn; an Upstream lets go of itself in OnDone after telling the Turn.
#include "services/gateway/turn.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_text.h"
#include "common/log.h"
#include "services/gateway/admission.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/recent_routes.h"
#include "services/gateway/text_stream.h"

namespace cascade::gateway {

using cascade::v2::GenerateResponse;
using cascade::v2::WorkerServiceGenerateResponse;

// One attempt: the observer of one worker call. It holds the turn (the call may report after
// the turn's owner let go of it) and itself, from Go until the call's OnDone.
class Turn::Upstream final : public WorkerCallObserver {
 public:
  // REQUIRES: the turn's mu_ is held (the call keeps a reference to its request_).
  Upstream(std::shared_ptr<Turn> turn, std::shared_ptr<WorkerHandle> handle,
           const cascade::v2::WorkerServiceGenerateRequest& request)
      : turn_(std::move(turn)), handle_(std::move(handle)) {
    call_ = handle_->client->Generate(
        request, WorkerCallOptions{turn_->params_.deadline, turn_->params_.request_id}, this);
  }
  // REQUIRES: the Turn's mu_ is not held (callbacks may run inline).
  void Go(std::shared_ptr<Upstream> self) {
    self_ = std::move(self);
    ++handle_->inflight;
    call_->Start();
  }
  void Cancel() { call_->Cancel(); }

  bool OnMessage(const WorkerServiceGenerateResponse& msg) override {
    return !turn_->OnMessage(msg);
  }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<Upstream> self = std::move(self_);  // this lives until the end of OnDone
    --handle_->inflight;
    turn_->OnUpstreamDone(status);
  }

 private:
  std::shared_ptr<Turn> turn_;  // keeps the turn alive while the call can still report
  std::shared_ptr<WorkerHandle> handle_;
  std::shared_ptr<WorkerCall> call_;
  std::shared_ptr<Upstream> self_;
};

std::shared_ptr<Turn> Turn::Start(TurnParams params, WorkerPool* pool,
                                  const tokenizer::Tokenizer& tokenizer, TurnSink* sink,
                                  TurnMetrics* metrics) {
  auto t = std::make_shared<Turn>(std::move(params), pool, tokenizer, sink, metrics);
  std::shared_ptr<Upstream> u;
  {
    MutexLock lock(&t->mu_);
    t->started_at_ = std::chrono::steady_clock::now();
    t->metrics_->running->Increment();
    u = t->PrepareAttemptLocked();
  }
  if (u) u->Go(u);
  return t;
}

Turn::Turn(TurnParams params, WorkerPool* pool, const tokenizer::Tokenizer& tokenizer,
           TurnSink* sink, TurnMetrics* metrics)
    : params_(std::move(params)),
      pool_(pool),
      tokenizer_(tokenizer),
      sink_(sink),
      metrics_(metrics) {
  MutexLock lock(&mu_);
  request_ = params_.request;
  if (!params_.workers.empty()) result_.slot_address = params_.workers[0].candidate.address;
}

Turn::~Turn() = default;

std::shared_ptr<Turn::Upstream> Turn::PrepareAttemptLocked() {
  prompt_logprobs_attempt_ = 0;
  while (attempt_ < params_.workers.size() &&
         attempt_ < static_cast<size_t>(params_.max_attempts)) {
    const Scored& chosen = params_.workers[attempt_++];
    const Candidate& c = chosen.candidate;
    std::shared_ptr<WorkerHandle> handle = pool_->Get(c.address);
    if (!handle) continue;
    // The route's peer fetch plan goes to this worker only (another candidate has its own). A
    // request for its prompt's logprobs computes the whole prompt: no KV to fetch.
    if (chosen.peer.worker_id.empty() || request_.sampling().has_prompt_logprobs()) {
      request_.clear_peer();
    } else {
      request_.mutable_peer()->set_worker_id(chosen.peer.worker_id);
      request_.mutable_peer()->set_address(chosen.peer.address);
      request_.mutable_peer()->set_tokens(chosen.peer.tokens);
    }
    result_.worker_id = c.worker_id;
    result_.worker_address = c.address;
    if (params_.recent != nullptr) NoteRecentLocked();
    // The slot follows the request, so a survivor's limit counts the streams that fail over
    // or resume onto it (a dead worker's slots would otherwise go to new requests).
    if (params_.admission != nullptr && result_.slot_address != c.address) {
      params_.admission->Transfer(result_.slot_address, c.address);
      result_.slot_address = c.address;
    }
    if (!resumed_) {
      text_ = std::make_unique<TextStream>(tokenizer_, params_.stop,
                                           params_.request.sampling().min_tokens(),
                                           params_.request.sampling().include_stop_str_in_output());
    }
    upstream_ = std::make_shared<Upstream>(shared_from_this(), std::move(handle), request_);
    return upstream_;
  }
  done_ = true;
  metrics_->running->Decrement();
  sink_->TurnDone(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               params_.workers.empty()
                                   ? "no worker serves this model right now; start a worker or "
                                     "check the registry"
                                   : "every candidate worker failed before answering"),
                  result_);
  return nullptr;
}

void Turn::AddTexts(const cascade::v2::LogprobEntry& from, cascade::v2::LogprobEntry* to) const {
  *to = from;
  to->mutable_sampled()->set_text(LogprobText(to->sampled().token_id()));
  for (auto& alt : *to->mutable_top()) alt.set_text(LogprobText(alt.token_id()));
}

std::string Turn::LogprobText(int32_t id) const {
  absl::StatusOr<std::string_view> bytes = tokenizer_.TokenBytes(id);
  if (!bytes.ok()) return "";  // an id without text
  if (tokenizer::IsValidUtf8(*bytes)) return std::string(*bytes);
  // A piece of a code point: OpenAI's form for it, so the proto3 string stays UTF-8.
  std::string out = "bytes:";
  for (char c : *bytes) absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
  return out;
}

void Turn::Cancel() {
  std::shared_ptr<Upstream> u;
  {
    MutexLock lock(&mu_);
    cancelled_ = true;
    u = upstream_;
  }
  if (u) u->Cancel();
}

void Turn::EmitDeltaLocked(cascade::v2::TokenDelta delta) {
  if (delta.token_ids().empty() && delta.text().empty()) return;
  GenerateResponse ev;
  *ev.mutable_delta() = std::move(delta);
  sink_->Emit(std::move(ev));
}

void Turn::EmitFinishLocked(cascade::v2::FinishReason reason, const std::string& stop_reason) {
  cascade::v2::TokenDelta tail;
  tail.set_text(text_->Finish());
  EmitDeltaLocked(std::move(tail));
  finished_ = true;
  result_.finish_reason = reason;
  sink_->Emit(FinishEvent(reason, stop_reason));
}

GenerateResponse Turn::FinishEvent(cascade::v2::FinishReason reason,
                                   const std::string& stop_reason) const {
  GenerateResponse ev;
  auto* f = ev.mutable_finish();
  f->set_finish_reason(reason);
  f->set_stop_reason(stop_reason);
  if (reason == cascade::v2::FINISH_REASON_STOP && result_.stop_token_id >= 0) {
    f->set_stop_token_id(result_.stop_token_id);
  }
  f->mutable_usage()->set_prompt_tokens(result_.prompt_tokens);
  f->mutable_usage()->set_cached_tokens(result_.cached_tokens);
  f->mutable_usage()->set_completion_tokens(static_cast<int64_t>(result_.tokens.size()) +
                                            (result_.stop_token_id >= 0 ? 1 : 0));
  return ev;
}

void Turn::NoteRecentLocked() {
  std::vector<RoutedChunk> chunks;
  int64_t end = 0;
  for (const auto& c : request_.chunks()) {
    const std::optional<hash::Hash128> h = hash::Hash128::FromHex(c.hash());
    if (!h) break;  // no registry answer: nothing to key the prompt by
    end += c.token_ids_size();
    chunks.push_back({*h, end});
  }
  params_.recent->Note(chunks, result_.worker_id, RecentRoutes::NowMs());
}

bool Turn::OnMessage(const WorkerServiceGenerateResponse& msg) {
  MutexLock lock(&mu_);
  if (finished_) return false;
  if (msg.has_start() && resumed_) {
    // The client already has its start; the replacement's counts cover the re-prefill.
  } else if (msg.has_start()) {
    got_start_ = true;
    const auto& s = msg.start();
    if (!s.worker_id().empty()) result_.worker_id = s.worker_id();
    result_.prompt_tokens = s.prompt_tokens();
    result_.cached_tokens = s.cached_tokens();
    metrics_->prompt_tokens->Increment(static_cast<double>(s.prompt_tokens()));
    metrics_->prefix_queries->Increment(static_cast<double>(s.prompt_tokens()));
    metrics_->prefix_hits->Increment(static_cast<double>(s.cached_tokens()));
    GenerateResponse ev;
    auto* st = ev.mutable_start();
    st->set_request_id(params_.request_id);
    st->set_worker_id(result_.worker_id);
    st->set_prompt_tokens(s.prompt_tokens());
    st->set_cached_tokens(s.cached_tokens());
    *st->mutable_chunks() = s.chunks();
    if (params_.request.sampling().has_prompt_logprobs()) {
      for (const auto& c : request_.chunks()) {
        if (c.token_ids_size() == 0) continue;
        st->mutable_first_prompt_token()->set_token_id(c.token_ids(0));
        st->mutable_first_prompt_token()->set_text(LogprobText(c.token_ids(0)));
        break;
      }
    }
    sink_->Emit(std::move(ev));
  }
  if (msg.has_tokens() && msg.tokens().prompt_logprobs_size() > 0) {
    // The prompt's logprobs, each relayed once (the same bits from any attempt: a prompt's
    // logits do not depend on the worker or the cache), at most kPromptLogprobsPerDelta a delta:
    // a worker step scores up to 4096 prompt tokens, each entry with up to 21 tokens' texts,
    // which in one message could pass the client's or this server's message size limit.
    constexpr int kPromptLogprobsPerDelta = 128;
    cascade::v2::TokenDelta delta;
    auto emit = [&] {
      if (delta.prompt_logprobs_size() == 0) return;
      GenerateResponse ev;
      *ev.mutable_delta() = std::move(delta);
      delta.Clear();
      sink_->Emit(std::move(ev));
    };
    for (const auto& lp : msg.tokens().prompt_logprobs()) {
      if (prompt_logprobs_attempt_++ < prompt_logprobs_relayed_) continue;
      ++prompt_logprobs_relayed_;
      AddTexts(lp, delta.add_prompt_logprobs());
      if (delta.prompt_logprobs_size() == kPromptLogprobsPerDelta) emit();
    }
    emit();
  }
  if (msg.has_tokens() && msg.tokens().token_ids_size() > 0) {
    const auto now = std::chrono::steady_clock::now();
    const double since =
        std::chrono::duration<double>(now - (first_token_seen_ ? last_token_at_ : started_at_))
            .count();
    (first_token_seen_ ? metrics_->itl : metrics_->ttft)->Observe(since);
    if (first_token_seen_ && params_.admission != nullptr) {
      params_.admission->ObserveTokens(result_.worker_address, msg.tokens().token_ids_size(),
                                       since);
    }
    first_token_seen_ = true;
    last_token_at_ = now;
    cascade::v2::TokenDelta delta;
    const auto& t = msg.tokens();
    for (int i = 0; i < t.token_ids_size(); ++i) {
      const int32_t id = t.token_ids(i);
      // Every id reaches the client, the usage and a resume prompt, also one with no text.
      TextStream::Delta d = text_->Add(id);
      result_.tokens.push_back(id);
      delta.add_token_ids(id);
      if (i < t.logprobs_size()) AddTexts(t.logprobs(i), delta.add_logprobs());
      delta.mutable_text()->append(d.text);
      metrics_->generation_tokens->Increment();
      if (d.stopped) {
        EmitDeltaLocked(std::move(delta));
        finished_ = true;
        sink_->Emit(FinishEvent(cascade::v2::FINISH_REASON_STOP_STRING, d.stop));
        result_.finish_reason = cascade::v2::FINISH_REASON_STOP_STRING;
        return true;
      }
    }
    EmitDeltaLocked(std::move(delta));
  }
  if (msg.has_finish()) {
    const auto& f = msg.finish();
    std::string stop_reason;
    if (f.finish_reason() == cascade::v2::FINISH_REASON_STOP) {
      result_.stop_token_id = f.stop_token_id();
      // A byte-level token may be part of a code point; a proto3 string must be UTF-8 (the
      // client's parse of the event fails otherwise).
      auto bytes = tokenizer_.TokenBytes(f.stop_token_id());
      if (bytes.ok()) stop_reason = tokenizer::ToValidUtf8(*bytes);
    }
    EmitFinishLocked(f.finish_reason(), stop_reason);
  }
  return false;
}

void Turn::OnUpstreamDone(const grpc::Status& status) {
  std::shared_ptr<Upstream> next;
  {
    MutexLock lock(&mu_);
    next = FinishAttemptLocked(status);
  }
  if (next) next->Go(next);
}

std::shared_ptr<Turn::Upstream> Turn::FinishAttemptLocked(const grpc::Status& status) {
  upstream_ = nullptr;
  // CANCELLED that neither the client (cancelled_) nor a stop string (finished_) caused came
  // from the worker's side: a worker shutting down resets streams it has not started, which
  // scale_test's drained worker showed (under load) as a CANCELLED reaching the client.
  const bool retryable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                         status.error_code() == grpc::StatusCode::CANCELLED;
  if (!finished_ && !got_start_ && !cancelled_ && retryable && attempt_ < params_.workers.size() &&
      attempt_ < static_cast<size_t>(params_.max_attempts)) {
    common::LogWarn("worker_failover", {{"request_id", params_.request_id},
                                        {"worker", result_.worker_address},
                                        {"error", status.error_message()}});
    metrics_->failovers->Increment();
    if (params_.admission != nullptr && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      params_.admission->MarkDown(result_.worker_address);
    }
    return PrepareAttemptLocked();
  }
  const bool worker_failed = status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
                             status.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
                             status.error_code() != grpc::StatusCode::OK;
  if (!finished_ && got_start_ && !cancelled_ && worker_failed &&
      result_.tokens.size() >= static_cast<size_t>(params_.request.sampling().max_tokens())) {
    // Every token the client asked for had arrived when the worker's stream failed (its finish
    // message lost: a draining worker's connection closed under it, or it died right after its
    // last token). The output is whole, and the worker's finish could only have said LENGTH: a
    // stop token is never streamed, and a stop string would have ended the turn already. So it
    // ends as the worker would have ended it, not as a failure.
    common::LogInfo("worker_lost_after_last_token",
                    {{"request_id", params_.request_id},
                     {"worker", result_.worker_address},
                     {"tokens", static_cast<long>(result_.tokens.size())},
                     {"error", status.error_message()}});
    EmitFinishLocked(cascade::v2::FINISH_REASON_LENGTH, "");
  }
  if (!finished_ && got_start_ && !cancelled_ && worker_failed && params_.resume_mid_stream &&
      attempt_ < params_.workers.size() && attempt_ < static_cast<size_t>(params_.max_attempts)) {
    // Continue elsewhere: the emitted tokens become part of the prompt (an ASSISTANT chunk of
    // their ids, the way chat history is kept), and only the remaining tokens are asked for.
    // Counted from the client's budget: request_ holds the last attempt's (already reduced).
    const int32_t remaining =
        params_.request.sampling().max_tokens() - static_cast<int32_t>(result_.tokens.size());
    if (remaining > 0) {
      common::LogWarn("worker_resume", {{"request_id", params_.request_id},
                                        {"worker", result_.worker_address},
                                        {"tokens_so_far", static_cast<long>(result_.tokens.size())},
                                        {"error", status.error_message()}});
      metrics_->resumes->Increment();
      if (params_.admission != nullptr) params_.admission->MarkDown(result_.worker_address);
      request_ = params_.request;
      auto* chunk = request_.add_chunks();
      chunk->set_kind(cascade::v2::CHUNK_KIND_ASSISTANT);
      chunk->mutable_token_ids()->Assign(result_.tokens.begin(), result_.tokens.end());
      request_.mutable_sampling()->set_max_tokens(remaining);
      // min_tokens counts this attempt's tokens, as max_tokens does (the worker bans stop ids
      // while it samples its first min_tokens).
      request_.mutable_sampling()->set_min_tokens(std::max(
          0,
          params_.request.sampling().min_tokens() - static_cast<int32_t>(result_.tokens.size())));
      // Those tokens count as generated for the frequency and presence penalties.
      request_.set_resumed_tokens(static_cast<int32_t>(result_.tokens.size()));
      // The prompt's logprobs all came before the first token: once one has, none are left.
      if (!result_.tokens.empty()) request_.mutable_sampling()->clear_prompt_logprobs();
      resumed_ = true;
      return PrepareAttemptLocked();
    }
  }
  done_ = true;
  metrics_->running->Decrement();
  metrics_->e2e->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count());
  grpc::Status out = grpc::Status::OK;
  if (finished_) {
    // A stop string ended it (the upstream was cancelled on purpose) or the worker finished.
  } else if (cancelled_) {
    out = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
  } else if (got_start_) {
    // The worker died mid-stream: say how far it got, then fail the stream.
    sink_->Emit(FinishEvent(cascade::v2::FINISH_REASON_ERROR, ""));
    result_.finish_reason = cascade::v2::FINISH_REASON_ERROR;
    out = grpc::Status(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                           ? status.error_code()
                           : grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("worker ", result_.worker_id, " failed after ",
                                    result_.tokens.size(), " tokens: ", status.error_message()));
  } else {
    out = status.ok()
              ? grpc::Status(grpc::StatusCode::INTERNAL, "the worker ended without a result")
              : status;
  }
  metrics_->Finished(cascade::v2::FinishReason_Name(result_.finish_reason))->Increment();
  sink_->TurnDone(out, result_);
  return nullptr;
}

}  // namespace cascade::gateway
