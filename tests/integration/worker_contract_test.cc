// The worker's side of the gateway contract over real gRPC: the chunk hashes it is sent are
// checked against its own (a wrong one is refused INVALID_ARGUMENT naming the chunk, a right one
// is served), an unset max_tokens means the same whether a request enters through the gateway
// or straight at a worker, and a draining worker finishes its streams and refuses new ones as
// draining.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/chunk_hash.h"
#include "gpu_worker/engine/sampling_wire.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

struct WorkerReply {
  grpc::Status status;
  cascade::v2::WorkerStart start;
  std::vector<int32_t> tokens;
  cascade::v2::WorkerFinish finish;
  bool has_finish = false;
};

// `on_start` (optional) runs when the start message arrives.
WorkerReply CallWorker(const std::string& address,
                       const cascade::v2::WorkerServiceGenerateRequest& r,
                       const std::function<void()>& on_start = nullptr) {
  auto stub = WorkerStubAsGateway(address);
  if (stub == nullptr) return {};
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, r);
  WorkerReply out;
  cascade::v2::WorkerServiceGenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_start()) {
      out.start = m.start();
      if (on_start) on_start();
    }
    if (m.has_tokens()) {
      out.tokens.insert(out.tokens.end(), m.tokens().token_ids().begin(),
                        m.tokens().token_ids().end());
    }
    if (m.has_finish()) {
      out.finish = m.finish();
      out.has_finish = true;
    }
  }
  out.status = reader->Finish();
  return out;
}

std::string ModelName(Stack& stack) {
  grpc::ClientContext ctx;
  cascade::v2::ListModelsResponse models;
  EXPECT_TRUE(stack.gateway().ListModels(&ctx, {}, &models).ok());
  return models.models_size() > 0 ? models.models(0).name() : "";
}

// A two-chunk request on token ids; `hashes` (hex, may be empty) go on the chunks.
cascade::v2::WorkerServiceGenerateRequest TwoChunks(const std::vector<std::string>& hashes) {
  cascade::v2::WorkerServiceGenerateRequest r;
  r.set_request_id("hash-check");
  r.set_cache_salt("tenant-a");
  const std::vector<std::vector<int32_t>> tokens = {{10, 11, 12, 13, 14}, {20, 21, 22}};
  const cascade::v2::ChunkKind kinds[] = {cascade::v2::CHUNK_KIND_SYSTEM,
                                          cascade::v2::CHUNK_KIND_QUERY};
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto* c = r.add_chunks();
    c->set_kind(kinds[i]);
    c->mutable_token_ids()->Assign(tokens[i].begin(), tokens[i].end());
    if (i < hashes.size()) c->set_hash(hashes[i]);
  }
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(4);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

// The hashes as the registry computes them (the same library), for `salt`.
std::vector<std::string> HashesOf(const cascade::v2::WorkerServiceGenerateRequest& r,
                                  const std::string& model, const std::string& salt) {
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& c : r.chunks()) tokens.emplace_back(c.token_ids().begin(), c.token_ids().end());
  std::vector<hash::ChunkSpec> specs;
  for (int i = 0; i < r.chunks_size(); ++i) {
    specs.push_back(hash::ChunkSpec{r.chunks(i).kind(), tokens[i], ""});
  }
  std::vector<std::string> out;
  for (const auto& p : hash::PlaceChunks(model, salt, specs)) out.push_back(p.hash.ToHex());
  return out;
}

TEST(WorkerContractTest, AWorkerServesTheRightChunkHashesAndRefusesAWrongOne) {
  Stack stack({.workers = 1});
  const std::string model = ModelName(stack);
  ASSERT_FALSE(model.empty());
  const std::string worker = stack.worker(0).address();
  const std::vector<std::string> right = HashesOf(TwoChunks({}), model, "tenant-a");

  WorkerReply ok = CallWorker(worker, TwoChunks(right));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 4u);
  ASSERT_EQ(ok.start.chunks_size(), 2);
  EXPECT_EQ(ok.start.chunks(0).hash(), right[0]);
  EXPECT_EQ(ok.start.chunks(1).hash(), right[1]);

  // The same tokens' hashes under another salt: real hashes, but not of this prompt.
  const std::vector<std::string> other = HashesOf(TwoChunks({}), model, "tenant-b");
  WorkerReply wrong = CallWorker(worker, TwoChunks({right[0], other[1]}));
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(wrong.status.error_message().find("chunks[1].hash " + other[1] +
                                              " does not match the worker's hash " + right[1]),
            std::string::npos)
      << wrong.status.error_message();
  EXPECT_TRUE(wrong.tokens.empty());

  WorkerReply bad = CallWorker(worker, TwoChunks({"not-a-hash"}));
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.status.error_message().find("chunks[0].hash"), std::string::npos)
      << bad.status.error_message();

  // Hex in either case is the same hash; a chunk without one (a resumed stream's ASSISTANT
  // chunk, or a direct caller) is simply not checked.
  std::string upper = right[0];
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  WorkerReply partial = CallWorker(worker, TwoChunks({upper}));
  ASSERT_TRUE(partial.status.ok()) << partial.status.error_message();
  EXPECT_EQ(partial.tokens, ok.tokens);

  // Through the gateway every chunk carries the registry's hash, and the worker serves it.
  Reply r = Generate(stack.gateway(), Req("You are terse.", "Hi", 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
}

TEST(WorkerContractTest, APinTtlThatWouldOverflowInMillisecondsIsRefusedNamingTheField) {
  // Seconds become milliseconds on the engine's clock: INT64_MAX seconds overflowed (undefined
  // behaviour; in practice a pin that silently expired at once or was never taken).
  Stack stack({.workers = 1});
  const std::string worker = stack.worker(0).address();
  for (int64_t ttl : {std::numeric_limits<int64_t>::max(), int64_t{-5}}) {
    cascade::v2::WorkerServiceGenerateRequest r = TwoChunks({});
    r.set_pin_ttl_seconds(ttl);
    WorkerReply reply = CallWorker(worker, r);
    EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ttl;
    EXPECT_NE(reply.status.error_message().find("pin_ttl_seconds"), std::string::npos)
        << reply.status.error_message();
  }
  cascade::v2::WorkerServiceGenerateRequest ok = TwoChunks({});
  ok.set_pin_ttl_seconds(60);
  WorkerReply reply = CallWorker(worker, ok);
  EXPECT_TRUE(reply.status.ok()) << reply.status.error_message();
}

TEST(WorkerContractTest, UnsetMaxTokensMeansTheSameThroughTheGatewayAndStraightAtAWorker) {
  Stack stack({.workers = 1, .default_max_tokens = 0});
  cascade::v2::GenerateRequest via_gateway = Req("", "Count to many.", 1);
  via_gateway.mutable_sampling()->clear_max_tokens();
  Reply g = Generate(stack.gateway(), via_gateway);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH);
  EXPECT_EQ(g.finish.usage().completion_tokens(), worker::kDefaultMaxTokens);

  cascade::v2::WorkerServiceGenerateRequest direct = TwoChunks({});
  direct.mutable_sampling()->clear_max_tokens();
  WorkerReply w = CallWorker(stack.worker(0).address(), direct);
  ASSERT_TRUE(w.status.ok()) << w.status.error_message();
  ASSERT_TRUE(w.has_finish);
  EXPECT_EQ(w.finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH);
  EXPECT_EQ(w.finish.usage().completion_tokens(), worker::kDefaultMaxTokens);
  EXPECT_EQ(g.finish.usage().completion_tokens(), w.finish.usage().completion_tokens());
}

}  // namespace
}  // namespace cascade::testing

namespace cascade::testing {
namespace {

// A worker drained the way SIGTERM drains it lets the stream it is serving finish whole (every
// token and the finish, status OK) while its server still holds the connection, and refuses a
// new stream at once with UNAVAILABLE saying it is draining (which a gateway retries on another
// worker) instead of the server's generic refusal.
TEST(WorkerContractTest, ADrainingWorkerFinishesItsStreamAndRefusesNewOnesAsDraining) {
  Stack stack({.workers = 1});
  const std::string worker = stack.worker(0).address();
  cascade::v2::WorkerServiceGenerateRequest long_one = TwoChunks({});
  long_one.mutable_sampling()->set_max_tokens(300);  // seconds of decoding on the CPU

  absl::Notification started;
  WorkerReply in_flight;
  std::thread reader([&] {
    in_flight = CallWorker(worker, long_one, [&] { started.Notify(); });
    if (!started.HasBeenNotified()) started.Notify();  // it failed before starting
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));

  std::thread drain([&] { stack.DrainWorker(0, absl::Seconds(60)); });
  // The drain deregisters, then refuses new streams while the long one runs on.
  absl::SleepFor(absl::Milliseconds(300));
  WorkerReply refused = CallWorker(worker, TwoChunks({}));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("is draining"), std::string::npos)
      << refused.status.error_message();
  EXPECT_TRUE(refused.tokens.empty());

  reader.join();
  drain.join();
  ASSERT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens.size(), 300u);
  ASSERT_TRUE(in_flight.has_finish);
  EXPECT_EQ(in_flight.finish.finish_reason(), cascade::v2::FINISH_REASON_LENGTH);
}

}  // namespace
}  // namespace cascade::testing
