// Runs one bounded load phase against a gateway over real gRPC: `concurrency` closed-loop clients
// (each sends its next request when the previous one ends) until the time bound or the request
// bound is reached, whichever comes first, with a progress line every few seconds.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bench/service/loadgen_stats.h"
#include "bench/service/workload.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "services/cli/gateway_client.h"

namespace cascade::bench {

struct PhaseOptions {
  Workload workload = Workload::kMiss;
  int concurrency = 1;
  absl::Duration duration = absl::Seconds(10);  // no new request starts after this
  int64_t max_requests = 1000;                  // requests started at most
  absl::Duration request_timeout = absl::Seconds(60);
  absl::Duration progress_interval = absl::Seconds(2);
  std::string bearer_token;
  // Pool mode (the soak): each request is a uniformly drawn copy of one of these (with a fresh
  // request id) instead of a fresh `workload` prompt, and its sample keeps the pool index, the
  // token ids and whether it was admitted. Not owned; must outlive RunPhase.
  const std::vector<v2::GenerateRequest>* pool = nullptr;
  // Fraction of requests the client cancels after a random number of tokens (1 .. max_tokens-1).
  double cancel_fraction = 0;
  // A client whose request was refused before it started (RESOURCE_EXHAUSTED, ...) waits a random
  // 0.5x..1.5x of this before its next one, as a well-behaved client backs off; 0: at once.
  absl::Duration reject_backoff = absl::ZeroDuration();
  uint64_t seed = 1;  // pool draws, cancels and backoff jitter
};

// Runs the phase and summarises it. Requests in flight at the time bound run to their end (each
// has a deadline of `request_timeout`), so the phase ends within duration + request_timeout.
// Progress lines go to `progress` (may be null). Thread-safe with respect to `stub` and `prompts`.
PhaseSummary RunPhase(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                      const PhaseOptions& options, std::ostream* progress);

// The same, also returning every request's sample (for checks beyond the summary: the soak).
struct RunPhaseResult {
  PhaseSummary summary;
  std::vector<RequestSample> samples;
};
RunPhaseResult RunPhaseWithSamples(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                                   const PhaseOptions& options, std::ostream* progress);

// Sends one request and turns what came back into a sample (token arrival times are taken as
// each message is read). `keep_tokens`: keep the token ids in the sample.
RequestSample SendOne(v2::GatewayService::StubInterface& stub, const v2::GenerateRequest& request,
                      const cli::CallOptions& call, bool keep_tokens);

// OK when `address` (HOST:PORT) names a loopback host: localhost, 127.0.0.0/8, or [::1].
absl::Status CheckLoopback(const std::string& address);

}  // namespace cascade::bench
