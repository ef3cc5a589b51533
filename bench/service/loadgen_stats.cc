// Percentiles and phase summaries for the load generator; see loadgen_stats.h.
#include "bench/service/loadgen_stats.h"

#include <algorithm>
#include <cmath>

namespace cascade::bench {

double NearestRank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // Rank ceil(q * n), 1-based; the epsilon keeps q * n that is an integer in floating point
  // (0.9 * 10 = 9.000000000000002) from moving up a rank.
  auto rank = static_cast<int64_t>(std::ceil(q * static_cast<double>(sorted.size()) - 1e-9));
  rank = std::clamp<int64_t>(rank, 1, static_cast<int64_t>(sorted.size()));
  return sorted[rank - 1];
}

Percentiles ComputePercentiles(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  Percentiles p;
  p.count = static_cast<int64_t>(values.size());
  p.p50 = NearestRank(values, 0.50);
  p.p90 = NearestRank(values, 0.90);
  p.p99 = NearestRank(values, 0.99);
  return p;
}

void PhaseRecorder::Add(RequestSample sample) {
  absl::MutexLock lock(&mu_);
  if (!sample.ok) ++failed_;
  samples_.push_back(std::move(sample));
}

int64_t PhaseRecorder::finished() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(samples_.size());
}

int64_t PhaseRecorder::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

std::vector<RequestSample> PhaseRecorder::Samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

PhaseSummary PhaseRecorder::Summarize(const std::string& workload, int concurrency,
                                      double wall_s) const {
  absl::MutexLock lock(&mu_);
  PhaseSummary s;
  s.workload = workload;
  s.concurrency = concurrency;
  s.wall_s = wall_s;
  s.requests = static_cast<int64_t>(samples_.size());
  std::vector<double> ttft, itl, e2e;
  int64_t completion = 0, prompt = 0;
  double cached_fraction_sum = 0;
  for (const RequestSample& r : samples_) {
    if (!r.ok) {
      const std::string code = r.error_code.empty() ? "UNKNOWN" : r.error_code;
      ++s.errors[code];
      if (!r.error_message.empty() && !s.error_examples.count(code)) {
        s.error_examples[code] = r.error_message.substr(0, kMaxErrorExample);
      }
      continue;
    }
    ++s.ok;
    if (r.ttft_ms >= 0) ttft.push_back(r.ttft_ms);
    if (r.e2e_ms >= 0) e2e.push_back(r.e2e_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    completion += r.completion_tokens;
    prompt += r.prompt_tokens;
    if (r.prompt_tokens > 0) {
      cached_fraction_sum +=
          static_cast<double>(r.cached_tokens) / static_cast<double>(r.prompt_tokens);
    }
  }
  if (s.ok > 0) {
    s.mean_prompt_tokens = static_cast<double>(prompt) / static_cast<double>(s.ok);
    s.mean_cached_fraction = cached_fraction_sum / static_cast<double>(s.ok);
  }
  if (wall_s > 0) {
    s.requests_per_s = static_cast<double>(s.ok) / wall_s;
    s.output_tokens_per_s = static_cast<double>(completion) / wall_s;
  }
  s.ttft_ms = ComputePercentiles(std::move(ttft));
  s.itl_ms = ComputePercentiles(std::move(itl));
  s.e2e_ms = ComputePercentiles(std::move(e2e));
  return s;
}

}  // namespace cascade::bench
