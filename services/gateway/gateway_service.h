// The public cascade.v2.GatewayService service: validate, template, tokenize, resolve with the
// registry, route, relay. Generate and each Chat turn run as a Turn (turn.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache_service/client/registry_client.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/stream_gate.h"
#include "services/gateway/admission.h"
#include "services/gateway/breaker.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/prompt.h"
#include "services/gateway/recent_routes.h"
#include "services/gateway/router.h"
#include "services/gateway/turn.h"
#include "services/gateway/worker_pool.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::gateway {

struct GatewayOptions {
  PromptLimits limits;
  RouteWeights weights;
  int max_concurrent = 256;  // admitted + queued Generate streams and chat turns
  // Per-worker adaptive limits and the queue deadline (admission.h); its max_pending is
  // max_concurrent.
  AdmissionOptions admission;
  int max_attempts = 3;           // workers tried (before or after the first token)
  bool resume_mid_stream = true;  // continue on another worker if one dies mid-stream
  absl::Duration request_timeout = absl::Minutes(10);  // deadline when the client sets none
  std::string auth_token;  // non-empty: "authorization: Bearer <token>" required
  int64_t max_pin_ttl_s = 7 * 24 * 3600;
  // Prompts sent to a worker in the last route_recent_ms count as held by it when routing,
  // before the registry hears of them (recent_routes.h); 0 turns it off.
  int64_t route_recent_ms = 10000;
};

// Every public RPC is registered raw (ByteBuffer in and out) so that a request with invalid UTF-8
// gets INVALID_ARGUMENT naming the field instead of protobuf's opaque parse failure
// (raw_request.h). ListModels has no strings to check; health and reflection stay typed.
using GatewayBase = cascade::v2::GatewayService::WithCallbackMethod_ListModels<
    cascade::v2::GatewayService::WithRawCallbackMethod_Generate<
        cascade::v2::GatewayService::WithRawCallbackMethod_Chat<
            cascade::v2::GatewayService::WithRawCallbackMethod_Tokenize<
                cascade::v2::GatewayService::WithRawCallbackMethod_RegisterChunk<
                    cascade::v2::GatewayService::Service>>>>>;

class GatewayService final : public GatewayBase {
 public:
  // `registry` may be null (load-only routing over the pool's static workers). Not owned;
  // everything must outlive the service.
  GatewayService(GatewayOptions options, const tokenizer::Tokenizer* tokenizer,
                 registry::RegistryClient* registry, WorkerPool* pool, TurnMetrics* metrics);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Chat(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const cascade::v2::ListModelsRequest* request,
                                       cascade::v2::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* RegisterChunk(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

  // Shared by the reactors.
  grpc::Status CheckAuth(const grpc::CallbackServerContext* context) const;
  // Admission (admission.h): `done` gets the candidates with the worker that has room first,
  // on the admission thread, or RESOURCE_EXHAUSTED when none had room before the queue
  // deadline. Returns a ticket for CancelAdmission. The grant's slot goes back with Release.
  uint64_t Admit(std::vector<Scored> ranked, std::chrono::system_clock::time_point deadline,
                 Admission::Callback done);
  bool CancelAdmission(uint64_t ticket) { return admission_->Cancel(ticket); }
  void Release(const Grant& grant) { admission_->Release(grant.address); }
  Admission* admission() { return admission_.get(); }
  // A request's room while it is prepared and routed (Admission::TryHold): OK with *hold set,
  // or RESOURCE_EXHAUSTED (counted as rejected) when max_concurrent requests are admitted,
  // queued or being prepared. Release the hold just before Admit.
  grpc::Status HoldRoom(Admission::Hold* hold);
  // Candidates for a prompt, best first, given to `done`: registry matches when it answers,
  // else every known worker by load alone. `sticky` (chat) is tried first when it is among them.
  // When the registry answers, `request` (the prompt's worker request, if given; it must live
  // until `done`) gets its chunk hashes, which the worker checks. The registry is asked without
  // holding the calling thread (a gRPC reaction thread): `done` runs once, on a gRPC client
  // thread or inline (no registry, its breaker open, or in-process), and must not block.
  using RouteDone = absl::AnyInvocable<void(std::vector<Scored>) &&>;
  void Route(const Prompt& prompt, std::string sticky,
             cascade::v2::WorkerServiceGenerateRequest* request, RouteDone done);
  std::chrono::system_clock::time_point DeadlineFor(const grpc::CallbackServerContext* c) const;
  // A turn's parameters for `prompt` from the options and the call's deadline; the caller
  // adds the candidates once admitted.
  // Prompts sent to workers lately (turns note them; Route counts them as held).
  RecentRoutes& recent_routes() { return recent_; }
  TurnParams NewTurnParams(const Prompt& prompt, std::string request_id,
                           const grpc::CallbackServerContext* context);
  std::string NewRequestId();
  // Generate and Chat streams in flight (common/stream_gate.h): the handlers count a stream in
  // (EnterStream: false once draining) and its reactor leaves when its RPC is done.
  bool EnterStream() { return streams_.Enter(); }
  void LeaveStream() { streams_.Leave(); }
  // Drain, before the server stops: new Generate and Chat streams are refused UNAVAILABLE ("is
  // draining"; clients retry on another replica) and those in flight may finish until
  // `deadline`, plus a moment for their last frames to land.
  void DrainStreams(absl::Time deadline, absl::Duration linger = absl::Milliseconds(200)) {
    streams_.Drain(deadline, linger, "cascade-gateway");
  }

 private:
  grpc::Status DoTokenize(const cascade::v2::TokenizeRequest& request,
                          cascade::v2::TokenizeResponse* response);
  // Route's second half: `resolved` is the registry's answer, or null when it was not asked.
  std::vector<Scored> Rank(const absl::StatusOr<registry::ResolveResult>* resolved,
                           int64_t num_tokens, const std::string& sticky,
                           cascade::v2::WorkerServiceGenerateRequest* request);

 public:
  const GatewayOptions& options() const { return options_; }
  size_t max_request_bytes() const { return MaxRequestBytes(options_.limits); }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  WorkerPool* pool() { return pool_; }
  TurnMetrics* metrics() { return metrics_; }
  // The registry through its breaker (breaker.h): false while calls to it are skipped (the
  // caller routes without it); after a true, RegistryDone reports the call's status.
  bool RegistryAllow();
  void RegistryDone(const absl::Status& status);

 private:
  const GatewayOptions options_;
  const tokenizer::Tokenizer* const tokenizer_;
  registry::RegistryClient* const registry_;
  WorkerPool* const pool_;
  TurnMetrics* const metrics_;
  std::unique_ptr<Admission> admission_;
  RecentRoutes recent_;
  Breaker registry_breaker_{"registry", {}};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> route_ticket_{0};  // numbers requests for --route_policy round_robin/random
  common::StreamGate streams_;
};

using common::ToGrpc;

}  // namespace cascade::gateway
