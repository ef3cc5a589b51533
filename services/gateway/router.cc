// Routing cost and the comparison policies; see router.h for the rules.
#include "services/gateway/router.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace cascade::gateway {

absl::StatusOr<RoutePolicy> ParseRoutePolicy(std::string_view text) {
  if (text == "cost") return RoutePolicy::kCost;
  if (text == "load") return RoutePolicy::kLoad;
  if (text == "round_robin") return RoutePolicy::kRoundRobin;
  if (text == "random") return RoutePolicy::kRandom;
  return absl::InvalidArgumentError("expected cost, load, round_robin or random");
}

std::string_view RoutePolicyName(RoutePolicy policy) {
  switch (policy) {
    case RoutePolicy::kCost:
      return "cost";
    case RoutePolicy::kLoad:
      return "load";
    case RoutePolicy::kRoundRobin:
      return "round_robin";
    case RoutePolicy::kRandom:
      return "random";
  }
  return "unknown";
}

namespace {

// What a worker's new request would queue behind: its running and waiting sequences (from its
// heartbeat, int32 each, so summed in double: two large reported counts cannot overflow) and this
// gateway's open streams to it.
double Queue(const Candidate& c) {
  return static_cast<double>(c.running) + static_cast<double>(c.waiting) +
         static_cast<double>(c.inflight);
}

// The holder `c` would best fetch from and what that saves, in cost units (<= 0: none).
double BestFetch(const Candidate& c, const std::vector<Candidate>& all, int64_t prompt_tokens,
                 const RouteWeights& w, PeerPlan* plan) {
  double best = 0.0;
  for (const Candidate& p : all) {
    if (p.worker_id == c.worker_id || p.waiting >= w.max_waiting) continue;
    // The holder refuses a receiver of other numerics (kv_serve.cc); unknown passes to that check.
    if (!p.kv_numerics.empty() && !c.kv_numerics.empty() && p.kv_numerics != c.kv_numerics) {
      continue;
    }
    // Likewise for block size: the holder's blocks would not line up with the receiver's (and its
    // check refuses them); a size <= 0 (an older registry) is unknown and passes.
    if (p.block_size > 0 && c.block_size > 0 && p.block_size != c.block_size) continue;
    // The worker computes the prompt's last token itself, so that one is never fetched.
    const int64_t fetched = std::min<int64_t>(p.matched_tokens, prompt_tokens - 1) -
                            std::max<int64_t>({c.matched_tokens, c.routed_tokens, 0});
    if (fetched <= 0) continue;
    const double cost = w.prefill * (w.fetch * static_cast<double>(fetched) + w.fetch_overhead) +
                        w.fetch_holder * Queue(p);
    const double saved = w.prefill * static_cast<double>(fetched) - cost;
    if (saved > best) {
      best = saved;
      *plan = PeerPlan{p.worker_id, p.address, p.matched_tokens};
    }
  }
  return best;
}

}  // namespace

std::vector<Scored> RankWorkers(const std::vector<Candidate>& candidates, int64_t prompt_tokens,
                                const RouteWeights& w, uint64_t ticket) {
  std::vector<Scored> out;
  bool any_below = false;
  for (const Candidate& c : candidates) any_below |= c.waiting < w.max_waiting;
  for (const Candidate& c : candidates) {
    const int64_t uncached =
        std::max<int64_t>(0, prompt_tokens - std::max(c.matched_tokens, c.routed_tokens));
    double used = 0.0;
    if (c.total_kv_blocks > 0) {
      used = 1.0 - static_cast<double>(c.free_kv_blocks) / static_cast<double>(c.total_kv_blocks);
    }
    const double load = w.load * Queue(c);
    Scored s{c, 0.0};
    switch (w.policy) {
      case RoutePolicy::kCost:
        s.cost = w.prefill * static_cast<double>(uncached) +
                 w.host * static_cast<double>(
                              std::clamp<int64_t>(c.matched_host_tokens, 0, c.matched_tokens)) +
                 load + w.kv * used * used;
        if (w.fetch > 0) s.cost -= BestFetch(c, candidates, prompt_tokens, w, &s.peer);
        break;
      case RoutePolicy::kLoad:
        s.cost = load;
        break;
      case RoutePolicy::kRoundRobin:
      case RoutePolicy::kRandom:
        break;  // ordered below
    }
    out.push_back(std::move(s));
  }
  // Ties and the order-only policies start from a fixed order, so the result does not depend
  // on the order the registry listed the workers in.
  std::sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) {
    return a.candidate.worker_id < b.candidate.worker_id;
  });
  if (!out.empty() && w.policy == RoutePolicy::kRoundRobin) {
    std::rotate(out.begin(), out.begin() + static_cast<long>(ticket % out.size()), out.end());
    for (size_t i = 0; i < out.size(); ++i) out[i].cost = static_cast<double>(i);
  } else if (w.policy == RoutePolicy::kRandom) {
    std::mt19937_64 rng(ticket * 0x9e3779b97f4a7c15ull + 1);
    std::shuffle(out.begin(), out.end(), rng);
    for (size_t i = 0; i < out.size(); ++i) out[i].cost = static_cast<double>(i);
  }
  // Overloaded workers go last (still usable when every worker is overloaded).
  for (Scored& s : out) {
    if (any_below && s.candidate.waiting >= w.max_waiting) s.cost += 1e18;
  }
  std::stable_sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    return a.candidate.inflight < b.candidate.inflight;
  });
  return out;
}

}  // namespace cascade::gateway
