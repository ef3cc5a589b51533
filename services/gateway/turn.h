// One generation on a worker, relayed: opens the worker's Generate stream (through the pool's
// WorkerClient, worker_client.h), turns token ids into text deltas (incremental detokenization,
// stop strings), fails over to the next candidate if the worker fails before its first message,
// resumes on the next one if it dies mid-stream, and reports the outcome. Used by Generate (one
// turn), Chat (one turn per client message) and RegisterChunk.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cascade/v2/gateway.pb.h"
#include "cascade/v2/worker.pb.h"
#include "common/mutex.h"
#include "services/gateway/router.h"
#include "services/gateway/worker_pool.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::gateway {

struct TurnResult {
  std::string worker_id;
  std::string worker_address;
  std::vector<int32_t> tokens;  // generated, stop token excluded
  int32_t stop_token_id = -1;
  cascade::v2::FinishReason finish_reason = cascade::v2::FINISH_REASON_UNSPECIFIED;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  // The worker the request's admission slot is charged to: the first candidate, moved along as
  // the turn fails over or resumes elsewhere. Release the grant with this address.
  std::string slot_address;
};

// Receives a turn's events. Called from gRPC threads, one call at a time per turn; must not
// block or call back into the Turn.
class TurnSink {
 public:
  virtual ~TurnSink() = default;
  virtual void Emit(cascade::v2::GenerateResponse event) = 0;
  // Last call: OK with the finish already emitted, or the status to end the RPC with (a finish
  // event with FINISH_REASON_ERROR and the usage so far is emitted before a mid-stream failure).
  virtual void TurnDone(const grpc::Status& status, const TurnResult& result) = 0;
};

struct TurnMetrics;  // defined in gateway_metrics.h
class Admission;     // admission.h
class RecentRoutes;  // recent_routes.h

struct TurnParams {
  cascade::v2::WorkerServiceGenerateRequest request;
  std::string request_id;
  std::vector<Scored> workers;  // candidates, best first
  std::vector<std::string> stop;
  std::chrono::system_clock::time_point deadline;
  int max_attempts = 3;
  // A worker that dies mid-stream is replaced by the next candidate, which re-prefills the
  // prompt plus the tokens emitted so far and continues. Greedy and seeded sampling continue
  // exactly (the sampler's random stream is per position), so the client sees one stream.
  bool resume_mid_stream = true;
  // Told each worker's time per output token and where the request's slot moves (admission.h;
  // the slot starts on workers[0]); may be null.
  Admission* admission = nullptr;
  // Told each worker the prompt is sent to, so requests routed in the next moments (a burst
  // sharing the prefix) count it as held there before the registry hears of it; may be null.
  RecentRoutes* recent = nullptr;
};

class Turn : public std::enable_shared_from_this<Turn> {
 public:
  // Starts the first attempt. `pool`, `tokenizer`, `sink` and `metrics` must outlive the turn's
  // TurnDone call.
  static std::shared_ptr<Turn> Start(TurnParams params, WorkerPool* pool,
                                     const tokenizer::Tokenizer& tokenizer, TurnSink* sink,
                                     TurnMetrics* metrics);
  // Cancels the worker stream (client cancel or disconnect); TurnDone follows with CANCELLED.
  void Cancel();

  Turn(TurnParams params, WorkerPool* pool, const tokenizer::Tokenizer& tokenizer, TurnSink* sink,
       TurnMetrics* metrics);
  ~Turn();

 private:
  class Upstream;
  friend class Upstream;

  // Sets up the next attempt (not yet started: callbacks may run inline in WorkerCall::Start,
  // so the caller starts it after releasing mu_), or reports failure when none is left.
  std::shared_ptr<Upstream> PrepareAttemptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns true when the worker stream should be cancelled (a stop string ended the turn).
  bool OnMessage(const cascade::v2::WorkerServiceGenerateResponse& msg);
  void OnUpstreamDone(const grpc::Status& status);
  std::shared_ptr<Upstream> FinishAttemptLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitDeltaLocked(cascade::v2::TokenDelta delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells params_.recent that request_'s chunks (those with the registry's hash, in order) go to
  // result_.worker_id.
  void NoteRecentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the turn's output as a worker's finish message does: the text's held-back tail, then
  // the finish event with `reason` and the usage.
  void EmitFinishLocked(cascade::v2::FinishReason reason, const std::string& stop_reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A token's text for its logprobs (TokenLogprob.text): its bytes when they are UTF-8 alone,
  // else "bytes:" and each byte as \xNN.
  std::string LogprobText(int32_t id) const;
  // `from` with each of its tokens' text (LogprobText), into `to`.
  void AddTexts(const cascade::v2::LogprobEntry& from, cascade::v2::LogprobEntry* to) const;
  cascade::v2::GenerateResponse FinishEvent(cascade::v2::FinishReason reason,
                                            const std::string& stop_reason) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Set at construction.
  const TurnParams params_;
  WorkerPool* const pool_;
  const tokenizer::Tokenizer& tokenizer_;
  TurnSink* const sink_;
  TurnMetrics* const metrics_;

  Mutex mu_;
  // What the next attempt sends (grows on resume). Changed only between attempts: the live
  // attempt's call reads it until its OnDone.
  cascade::v2::WorkerServiceGenerateRequest request_ ABSL_GUARDED_BY(mu_);
  size_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  // The live attempt; it also owns itself until its call's OnDone.
  std::shared_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool got_start_ ABSL_GUARDED_BY(mu_) = false;
  bool resumed_ ABSL_GUARDED_BY(mu_) = false;   // a later attempt continues an earlier one's stream
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // finish event emitted
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // TurnDone called
  std::unique_ptr<class TextStream> text_ ABSL_GUARDED_BY(mu_);
  TurnResult result_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point started_at_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_token_at_ ABSL_GUARDED_BY(mu_);
  bool first_token_seen_ ABSL_GUARDED_BY(mu_) = false;
  // Prompt logprobs relayed to the client, and those the live attempt has sent (an attempt after
  // a failure sends them from the start again: the ones relayed already are skipped).
  int64_t prompt_logprobs_relayed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prompt_logprobs_attempt_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cascade::gateway
