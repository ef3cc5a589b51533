// The engine's errors reach a gRPC client of a worker with their codes: a prompt longer than the
// context is INVALID_ARGUMENT, one larger than the whole KV cache RESOURCE_EXHAUSTED at
// submission, and one refused in an engine step because pinned chunks hold the cache
// RESOURCE_EXHAUSTED as well (SequenceOutput::status, mapped by common::ToGrpc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cascade/v2/worker.grpc.pb.h"
#include "gpu_worker/service/worker_server.h"
#include "tests/integration/stack.h"

namespace cascade::testing {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  grpc::Status status;
  bool finished = false;  // a Finish message arrived
};

Outcome Generate(const std::string& address, int prompt_tokens, int max_tokens,
                 int64_t pin_ttl_seconds = 0, int32_t fill = 5) {
  auto stub = WorkerStubAsGateway(address);
  if (stub == nullptr) return {};
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  cascade::v2::WorkerServiceGenerateRequest req;
  auto* c = req.add_chunks();
  c->set_kind(cascade::v2::CHUNK_KIND_RAW);
  for (int i = 0; i < prompt_tokens; ++i) c->add_token_ids(fill);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.set_pin_ttl_seconds(pin_ttl_seconds);
  auto reader = stub->Generate(&ctx, req);
  Outcome o;
  cascade::v2::WorkerServiceGenerateResponse m;
  while (reader->Read(&m)) o.finished |= m.has_finish();
  o.status = reader->Finish();
  return o;
}

class WorkerStatusTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    worker::WorkerConfig w;
    w.server = TestServerOptions("cascade-worker");
    w.model_dir = TinyModelDir();
    w.backend = "cpu";
    w.kv_blocks = 8;                 // 8 x 16 = 128 tokens of KV
    w.max_pinned_kv_fraction = 1.0;  // pins may hold every block (the pinned-KV test)
    w.block_size = 16;
    w.max_context = 512;
    w.threads = 1;
    w.internal_auth = StackAuth(false, common::Role::kWorker, "w0");
    auto s = worker::WorkerServer::Start(w);
    ASSERT_TRUE(s.ok()) << s.status();
    worker_ = s->release();
  }
  static void TearDownTestSuite() {
    delete worker_;
    worker_ = nullptr;
  }
  static worker::WorkerServer* worker_;
};

worker::WorkerServer* WorkerStatusTest::worker_ = nullptr;

TEST_F(WorkerStatusTest, PromptLongerThanTheContextIsInvalidArgument) {
  Outcome o = Generate(worker_->address(), 600, 1);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << o.status.error_message();
  EXPECT_THAT(o.status.error_message(), HasSubstr("context length"));
}

TEST_F(WorkerStatusTest, PromptLargerThanTheKvCacheIsResourceExhausted) {
  Outcome o = Generate(worker_->address(), 200, 1);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << o.status.error_message();
  EXPECT_THAT(o.status.error_message(), HasSubstr("tokens of KV cache"));
}

TEST_F(WorkerStatusTest, KvHeldByPinnedChunksIsResourceExhaustedFromTheEngineStep) {
  // 113 tokens: seven full blocks stay pinned for a minute, one block is left.
  Outcome pinned = Generate(worker_->address(), 113, 1, /*pin_ttl_seconds=*/60, /*fill=*/3);
  ASSERT_TRUE(pinned.status.ok()) << pinned.status.error_message();
  EXPECT_TRUE(pinned.finished);
  // 40 tokens fit the cache but not the one block the pins leave: the engine admits the request,
  // then ends it in a step.
  Outcome o = Generate(worker_->address(), 40, 1);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << o.status.error_message();
  EXPECT_THAT(o.status.error_message(), HasSubstr("held by pinned chunks"));
  EXPECT_FALSE(o.finished) << "an error ends the stream with a status, not a Finish message";
  // The step's error left the worker serving: the pinned prompt itself still runs.
  Outcome again = Generate(worker_->address(), 113, 1, 0, 3);
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

}  // namespace
}  // namespace cascade::testing
