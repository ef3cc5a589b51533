// Open-loop Poisson load and the cluster report; see open_loop.h.
#include "bench/service/open_loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/service/load_runner.h"
#include "bench/service/report.h"

namespace cascade::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Ms(const Percentiles& p, double v) {
  return p.count > 0 ? absl::StrFormat("%.0f", v) : "-";
}

std::string Ratio(double num, double den) {
  if (num <= 0 || den <= 0) return "-";
  return absl::StrFormat("%.2fx", num / den);
}

}  // namespace

OpenLoopSummary SummarizeOpenLoop(const std::vector<RequestSample>& samples,
                                  const OpenLoopOptions& options, double wall_s,
                                  int expected_workers) {
  PhaseRecorder recorder;
  OpenLoopSummary out;
  int64_t prompt = 0, cached = 0;
  for (const RequestSample& s : samples) {
    if (s.ok) {
      WorkerShare& w = out.workers[s.worker_id.empty() ? "?" : s.worker_id];
      ++w.requests;
      w.prompt_tokens += s.prompt_tokens;
      w.cached_tokens += s.cached_tokens;
      prompt += s.prompt_tokens;
      cached += s.cached_tokens;
    }
    recorder.Add(s);
  }
  out.phase = recorder.Summarize(WorkloadName(Workload::kCustomers), 0, wall_s);
  out.policy = options.policy;
  out.offered_qps = options.qps;
  out.hit_rate = prompt > 0 ? static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  int64_t total = 0, busiest = 0;
  for (const auto& [id, w] : out.workers) {
    total += w.requests;
    busiest = std::max(busiest, w.requests);
  }
  const int n = std::max<int>(expected_workers, static_cast<int>(out.workers.size()));
  if (total > 0 && n > 0) {
    out.imbalance = static_cast<double>(busiest) / (static_cast<double>(total) / n);
  }
  return out;
}

OpenLoopSummary RunOpenLoop(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                            const OpenLoopOptions& options, int expected_workers,
                            std::ostream* progress) {
  const std::string label = absl::StrFormat("%s %.2f qps", options.policy, options.qps);
  PhaseRecorder recorder;
  std::atomic<int> inflight{0};
  const cli::CallOptions call{options.request_timeout, options.bearer_token};
  std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ull + 7);
  std::exponential_distribution<double> gap(options.qps);
  std::vector<std::thread> requests;

  const Clock::time_point t0 = Clock::now();
  const Clock::time_point stop_at = t0 + absl::ToChronoNanoseconds(options.duration);
  Clock::time_point next = t0;
  Clock::time_point next_line = t0 + absl::ToChronoNanoseconds(options.progress_interval);
  int64_t arrivals = 0;
  auto report_progress = [&](bool draining) {
    const Clock::time_point now = Clock::now();
    if (progress == nullptr || now < next_line) return;
    *progress << absl::StrFormat("  [%s] %5.1f s: %d sent, %d open, %d finished (%d failed)%s\n",
                                 label, Seconds(now - t0), arrivals, inflight.load(),
                                 recorder.finished(), recorder.failed(),
                                 draining ? ", draining" : "")
              << std::flush;
    next_line += absl::ToChronoNanoseconds(options.progress_interval);
  };
  while (arrivals < options.max_requests) {
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    if (next >= stop_at) break;
    while (Clock::now() < next) {
      std::this_thread::sleep_until(std::min(next, Clock::now() + std::chrono::milliseconds(200)));
      report_progress(false);
    }
    ++arrivals;
    const int64_t index = prompts.NextIndex();
    if (inflight.load() >= options.max_inflight) {
      RequestSample refused;
      refused.error_code = "CLIENT_BACKLOG";
      refused.error_message = "the load generator's --max_inflight requests were in flight";
      recorder.Add(std::move(refused));
      continue;
    }
    inflight.fetch_add(1);
    requests.emplace_back([&, request = prompts.Make(Workload::kCustomers, index)] {
      recorder.Add(SendOne(stub, request, call, false));
      inflight.fetch_sub(1);
    });
  }
  while (inflight.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    report_progress(true);
  }
  for (std::thread& t : requests) t.join();
  const double wall_s = Seconds(Clock::now() - t0);
  OpenLoopSummary summary =
      SummarizeOpenLoop(recorder.Samples(), options, wall_s, expected_workers);
  summary.phase.stopped_by = arrivals >= options.max_requests ? "requests" : "time";
  if (progress != nullptr) {
    *progress << absl::StrFormat("  [%s] done: %d requests in %.1f s, %d failed\n", label,
                                 summary.phase.requests, wall_s,
                                 summary.phase.requests - summary.phase.ok)
              << std::flush;
  }
  return summary;
}

void PrintClusterReport(const std::vector<OpenLoopSummary>& runs, std::ostream& out) {
  out << "\n| policy | offered qps | requests | ok | out tok/s | TTFT p50 ms | TTFT p90 | TTFT p99 "
         "| ITL p50 ms | ITL p99 | hit rate | imbalance | per worker (requests, hit rate) | "
         "errors |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
         "| --- | --- |\n";
  for (const OpenLoopSummary& r : runs) {
    const PhaseSummary& p = r.phase;
    std::vector<std::string> workers;
    for (const auto& [id, w] : r.workers) {
      workers.push_back(absl::StrFormat(
          "%s %d %.2f", id, w.requests,
          w.prompt_tokens > 0 ? static_cast<double>(w.cached_tokens) / w.prompt_tokens : 0.0));
    }
    out << absl::StrFormat(
        "| %s | %.2f | %d | %d | %.1f | %s | %s | %s | %s | %s | %.3f | %.2f | %s "
        "| %s |\n",
        r.policy, r.offered_qps, p.requests, p.ok, p.output_tokens_per_s,
        Ms(p.ttft_ms, p.ttft_ms.p50), Ms(p.ttft_ms, p.ttft_ms.p90), Ms(p.ttft_ms, p.ttft_ms.p99),
        Ms(p.itl_ms, p.itl_ms.p50), Ms(p.itl_ms, p.itl_ms.p99), r.hit_rate, r.imbalance,
        absl::StrJoin(workers, ", "), FormatErrors(p.errors));
  }
  // What refused: the first message of each error code, per run.
  bool errors_header = false;
  for (const OpenLoopSummary& r : runs) {
    for (const auto& [code, message] : r.phase.error_examples) {
      if (!errors_header) {
        out << "\nErrors, the first message of each code:\n\n";
        errors_header = true;
      }
      // error_examples holds only codes that `errors` counts.
      out << absl::StrFormat("- %s at %.2f qps, %s x%d: %s\n", r.policy, r.offered_qps, code,
                             r.phase.errors.at(code), message);
    }
  }
  // Each policy against the first one run at the same rate (the cost router when it leads).
  bool header = false;
  for (const OpenLoopSummary& base : runs) {
    if (base.policy != runs.front().policy) continue;
    for (const OpenLoopSummary& other : runs) {
      if (other.policy == base.policy || other.offered_qps != base.offered_qps) continue;
      if (!header) {
        out << "\n"
            << runs.front().policy << " against the others at the same offered rate "
            << "(same run; > 1 means " << runs.front().policy << " is better):\n\n"
            << "| offered qps | against | TTFT p90 (theirs / ours) | TTFT p50 | output tok/s "
               "(ours / theirs) | hit rate (ours, theirs) |\n"
               "| ---: | --- | ---: | ---: | ---: | --- |\n";
        header = true;
      }
      out << absl::StrFormat("| %.2f | %s | %s | %s | %s | %.3f, %.3f |\n", base.offered_qps,
                             other.policy, Ratio(other.phase.ttft_ms.p90, base.phase.ttft_ms.p90),
                             Ratio(other.phase.ttft_ms.p50, base.phase.ttft_ms.p50),
                             Ratio(base.phase.output_tokens_per_s, other.phase.output_tokens_per_s),
                             base.hit_rate, other.hit_rate);
    }
  }
  out << "\nOpen loop: Poisson arrivals at the offered rate, whatever the server's pace. hit "
         "rate: cached / prompt tokens over ok requests. imbalance: the busiest worker's "
         "requests over the mean per worker (1.00 is even).\n"
      << std::flush;
}

}  // namespace cascade::bench
