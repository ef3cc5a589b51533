// What the load generator measures, as plain C++ (no gRPC): per-request samples, percentiles, and
// one phase's summary (throughput, TTFT and inter-token latency, cached fraction, errors by code).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cascade::bench {

// One finished request, as the client saw it.
struct RequestSample {
  bool ok = false;
  std::string error_code;     // "UNAVAILABLE", ...; empty when ok
  std::string error_message;  // the status message that came with it
  double ttft_ms = -1;        // request sent -> first delta carrying a token; -1: no token came
  // Gaps between token arrivals after the first token, one entry per token. A delta carrying k
  // tokens that arrives g ms after the previous one contributes k entries of g / k.
  std::vector<double> itl_ms;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  double e2e_ms = -1;     // request sent -> stream ended
  std::string worker_id;  // the worker the start message named; empty if none came
  // Set when the phase runs from a request pool (the soak): which request, whether the gateway
  // admitted it (a start message came), whether this client cancelled it on purpose, and the
  // token ids that arrived (also those before an error or a cancel).
  int64_t pool_index = -1;
  double start_s = -1;  // pool mode: seconds from the phase's start to sending the request
  bool admitted = false;
  bool cancelled = false;
  std::vector<int32_t> token_ids;
};

// Latency percentiles in milliseconds; zero when there were no samples.
struct Percentiles {
  int64_t count = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};

// Nearest-rank percentile (the smallest value with at least q of the samples at or below it).
// `sorted` must be ascending. REQUIRES: 0 < q <= 1. Returns 0 for an empty vector.
double NearestRank(const std::vector<double>& sorted, double q);
// Sorts a copy and takes p50/p90/p99.
Percentiles ComputePercentiles(std::vector<double> values);

// One phase (a workload at one concurrency), summarised.
struct PhaseSummary {
  std::string workload;  // "miss", "hit"
  int concurrency = 0;
  int64_t requests = 0;  // finished, ok or not
  int64_t ok = 0;
  double wall_s = 0;                // first request sent -> last request finished
  double requests_per_s = 0;        // ok requests / wall_s
  double output_tokens_per_s = 0;   // completion tokens of ok requests / wall_s
  double mean_prompt_tokens = 0;    // over ok requests
  double mean_cached_fraction = 0;  // mean over ok requests of cached / prompt tokens
  Percentiles ttft_ms;
  Percentiles itl_ms;
  Percentiles e2e_ms;
  std::map<std::string, int64_t> errors;  // by status code name
  // The first message seen for each code in `errors` (what refused: e.g. which admission limit),
  // cut to kMaxErrorExample bytes.
  std::map<std::string, std::string> error_examples;
  std::string stopped_by;  // "time", "requests"
};

inline constexpr size_t kMaxErrorExample = 240;

// Collects the samples of one phase from many client threads. Thread-safe.
class PhaseRecorder {
 public:
  void Add(RequestSample sample);
  // Counts so far, for progress lines.
  int64_t finished() const;
  int64_t failed() const;
  // A copy of every sample added so far.
  std::vector<RequestSample> Samples() const;
  // Summarises what was added. `wall_s` is the phase's measured duration.
  PhaseSummary Summarize(const std::string& workload, int concurrency, double wall_s) const;

 private:
  mutable absl::Mutex mu_;
  std::vector<RequestSample> samples_ ABSL_GUARDED_BY(mu_);
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cascade::bench
