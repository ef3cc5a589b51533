// The gateway's Prometheus metrics, named as a vLLM user expects (cascade: prefix).
#pragma once

#include "common/metrics.h"

namespace cascade::gateway {

struct TurnMetrics {
  explicit TurnMetrics(common::MetricsRegistry& r)
      : running(r.GetGauge("cascade:gateway_requests_running",
                           "Generate streams and chat turns in flight.")),
        ttft(r.GetHistogram("cascade:time_to_first_token_seconds", "Time to first token.",
                            common::DefaultLatencyBuckets())),
        itl(r.GetHistogram("cascade:inter_token_latency_seconds", "Time between token messages.",
                           common::DefaultLatencyBuckets())),
        e2e(r.GetHistogram("cascade:e2e_request_latency_seconds", "Request latency.",
                           common::DefaultLatencyBuckets())),
        prompt_tokens(r.GetCounter("cascade:gateway_prompt_tokens_total",
                                   "Prompt tokens of routed requests.")),
        generation_tokens(
            r.GetCounter("cascade:gateway_generation_tokens_total", "Tokens relayed to clients.")),
        prefix_queries(r.GetCounter("cascade:gateway_prefix_cache_queries_total",
                                    "Prompt tokens looked up in workers' prefix caches.")),
        prefix_hits(r.GetCounter("cascade:gateway_prefix_cache_hits_total",
                                 "Prompt tokens served from workers' prefix caches.")),
        failovers(r.GetCounter("cascade:worker_failovers_total",
                               "Requests retried on another worker before their first token.")),
        resumes(
            r.GetCounter("cascade:worker_resumes_total",
                         "Streams continued on another worker after theirs failed mid-stream.")),
        rejected(r.GetCounter("cascade:requests_rejected_total",
                              "Requests refused by admission control.")),
        queue_wait(r.GetHistogram("cascade:gateway_queue_wait_seconds",
                                  "Time requests waited for a worker with room (admission).",
                                  common::DefaultLatencyBuckets())),
        registry_errors(r.GetCounter("cascade:registry_errors_total",
                                     "Resolve calls that failed (load-only routing used).")),
        registry_skipped(r.GetCounter(
            "cascade:registry_skipped_total",
            "Registry calls skipped while its breaker was open (load-only routing used).")),
        registry_(r) {}

  common::Counter* Finished(const std::string& reason) {
    return registry_.GetCounter("cascade:request_success_total", "Finished requests by reason.",
                                {{"finished_reason", reason}});
  }

  common::Gauge* running;
  common::Histogram* ttft;
  common::Histogram* itl;
  common::Histogram* e2e;
  common::Counter* prompt_tokens;
  common::Counter* generation_tokens;
  common::Counter* prefix_queries;
  common::Counter* prefix_hits;
  common::Counter* failovers;
  common::Counter* resumes;
  common::Counter* rejected;
  common::Histogram* queue_wait;
  common::Counter* registry_errors;
  common::Counter* registry_skipped;

 private:
  common::MetricsRegistry& registry_;
};

}  // namespace cascade::gateway
