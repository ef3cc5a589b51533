// The cluster benchmark's load: open-loop Poisson arrivals at a target rate (requests arrive
// whether or not earlier ones finished, as independent users do), the customers workload, and
// what llm-d's comparison reports per rate: TTFT p50/p90/p99, inter-token latency, output
// tokens/s, prefix hit rate per worker and load imbalance. Closed-loop clients (load_runner.h)
// hide overload by slowing down with the server; arrivals at a fixed rate expose it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/service/loadgen_stats.h"
#include "bench/service/workload.h"
#include "cascade/v2/gateway.grpc.pb.h"

namespace cascade::bench {

struct OpenLoopOptions {
  double qps = 1.0;                             // mean arrival rate (Poisson)
  absl::Duration duration = absl::Seconds(30);  // no arrival after this
  int64_t max_requests = 1000;                  // arrivals at most
  int max_inflight = 512;  // a request arriving with this many open is counted CLIENT_BACKLOG
  absl::Duration request_timeout = absl::Seconds(60);
  absl::Duration progress_interval = absl::Seconds(2);
  std::string bearer_token;
  std::string policy;  // label for the report (the gateway's --route_policy)
  uint64_t seed = 1;   // arrival times
};

// Per worker, over a phase's ok requests.
struct WorkerShare {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
};

struct OpenLoopSummary {
  PhaseSummary phase;  // workload "customers"; concurrency 0
  std::string policy;
  double offered_qps = 0;
  std::map<std::string, WorkerShare> workers;  // by worker id
  // Requests of the busiest worker over the mean per worker (1.0: perfectly even). The mean is
  // over `expected_workers` when given, so a worker that got nothing counts.
  double imbalance = 0;
  double hit_rate = 0;  // cached / prompt tokens over all ok requests
};

// Summarises samples of one open-loop phase (also used by tests without servers).
OpenLoopSummary SummarizeOpenLoop(const std::vector<RequestSample>& samples,
                                  const OpenLoopOptions& options, double wall_s,
                                  int expected_workers);

// Runs one phase of the customers workload at `options.qps`. Each arrival runs on its own
// thread; the phase ends when every request has finished (each has a deadline).
OpenLoopSummary RunOpenLoop(v2::GatewayService::StubInterface& stub, PromptSource& prompts,
                            const OpenLoopOptions& options, int expected_workers,
                            std::ostream* progress);

// One table row per (policy, rate), then, per rate, each policy against the first one listed
// (the cost router): P90 TTFT and throughput ratios.
void PrintClusterReport(const std::vector<OpenLoopSummary>& runs, std::ostream& out);

}  // namespace cascade::bench
