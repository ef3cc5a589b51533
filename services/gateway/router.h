// Chooses the worker for a request. Each candidate gets a cost in "tokens of work":
//
//   cost = prefill_weight * (prompt_tokens - held_tokens)           prefill it would have to do
//        + host_weight    * matched_host_tokens                      copying what it holds only
//                                                                    in host memory to the GPU
//        + load_weight    * (running + waiting + gateway_inflight)   queue it would wait behind
//        + kv_weight      * used_kv_fraction^2                       memory pressure (evictions
//                                                                    and preemptions ahead)
//
// held_tokens is the most of the prompt the registry says it holds (matched_tokens) or this
// gateway sent it within --route_recent_ms (routed_tokens: the registry hears of a prompt's
// blocks only once they are prefilled, so a burst sharing a new prefix would otherwise spread).
//
// Peer fetch (when configured: RouteWeights::fetch > 0): a candidate that holds less of the prompt
// than another worker may pull the difference from that holder instead of prefilling it. For the
// holder p that saves it the most, the fetched tokens cost
//
//   prefill_weight * (fetch * fetched_tokens + fetch_overhead)  +  fetch_holder * holder_load
//
// instead of prefill_weight * fetched_tokens, where `fetch` is the measured time to move one
// token's KV over the time to prefill one (prefill tokens/s x KV bytes per token / fetch
// bandwidth, gateway flags), `fetch_overhead` a fetch's fixed cost in prefill tokens, and the
// holder's load (running + waiting + this gateway's streams to it) slows its export, which runs
// between its engine steps. An overloaded holder is never fetched from, nor one whose KV numerics
// (as registered; Backend::KvNumerics) or block size differ from the candidate's, since it would
// refuse the fetch; when either side's value is unknown the fetch may be planned and the holder's
// own check decides. The plan rides on the candidate (Scored::peer) and reaches that worker as
// WorkerServiceGenerateRequest.peer.
//
// and the cheapest wins (ties: fewer in flight, then id). With the defaults a worker holding a
// 1000-token prefix stays preferred until it has about 4 more sequences queued than an idle
// peer, so a hot prefix spreads once its holder is busy, and a miss goes to the least-loaded
// worker. `gateway_inflight` is this gateway's own count of open streams per worker: it reacts
// at once, while registry load is one heartbeat old. Workers at `max_waiting` or more queued
// requests are skipped while any other is below it.
//
// Other policies exist to measure the cost router against (`--route_policy`): `load` ranks by
// the load term alone (what a cache-blind balancer does), `round_robin` rotates over the workers
// by request, `random` shuffles them per request. All keep overloaded workers last.
//
// Several gateways agree: the rank is a function of the registry's answer (the same for every
// gateway) and of the gateway's own in-flight counts, so replicas send a prefix to the same
// holder until its load says to spill, and the worker the spill lands on then holds it too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cascade::gateway {

enum class RoutePolicy { kCost, kLoad, kRoundRobin, kRandom };

// "cost", "load", "round_robin", "random".
absl::StatusOr<RoutePolicy> ParseRoutePolicy(std::string_view text);
std::string_view RoutePolicyName(RoutePolicy policy);

struct RouteWeights {
  RoutePolicy policy = RoutePolicy::kCost;
  double prefill = 1.0;  // per uncached prompt token
  // Per matched token held only in the worker's host KV tier: a host-to-GPU copy instead of a
  // prefill. 0.2: restoring a block costs a fraction of computing it (docs/ARCHITECTURE.md).
  double host = 0.2;
  double load = 256.0;   // per sequence running or queued
  double kv = 512.0;     // scales used_kv_fraction^2
  int max_waiting = 64;  // a worker with this many queued is overloaded
  // Peer fetch (see above); fetch <= 0 turns it off. Set from measurement by the gateway's
  // --route_fetch_* flags (README, bench/service/RESULTS.md).
  double fetch = 0.0;
  double fetch_overhead = 0.0;  // prefill tokens
  double fetch_holder = 64.0;   // per sequence on the holder
};

struct Candidate {
  std::string worker_id;
  std::string address;
  int64_t matched_tokens = 0;  // prompt tokens it holds (registry), 0 if unknown
  int32_t running = 0;
  int32_t waiting = 0;
  int64_t free_kv_blocks = 0;
  int64_t total_kv_blocks = 0;      // 0: unknown
  int32_t inflight = 0;             // this gateway's open streams to it
  int64_t matched_host_tokens = 0;  // of matched_tokens, those only in its host KV tier
  std::string kv_numerics;          // its backend's KV numerics (registry); empty if unknown
  int32_t block_size = 0;           // tokens per KV block (registry); <= 0 if unknown
  // Prompt tokens this gateway sent it lately that the registry may not report yet
  // (recent_routes.h): counted as held for its own prefill, never as a holder to fetch from.
  int64_t routed_tokens = 0;
};

// A holder to fetch the prompt's prefix from.
struct PeerPlan {
  std::string worker_id;  // empty: no fetch
  std::string address;
  int64_t tokens = 0;  // leading prompt tokens it holds
};

struct Scored {
  Candidate candidate;
  double cost = 0.0;
  PeerPlan peer;  // set when fetching from it is cheaper than prefilling (kCost only)
};

// Candidates ordered best first (the caller tries them in order on failure). `ticket` numbers
// the request (a counter per gateway): round_robin rotates by it, random seeds its shuffle with
// it; the cost and load policies ignore it.
std::vector<Scored> RankWorkers(const std::vector<Candidate>& candidates, int64_t prompt_tokens,
                                const RouteWeights& weights, uint64_t ticket = 0);

}  // namespace cascade::gateway
