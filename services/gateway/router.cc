// Routing cost; see router.h for the rule.
#include "services/gateway/router.h"

#include <algorithm>

namespace cascade::gateway {

std::vector<Scored> RankWorkers(const std::vector<Candidate>& candidates, int64_t prompt_tokens,
                                const RouteWeights& w) {
  std::vector<Scored> out;
  bool any_below = false;
  for (const Candidate& c : candidates) any_below |= c.waiting < w.max_waiting;
  for (const Candidate& c : candidates) {
    const int64_t uncached = std::max<int64_t>(0, prompt_tokens - c.matched_tokens);
    double used = 0.0;
    if (c.total_kv_blocks > 0) {
      used = 1.0 - static_cast<double>(c.free_kv_blocks) / static_cast<double>(c.total_kv_blocks);
    }
    Scored s{c, w.prefill * static_cast<double>(uncached) +
                    w.load * static_cast<double>(c.running + c.waiting + c.inflight) +
                    w.kv * used * used};
    // Overloaded workers go last (still usable when every worker is overloaded).
    if (any_below && c.waiting >= w.max_waiting) s.cost += 1e18;
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.candidate.inflight != b.candidate.inflight) return a.candidate.inflight < b.candidate.inflight;
    return a.candidate.worker_id < b.candidate.worker_id;
  });
  return out;
}

}  // namespace cascade::gateway
