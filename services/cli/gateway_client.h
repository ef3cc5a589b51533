// Client calls the CLI makes: one streaming cascade.v2.GatewayService/Generate with client-side
// timing, ListModels, and cascade.v2.WorkerService/GetStats. Every call has a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "cascade/v2/worker.grpc.pb.h"
#include "common/transport.h"

namespace cascade::cli {

struct CallOptions {
  absl::Duration timeout = absl::Seconds(60);  // the RPC's deadline, from its start
  std::string bearer_token;                    // sent as "authorization: Bearer <token>"
  // RunGenerate cancels the call once this many tokens arrived (a client that stops reading);
  // the stream then ends CANCELLED. 0: never.
  int cancel_after_tokens = 0;
};

// What one Generate stream brought, plus timings measured here (the client side).
struct GenerateResult {
  bool got_start = false;
  v2::GenerateStart start;
  std::vector<int32_t> token_ids;  // all deltas' ids, in order
  std::string text;                // all deltas' text
  int deltas = 0;
  bool got_finish = false;
  v2::GenerateFinish finish;
  double ttft_ms = -1;              // call start -> first delta with a token; -1: none came
  double decode_tokens_per_s = -1;  // (tokens - 1) / (last token - first token); -1: n/a
  double total_ms = 0;
};

// Runs one Generate stream to its end. `on_event` (may be empty) sees every message as it
// arrives, on the calling thread. A non-OK stream status comes back as an absl::Status with the
// same code and a message naming the RPC, e.g. "Generate: UNAVAILABLE: ...". A stream that
// ends OK without a start or a finish is kInternal. Thread-safe (the stub is).
absl::StatusOr<GenerateResult> RunGenerate(
    v2::GatewayService::StubInterface& stub, const v2::GenerateRequest& request,
    const CallOptions& options,
    const std::function<void(const v2::GenerateResponse&)>& on_event = {});

absl::StatusOr<v2::ListModelsResponse> ListModels(v2::GatewayService::StubInterface& stub,
                                                  const CallOptions& options);
// Worker/GetStats is an admin RPC: `tls` presents the admin certificate (LocalStack::AdminTls).
absl::StatusOr<v2::WorkerServiceGetStatsResponse> GetWorkerStats(
    const std::string& worker_address, absl::Duration timeout, const common::ClientTlsOptions& tls);

// A plaintext channel to `address` with Cascade's client transport settings.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& address);

// "LENGTH" for FINISH_REASON_LENGTH, and so on.
std::string FinishReasonName(v2::FinishReason reason);
// One line: worker, prompt/cached/completion tokens, finish reason, TTFT and tokens/s.
std::string FormatSummary(const GenerateResult& result);
// grpc::Status -> absl::Status with the same code; the message starts with `rpc` and the code.
absl::Status FromGrpc(const grpc::Status& status, std::string_view rpc);

}  // namespace cascade::cli
