// The gateway hashes nothing itself for a request: Route hands the registry's chunk hashes to the
// worker request (the worker checks them, tests/integration/worker_contract_test.cc), and without
// a registry answer the chunks go unhashed and the worker hashes alone.
#include <gtest/gtest.h>

#include "cache_service/client/registry_client.h"
#include "cache_service/registry/registry.h"
#include "services/gateway/gateway_service.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::gateway {
namespace {

class RouteHashesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = tokenizer::testutil::Qwen3();
    ASSERT_NE(tok_, nullptr);
    options_.limits.model_name = "tiny";
    google::protobuf::RepeatedPtrField<cascade::v2::Chunk> chunks;
    for (auto [kind, text] : {std::pair{cascade::v2::CHUNK_KIND_SYSTEM, "You are terse."},
                              std::pair{cascade::v2::CHUNK_KIND_QUERY, "Hi"}}) {
      auto* c = chunks.Add();
      c->set_kind(kind);
      c->set_text(text);
    }
    chunks.Mutable(1)->set_cache_salt("private");
    auto p = BuildPrompt(chunks, {}, "tenant", true, *tok_, options_.limits);
    ASSERT_TRUE(p.ok()) << p.status();
    prompt_ = std::move(*p);
  }

  const tokenizer::Tokenizer* tok_ = nullptr;
  GatewayOptions options_;
  Prompt prompt_;
  WorkerPool pool_{[](const std::string&) { return nullptr; }, {"127.0.0.1:1"}};
  common::MetricsRegistry metrics_registry_;
  TurnMetrics metrics_{metrics_registry_};
};

TEST_F(RouteHashesTest, TheWorkerRequestGetsTheRegistrysChunkHashes) {
  registry::Registry reg{registry::RegistryOptions{}};
  std::unique_ptr<registry::RegistryClient> client = registry::NewInProcessRegistryClient(&reg);
  GatewayService svc(options_, tok_, client.get(), &pool_, &metrics_);
  cascade::v2::WorkerServiceGenerateRequest req = ToWorkerRequest(prompt_, "r1", "tiny");
  bool routed = false;  // the in-process registry answers inline
  svc.Route(prompt_, "", &req, [&](std::vector<Scored>) { routed = true; });
  ASSERT_TRUE(routed);
  const std::vector<hash::PlacedChunk> want =
      hash::PlaceChunks("tiny", "tenant", ChunkSpecs(prompt_));
  ASSERT_EQ(req.chunks_size(), static_cast<int>(want.size()));
  for (int i = 0; i < req.chunks_size(); ++i) {
    EXPECT_EQ(req.chunks(i).hash(), want[i].hash.ToHex()) << "chunk " << i;
  }
}

TEST_F(RouteHashesTest, WithoutARegistryTheChunksGoUnhashedAndRoutingUsesTheKnownWorkers) {
  GatewayService svc(options_, tok_, nullptr, &pool_, &metrics_);
  cascade::v2::WorkerServiceGenerateRequest req = ToWorkerRequest(prompt_, "r1", "tiny");
  std::vector<Scored> ranked;
  svc.Route(prompt_, "", &req, [&](std::vector<Scored> r) { ranked = std::move(r); });
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_EQ(ranked[0].candidate.address, "127.0.0.1:1");
  for (const auto& c : req.chunks()) EXPECT_TRUE(c.hash().empty());
}

}  // namespace
}  // namespace cascade::gateway
