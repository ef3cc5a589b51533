// Generate streaming with client-side TTFT and decode rate; ListModels; Worker/GetStats.
#include "services/cli/gateway_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/transport.h"

namespace cascade::cli {
namespace {

void Prepare(grpc::ClientContext* ctx, const CallOptions& options) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  if (!options.bearer_token.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options.bearer_token);
  }
}

double MsSince(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status, std::string_view rpc) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  return absl::Status(code, absl::StrCat(std::string(rpc), ": ", absl::StatusCodeToString(code),
                                         ": ", status.error_message()));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& address) {
  return common::MakeChannel(address, common::ClientChannelOptions{});
}

std::string FinishReasonName(v2::FinishReason reason) {
  std::string name = v2::FinishReason_Name(reason);
  const std::string prefix = "FINISH_REASON_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return name.empty() ? absl::StrCat(static_cast<int>(reason)) : name;
}

absl::StatusOr<GenerateResult> RunGenerate(
    v2::GatewayService::StubInterface& stub, const v2::GenerateRequest& request,
    const CallOptions& options, const std::function<void(const v2::GenerateResponse&)>& on_event) {
  using Clock = std::chrono::steady_clock;
  GenerateResult result;
  grpc::ClientContext ctx;
  Prepare(&ctx, options);
  const Clock::time_point t0 = Clock::now();
  Clock::time_point first_token{}, last_token{};
  std::unique_ptr<grpc::ClientReaderInterface<v2::GenerateResponse>> reader =
      stub.Generate(&ctx, request);
  v2::GenerateResponse msg;
  bool cancelled = false;
  while (reader->Read(&msg)) {
    const Clock::time_point now = Clock::now();
    switch (msg.event_case()) {
      case v2::GenerateResponse::kStart:
        result.got_start = true;
        result.start = msg.start();
        break;
      case v2::GenerateResponse::kDelta:
        ++result.deltas;
        if (msg.delta().token_ids_size() > 0) {
          if (result.token_ids.empty()) first_token = now;
          last_token = now;
        }
        result.token_ids.insert(result.token_ids.end(), msg.delta().token_ids().begin(),
                                msg.delta().token_ids().end());
        result.text += msg.delta().text();
        if (options.cancel_after_tokens > 0 && !cancelled &&
            result.token_ids.size() >= static_cast<size_t>(options.cancel_after_tokens)) {
          ctx.TryCancel();
          cancelled = true;
        }
        break;
      case v2::GenerateResponse::kFinish:
        result.got_finish = true;
        result.finish = msg.finish();
        break;
      default:
        break;
    }
    if (on_event) on_event(msg);
  }
  grpc::Status status = reader->Finish();
  result.total_ms = MsSince(t0, Clock::now());
  if (!status.ok()) return FromGrpc(status, "Generate");
  if (!result.got_start || !result.got_finish) {
    return absl::InternalError(absl::StrCat("Generate: the stream ended OK without a ",
                                            result.got_start ? "finish" : "start",
                                            " message (a gateway bug)"));
  }
  if (!result.token_ids.empty()) {
    result.ttft_ms = MsSince(t0, first_token);
    double decode_s = MsSince(first_token, last_token) / 1000.0;
    if (result.token_ids.size() >= 2 && decode_s > 0) {
      result.decode_tokens_per_s = static_cast<double>(result.token_ids.size() - 1) / decode_s;
    }
  }
  return result;
}

absl::StatusOr<v2::ListModelsResponse> ListModels(v2::GatewayService::StubInterface& stub,
                                                  const CallOptions& options) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options);
  v2::ListModelsResponse response;
  grpc::Status status = stub.ListModels(&ctx, v2::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpc(status, "ListModels");
  return response;
}

absl::StatusOr<v2::WorkerServiceGetStatsResponse> GetWorkerStats(
    const std::string& worker_address, absl::Duration timeout,
    const common::ClientTlsOptions& tls) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = common::MakeChannel(worker_address, tls);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<v2::WorkerService::Stub> stub = v2::WorkerService::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v2::WorkerServiceGetStatsResponse stats;
  grpc::Status status = stub->GetStats(&ctx, v2::WorkerServiceGetStatsRequest(), &stats);
  if (!status.ok()) return FromGrpc(status, "Worker/GetStats " + worker_address);
  return stats;
}

std::string FormatSummary(const GenerateResult& r) {
  const v2::Usage& u = r.finish.usage();
  std::string ttft = r.ttft_ms >= 0 ? absl::StrFormat("%.1f", r.ttft_ms) : "-";
  std::string rate =
      r.decode_tokens_per_s >= 0 ? absl::StrFormat("%.1f", r.decode_tokens_per_s) : "-";
  return absl::StrFormat(
      "%s: prompt %d tokens (%d cached), completion %d tokens, finish %s, TTFT %s ms, "
      "%s tokens/s",
      r.start.worker_id(), u.prompt_tokens(), u.cached_tokens(), u.completion_tokens(),
      FinishReasonName(r.finish.finish_reason()), ttft, rate);
}

}  // namespace cascade::cli
