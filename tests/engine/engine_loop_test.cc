// The engine thread: outputs reach the right sink in order, cancel ends a stream with
// kCancelled, and stopping the loop ends every open stream (no caller waits forever) with
// UNAVAILABLE.
#include "gpu_worker/engine/engine_loop.h"

#include <gtest/gtest.h>

#include "common/mutex.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/trace_backend.h"

namespace cascade::engine::testing {
namespace {

// The fields are read by the test thread after Wait() returned true.
struct Collector {
  Mutex mu;
  CondVar cv;
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  absl::Status status;
  OutputSink Sink() {
    return [this](const SequenceOutput& o) {
      MutexLock lock(&mu);
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) {
        finished = true;
        reason = o.finish_reason;
        status = o.status;
        cv.SignalAll();
      }
    };
  }
  bool Wait(int ms = 5000) {
    MutexLock lock(&mu);
    return cv.WaitFor(&mu, std::chrono::milliseconds(ms), [&] { return finished; });
  }
};

std::unique_ptr<EngineLoop> MakeLoop() {
  EngineOptions o;
  o.model_name = "trace";
  auto loop =
      std::make_unique<EngineLoop>(NewEngine(o, std::make_unique<TraceBackend>(256, 8, 97)));
  loop->Start();
  return loop;
}

TEST(EngineLoopTest, EachSinkGetsItsOwnSequenceToTheEnd) {
  auto loop = MakeLoop();
  std::mt19937 rng(1);
  Collector a, b;
  Request ra = RandomRequest(rng, 97, 2, 10, 7), rb = RandomRequest(rng, 97, 1, 10, 5);
  ASSERT_TRUE(loop->Submit(ra, a.Sink()).ok());
  ASSERT_TRUE(loop->Submit(rb, b.Sink()).ok());
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.tokens.size(), 7u);
  EXPECT_EQ(b.tokens.size(), 5u);
  EXPECT_EQ(a.reason, FinishReason::kLength);
}

TEST(EngineLoopTest, CancelEndsTheStream) {
  auto loop = MakeLoop();
  std::mt19937 rng(2);
  Collector c;
  auto id = loop->Submit(RandomRequest(rng, 97, 1, 10, 2000), c.Sink());
  ASSERT_TRUE(id.ok());
  loop->Cancel(*id);
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.reason, FinishReason::kCancelled);
  EXPECT_TRUE(c.status.ok()) << "a client's cancel is not an error: " << c.status;
}

TEST(EngineLoopTest, StopEndsOpenStreams) {
  auto loop = MakeLoop();
  std::mt19937 rng(3);
  Collector c;
  ASSERT_TRUE(loop->Submit(RandomRequest(rng, 97, 1, 10, 2000), c.Sink()).ok());
  loop->Stop();
  ASSERT_TRUE(c.Wait(100));
  EXPECT_EQ(c.reason, FinishReason::kCancelled);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
}

TEST(EngineLoopTest, BadRequestIsRejectedWithoutASink) {
  auto loop = MakeLoop();
  Collector c;
  EXPECT_EQ(loop->Submit(Request{}, c.Sink()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cascade::engine::testing
