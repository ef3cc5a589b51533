// cascade-loadgen's pieces that need no server: percentiles, the phase summary, the prompts of the
// two workloads, the loopback check, and the report's tables.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/service/load_runner.h"
#include "bench/service/loadgen_stats.h"
#include "bench/service/open_loop.h"
#include "bench/service/report.h"
#include "bench/service/workload.h"

namespace cascade::bench {
namespace {

TEST(LoadgenStats, NearestRankPercentilesOfOneToHundred) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  Percentiles p = ComputePercentiles(v);
  EXPECT_EQ(p.count, 100);
  EXPECT_EQ(p.p50, 50);
  EXPECT_EQ(p.p90, 90);
  EXPECT_EQ(p.p99, 99);
}

TEST(LoadgenStats, PercentilesOfFewAndNoSamples) {
  Percentiles one = ComputePercentiles({7.5});
  EXPECT_EQ(one.p50, 7.5);
  EXPECT_EQ(one.p99, 7.5);
  Percentiles ten = ComputePercentiles({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(ten.p90, 9);  // rank ceil(0.9 * 10) = 9 exactly, not 10
  EXPECT_EQ(ten.p99, 10);
  Percentiles none = ComputePercentiles({});
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.p50, 0);
}

TEST(LoadgenStats, SummaryCountsOnlyOkRequestsInRatesAndGroupsErrorsByCode) {
  PhaseRecorder rec;
  RequestSample a;
  a.ok = true;
  a.ttft_ms = 10;
  a.itl_ms = {1, 2};
  a.prompt_tokens = 100;
  a.cached_tokens = 80;
  a.completion_tokens = 3;
  RequestSample b = a;
  b.ttft_ms = 30;
  b.cached_tokens = 0;
  RequestSample err;
  err.error_code = "UNAVAILABLE";
  err.error_message = "worker down";
  RequestSample err2 = err;
  err2.error_message = std::string(1000, 'x');  // only the first message per code is kept
  rec.Add(a);
  rec.Add(b);
  rec.Add(err);
  rec.Add(err2);
  EXPECT_EQ(rec.finished(), 4);
  EXPECT_EQ(rec.failed(), 2);
  PhaseSummary s = rec.Summarize("hit", 4, 2.0);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.ok, 2);
  EXPECT_DOUBLE_EQ(s.requests_per_s, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 3.0);
  EXPECT_DOUBLE_EQ(s.mean_cached_fraction, 0.4);  // (0.8 + 0) / 2
  EXPECT_EQ(s.ttft_ms.count, 2);
  EXPECT_EQ(s.ttft_ms.p50, 10);
  EXPECT_EQ(s.itl_ms.count, 4);
  EXPECT_EQ(s.errors.at("UNAVAILABLE"), 2);
  EXPECT_EQ(FormatErrors(s.errors), "UNAVAILABLE:2");
  EXPECT_EQ(s.error_examples.at("UNAVAILABLE"), "worker down");
}

TEST(LoadgenWorkload, HitSharesTheSystemChunkAndMissNeverDoes) {
  WorkloadOptions o;
  o.system_words = 50;
  o.run_tag = "t1";
  PromptSource prompts(o);
  const int64_t i = prompts.NextIndex(), j = prompts.NextIndex();
  EXPECT_NE(i, j);
  v2::GenerateRequest h1 = prompts.Make(Workload::kHit, i), h2 = prompts.Make(Workload::kHit, j);
  v2::GenerateRequest m1 = prompts.Make(Workload::kMiss, i), m2 = prompts.Make(Workload::kMiss, j);
  ASSERT_EQ(h1.chunks_size(), 2);
  EXPECT_EQ(h1.chunks(0).kind(), v2::CHUNK_KIND_SYSTEM);
  EXPECT_EQ(h1.chunks(0).text(), h2.chunks(0).text());
  EXPECT_NE(h1.chunks(1).text(), h2.chunks(1).text());
  EXPECT_NE(m1.chunks(0).text(), m2.chunks(0).text());
  // Distinct from the first words on, so not even the first KV block is shared.
  EXPECT_NE(m1.chunks(0).text().substr(0, 12), m2.chunks(0).text().substr(0, 12));
  EXPECT_NE(m1.chunks(0).text(), h1.chunks(0).text());
  EXPECT_TRUE(h1.sampling().ignore_eos());
  EXPECT_EQ(h1.sampling().max_tokens(), o.max_tokens);
  // Same length class: within 25% of each other in characters.
  const double ratio = static_cast<double>(m1.chunks(0).text().size()) /
                       static_cast<double>(h1.chunks(0).text().size());
  EXPECT_GT(ratio, 0.75);
  EXPECT_LT(ratio, 1.25);
  v2::RegisterChunkRequest warm = prompts.WarmRequest(60);
  ASSERT_EQ(warm.chunks_size(), 1);
  EXPECT_EQ(warm.chunks(0).text(), h1.chunks(0).text());
  EXPECT_EQ(warm.pin_ttl_seconds(), 60);
}

TEST(LoadgenWorkload, AnotherRunTagChangesTheSharedChunk) {
  WorkloadOptions a, b;
  a.run_tag = "a";
  b.run_tag = "b";
  EXPECT_NE(PromptSource(a).Make(Workload::kHit, 0).chunks(0).text(),
            PromptSource(b).Make(Workload::kHit, 0).chunks(0).text());
}

// The cluster workload: a customer's requests share its system and context chunks exactly and
// differ in the query; two customers share nothing; customers are drawn roughly evenly.
TEST(LoadgenWorkload, CustomersShareTheirOwnPrefixOnly) {
  WorkloadOptions o;
  o.customers = 5;
  o.system_words = 40;
  o.context_words = 80;
  o.run_tag = "t";
  PromptSource p(o);
  std::map<int, std::vector<v2::GenerateRequest>> by_customer;
  for (int64_t i = 0; i < 200; ++i)
    by_customer[p.CustomerOf(i)].push_back(p.Make(Workload::kCustomers, i));
  ASSERT_EQ(by_customer.size(), 5u);
  for (const auto& [c, reqs] : by_customer) {
    EXPECT_GT(reqs.size(), 15u) << c;
    ASSERT_EQ(reqs[0].chunks_size(), 3);
    EXPECT_EQ(reqs[0].chunks(1).kind(), v2::CHUNK_KIND_CONTEXT);
    for (const v2::GenerateRequest& r : reqs) {
      EXPECT_EQ(r.chunks(0).text(), reqs[0].chunks(0).text());
      EXPECT_EQ(r.chunks(1).text(), reqs[0].chunks(1).text());
    }
    EXPECT_NE(reqs[0].chunks(2).text(), reqs[1].chunks(2).text());
  }
  EXPECT_NE(by_customer[0][0].chunks(0).text(), by_customer[1][0].chunks(0).text());
  EXPECT_NE(by_customer[0][0].chunks(1).text(), by_customer[1][0].chunks(1).text());
}

TEST(LoadgenOpenLoop, SummaryCountsPerWorkerHitRateAndImbalance) {
  std::vector<RequestSample> samples;
  auto ok = [](std::string worker, int64_t prompt, int64_t cached) {
    RequestSample s;
    s.ok = true;
    s.worker_id = std::move(worker);
    s.prompt_tokens = prompt;
    s.cached_tokens = cached;
    s.completion_tokens = 4;
    s.ttft_ms = 10;
    return s;
  };
  samples.push_back(ok("a", 100, 100));
  samples.push_back(ok("a", 100, 50));
  samples.push_back(ok("a", 100, 0));
  samples.push_back(ok("b", 100, 90));
  RequestSample refused;
  refused.error_code = "CLIENT_BACKLOG";
  refused.error_message = "backlog";
  samples.push_back(refused);
  OpenLoopOptions o;
  o.qps = 2;
  o.policy = "cost";
  OpenLoopSummary s = SummarizeOpenLoop(samples, o, 2.0, /*expected_workers=*/3);
  EXPECT_EQ(s.phase.requests, 5);
  EXPECT_EQ(s.phase.ok, 4);
  EXPECT_EQ(s.phase.errors.at("CLIENT_BACKLOG"), 1);
  EXPECT_EQ(s.workers.at("a").requests, 3);
  EXPECT_EQ(s.workers.at("b").cached_tokens, 90);
  EXPECT_DOUBLE_EQ(s.hit_rate, 240.0 / 400.0);
  // Busiest 3 over a mean of 4 / 3 workers (the third got nothing and still counts).
  EXPECT_DOUBLE_EQ(s.imbalance, 3.0 / (4.0 / 3.0));
  std::ostringstream out;
  OpenLoopSummary other = s;
  other.policy = "random";
  other.phase.ttft_ms.p90 = 30;
  other.phase.ttft_ms.count = 4;
  s.phase.ttft_ms.p90 = 10;
  PrintClusterReport({s, other}, out);
  EXPECT_NE(out.str().find("| 2.00 | random | 3.00x |"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("- cost at 2.00 qps, CLIENT_BACKLOG x1: backlog"), std::string::npos)
      << out.str();
}

TEST(LoadgenLoopback, AcceptsOnlyLoopbackHosts) {
  EXPECT_TRUE(CheckLoopback("127.0.0.1:50051").ok());
  EXPECT_TRUE(CheckLoopback("127.1.2.3:1").ok());
  EXPECT_TRUE(CheckLoopback("localhost:8080").ok());
  EXPECT_TRUE(CheckLoopback("[::1]:50051").ok());
  EXPECT_FALSE(CheckLoopback("10.0.0.1:50051").ok());
  EXPECT_FALSE(CheckLoopback("127.example.com:50051").ok());
  EXPECT_FALSE(CheckLoopback("0.0.0.0:50051").ok());
  EXPECT_FALSE(CheckLoopback("[2001:db8::1]:50051").ok());
  EXPECT_FALSE(CheckLoopback("127.0.0.1").ok());
  EXPECT_FALSE(CheckLoopback("127.0.0.1:0").ok());
}

TEST(LoadgenReport, PrintsBothPhasesAndTheirRatios) {
  PhaseSummary miss, hit;
  miss.workload = "miss";
  hit.workload = "hit";
  miss.concurrency = hit.concurrency = 2;
  miss.ok = hit.ok = miss.requests = hit.requests = 10;
  miss.requests_per_s = 2;
  hit.requests_per_s = 3;
  miss.ttft_ms = {10, 100, 200, 300};
  hit.ttft_ms = {10, 25, 50, 75};
  std::ostringstream out;
  PrintReport({miss, hit}, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("| 2 | miss | 10 | 10 | 2.00 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| 2 | hit | 10 | 10 | 3.00 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| 2 | 1.50x |"), std::string::npos) << text;  // req/s ratio
  EXPECT_NE(text.find("| 0.25x |"), std::string::npos) << text;      // TTFT ratios
}

}  // namespace
}  // namespace cascade::bench
