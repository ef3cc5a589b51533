// Closed-loop clients for one load phase; see load_runner.h.
#include "bench/service/load_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "services/cli/gateway_client.h"

namespace cascade::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Sends one request and turns what came back into a sample. Token arrival times are taken in
// the stream callback, as each message is read.
}  // namespace

RequestSample SendOne(v2::GatewayService::StubInterface& stub, const v2::GenerateRequest& request,
                      const cli::CallOptions& call, bool keep_tokens) {
  RequestSample sample;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last{};
  bool have_token = false;
  int64_t tokens = 0;
  absl::StatusOr<cli::GenerateResult> result =
      cli::RunGenerate(stub, request, call, [&](const v2::GenerateResponse& msg) {
        if (msg.has_start()) {
          sample.admitted = true;
          sample.worker_id = msg.start().worker_id();
        }
        if (!msg.has_delta() || msg.delta().token_ids_size() == 0) return;
        tokens += msg.delta().token_ids_size();
        if (keep_tokens) {
          sample.token_ids.insert(sample.token_ids.end(), msg.delta().token_ids().begin(),
                                  msg.delta().token_ids().end());
        }
        const Clock::time_point now = Clock::now();
        const int k = msg.delta().token_ids_size();
        if (!have_token) {
          sample.ttft_ms = Ms(now - t0);
          have_token = true;
          // The other tokens of the first delta arrived with it: gap 0.
          for (int i = 1; i < k; ++i) sample.itl_ms.push_back(0);
        } else {
          const double gap = Ms(now - last) / k;
          for (int i = 0; i < k; ++i) sample.itl_ms.push_back(gap);
        }
        last = now;
      });
  sample.e2e_ms = Ms(Clock::now() - t0);
  if (!result.ok()) {
    sample.error_code = absl::StatusCodeToString(result.status().code());
    sample.error_message = std::string(result.status().message());
    // RunGenerate cancels exactly when the count is reached; a CANCELLED before that is not ours.
    sample.cancelled = call.cancel_after_tokens > 0 && tokens >= call.cancel_after_tokens &&
                       result.status().code() == absl::StatusCode::kCancelled;
    return sample;
  }
  if (result->finish.finish_reason() == v2::FINISH_REASON_ERROR) {
    sample.error_code = "FINISH_ERROR";
    return sample;
  }
  sample.ok = true;
  sample.prompt_tokens = result->finish.usage().prompt_tokens();
  sample.cached_tokens = result->finish.usage().cached_tokens();
  sample.completion_tokens = result->finish.usage().completion_tokens();
  return sample;
}

namespace {

// 127.a.b.c with numeric parts (so a name such as "127.example.com" does not pass).
bool IsIpv4Loopback(const std::string& host) {
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (absl::string_view p : parts) {
    int v = 0;
    if (p.empty() || !absl::SimpleAtoi(p, &v) || v < 0 || v > 255) return false;
  }
  return true;
}

}  // namespace

PhaseSummary RunPhase(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                      const PhaseOptions& options, std::ostream* progress) {
  return RunPhaseWithSamples(stub, prompts, options, progress).summary;
}

RunPhaseResult RunPhaseWithSamples(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                                   const PhaseOptions& options, std::ostream* progress) {
  const std::string label =
      absl::StrFormat("%s c=%d", WorkloadName(options.workload), options.concurrency);
  PhaseRecorder recorder;
  std::atomic<int64_t> started{0};
  std::atomic<bool> hit_request_bound{false};
  std::atomic<int> running{options.concurrency};
  const cli::CallOptions call{options.request_timeout, options.bearer_token};
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point stop_at = t0 + absl::ToChronoNanoseconds(options.duration);

  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(options.concurrency));
  for (int c = 0; c < options.concurrency; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(c));
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      while (Clock::now() < stop_at) {
        if (started.fetch_add(1) >= options.max_requests) {
          hit_request_bound = true;
          break;
        }
        const int64_t index = prompts.NextIndex();
        if (options.pool == nullptr || options.pool->empty()) {
          recorder.Add(SendOne(stub, prompts.Make(options.workload, index), call, false));
          continue;
        }
        const size_t pick = rng() % options.pool->size();
        v2::GenerateRequest request = (*options.pool)[pick];
        request.set_request_id(absl::StrCat("soak-", options.seed, "-", index));
        cli::CallOptions this_call = call;
        const int max_tokens = request.sampling().max_tokens();
        if (max_tokens > 1 && unit(rng) < options.cancel_fraction) {
          this_call.cancel_after_tokens = 1 + static_cast<int>(rng() % (max_tokens - 1));
        }
        const double start_s = Ms(Clock::now() - t0) / 1000.0;
        RequestSample sample = SendOne(stub, request, this_call, true);
        sample.pool_index = static_cast<int64_t>(pick);
        sample.start_s = start_s;
        const bool refused = !sample.ok && !sample.admitted && !sample.cancelled;
        recorder.Add(std::move(sample));
        if (refused && options.reject_backoff > absl::ZeroDuration()) {
          const Clock::time_point resume = std::min(
              stop_at,
              Clock::now() + absl::ToChronoNanoseconds(options.reject_backoff * (0.5 + unit(rng))));
          std::this_thread::sleep_until(resume);
        }
      }
      running.fetch_sub(1);
    });
  }

  Clock::time_point next_line = t0 + absl::ToChronoNanoseconds(options.progress_interval);
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const Clock::time_point now = Clock::now();
    if (progress != nullptr && now >= next_line) {
      const double s = Ms(now - t0) / 1000.0;
      const int64_t done = recorder.finished();
      *progress << absl::StrFormat("  [%s] %5.1f s: %d finished (%d failed), %.2f req/s%s\n", label,
                                   s, done, recorder.failed(), done / s,
                                   now >= stop_at ? ", time bound reached, draining" : "")
                << std::flush;
      next_line += absl::ToChronoNanoseconds(options.progress_interval);
    }
  }
  for (std::thread& t : clients) t.join();
  const double wall_s = Ms(Clock::now() - t0) / 1000.0;
  PhaseSummary summary =
      recorder.Summarize(WorkloadName(options.workload), options.concurrency, wall_s);
  summary.stopped_by = hit_request_bound ? "requests" : "time";
  if (progress != nullptr) {
    *progress << absl::StrFormat("  [%s] done: %d requests in %.1f s (stopped by the %s bound)\n",
                                 label, summary.requests, wall_s,
                                 hit_request_bound ? "request" : "time")
              << std::flush;
  }
  return RunPhaseResult{std::move(summary), recorder.Samples()};
}

absl::Status CheckLoopback(const std::string& address) {
  std::string host;
  std::string port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", address, "': expected HOST:PORT"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", address, "'"));
  }
  if (host == "localhost" || host == "::1" || IsIpv4Loopback(host)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--gateway must be a loopback address (localhost, 127.x.x.x or [::1]), not '", address,
      "': this tool only loads deployments on this machine (use kubectl port-forward for a "
      "cluster)"));
}

}  // namespace cascade::bench
