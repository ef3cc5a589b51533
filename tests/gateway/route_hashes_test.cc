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

// A prompt a worker just admitted counts as held there before the registry hears of it: the
// idle worker wins until the busier one is noted as having admitted the prompt; with
// --route_recent_ms 0 the note is ignored.
TEST_F(RouteHashesTest, APromptJustAdmittedCountsAsHeldBeforeTheRegistryKnows) {
  for (const int64_t recent_ms : {int64_t{10000}, int64_t{0}}) {
    registry::Registry reg{registry::RegistryOptions{}};
    for (const char* id : {"busy", "idle"}) {
      registry::WorkerInfo info{id, std::string(id) + ":1", "tiny", 1000, 16, 4096, 1000};
      ASSERT_TRUE(reg.RegisterWorker(info).ok());
    }
    ASSERT_TRUE(reg.Heartbeat("busy", registry::WorkerLoad{1, 0, 900, 1000}).ok());
    ASSERT_TRUE(reg.Heartbeat("idle", registry::WorkerLoad{0, 0, 900, 1000}).ok());
    std::unique_ptr<registry::RegistryClient> client = registry::NewInProcessRegistryClient(&reg);
    GatewayOptions o = options_;
    o.route_recent_ms = recent_ms;
    GatewayService svc(o, tok_, client.get(), &pool_, &metrics_);
    // A system chunk long enough (~600 tokens) that prefilling it outweighs one running sequence.
    google::protobuf::RepeatedPtrField<cascade::v2::Chunk> chunks_in;
    std::string system;
    for (int i = 0; i < 100; ++i) system += "You are terse and exact. ";
    for (auto [kind, text] : {std::pair{cascade::v2::CHUNK_KIND_SYSTEM, system},
                              std::pair{cascade::v2::CHUNK_KIND_QUERY, std::string("Hi")}}) {
      auto* c = chunks_in.Add();
      c->set_kind(kind);
      c->set_text(text);
    }
    auto prompt = BuildPrompt(chunks_in, {}, "", true, *tok_, options_.limits);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    ASSERT_GT(prompt->num_tokens, 400);
    auto route = [&](cascade::v2::WorkerServiceGenerateRequest* req) {
      std::vector<Scored> ranked;
      svc.Route(*prompt, "", req, [&](std::vector<Scored> r) { ranked = std::move(r); });
      EXPECT_FALSE(ranked.empty());
      return ranked.empty() ? std::string() : ranked[0].candidate.worker_id;
    };
    cascade::v2::WorkerServiceGenerateRequest req = ToWorkerRequest(*prompt, "r1", "tiny");
    EXPECT_EQ(route(&req), "idle");
    std::vector<RoutedChunk> chunks;
    int64_t end = 0;
    for (const auto& c : req.chunks()) {
      chunks.push_back({*hash::Hash128::FromHex(c.hash()), end += c.token_ids_size()});
    }
    svc.recent_routes().Note(chunks, "busy", RecentRoutes::NowMs());
    cascade::v2::WorkerServiceGenerateRequest again = ToWorkerRequest(*prompt, "r2", "tiny");
    EXPECT_EQ(route(&again), recent_ms > 0 ? "busy" : "idle") << "route_recent_ms " << recent_ms;
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
