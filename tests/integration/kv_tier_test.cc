// The host KV tier through the whole stack: a system prompt the worker's GPU tier evicted is
// reported to the registry as held in host memory (Resolve counts those tokens as host tokens,
// GetChunk shows the holder's tier), the next request for it is served by restoring it (cached
// tokens, the worker's host counters) with exactly the tokens of the first, and the registry
// sees it back on the GPU. RegisterChunk's eviction hints are checked at the gateway.
#include <gtest/gtest.h>

#include <string>

#include "cascade/v2/worker.grpc.pb.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

registry::KvTier HolderTier(registry::Registry& r, const hash::Hash128& h) {
  absl::StatusOr<registry::ChunkRecord> rec = r.GetChunk(h);
  if (!rec.ok() || rec->holders.empty()) return registry::KvTier{0};
  return rec->holders[0].tier;
}

TEST(KvTierTest, EvictedPrefixIsRestoredFromHostMemoryWithTheSameTokens) {
  StackOptions o;
  o.workers = 1;
  o.kv_blocks = 20;  // 320 tokens: one long system prompt at a time
  o.host_kv_bytes = 64 << 20;
  Stack stack(o);
  const std::string sys_a = LongSystemPrompt();
  const std::string sys_b = "Tenant B. " + LongSystemPrompt();
  Reply first = Generate(stack.gateway(), Req(sys_a, "What is Cascade?"));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_GT(first.start.chunks_size(), 0);
  const std::optional<hash::Hash128> ha = hash::Hash128::FromHex(first.start.chunks(0).hash());
  ASSERT_TRUE(ha.has_value());
  ASSERT_TRUE(
      WaitFor([&] { return HolderTier(*stack.registry(), *ha) == registry::KvTier::kGpu; }));

  ASSERT_TRUE(Generate(stack.gateway(), Req(sys_b, "And tenant B?")).status.ok());
  ASSERT_TRUE(WaitFor([&] {
    return HolderTier(*stack.registry(), *ha) == registry::KvTier::kHost;
  })) << "the registry never learned that the prefix moved to host memory";
  cascade::v2::GenerateRequest again_req = Req(sys_a, "What is Cascade?");
  const int64_t sys_tokens = first.start.chunks(0).end() - first.start.chunks(0).start();
  EXPECT_GT(sys_tokens, 16);
  ASSERT_TRUE(stack.WaitForIdleLoad());

  Reply again = Generate(stack.gateway(), again_req);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GE(again.start.cached_tokens(), sys_tokens / 16 * 16);
  const cascade::v2::WorkerServiceGetStatsResponse st = stack.WorkerStats(0);
  EXPECT_GT(st.host_total_kv_blocks(), 0);
  EXPECT_GT(st.host_offloaded_blocks(), 0);
  EXPECT_GT(st.host_restored_blocks(), 0);
  EXPECT_GT(st.prefix_cache_hits_host(), 0);  // the rest may have stayed on the GPU
  EXPECT_TRUE(
      WaitFor([&] { return HolderTier(*stack.registry(), *ha) == registry::KvTier::kGpu; }));
}

TEST(KvTierTest, RegisterChunkChecksRetentionAndPassesHintsOn) {
  StackOptions o;
  o.workers = 1;
  Stack stack(o);
  cascade::v2::RegisterChunkRequest req;
  auto* c = req.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
  c->set_text(LongSystemPrompt());
  req.set_retention_seconds(-5);
  cascade::v2::RegisterChunkResponse resp;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stack.gateway().RegisterChunk(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("retention_seconds"), std::string::npos) << s.error_message();
  }
  req.set_retention_seconds(600);
  req.set_priority(3);
  grpc::ClientContext ctx;
  grpc::Status s = stack.gateway().RegisterChunk(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.worker_id(), "w0");
}

}  // namespace
}  // namespace cascade::testing
