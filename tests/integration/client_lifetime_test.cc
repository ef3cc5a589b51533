// The owners of callback-API client calls (the gateway's WorkerPool, the worker's PeerFetcher)
// outlive their calls, so a channel's last reference is never dropped inside one of its own
// callbacks: gRPC 1.51 corrupts memory there ("ref_counted.h: assertion failed: prior > 0", or a
// double free; common/client_calls.h). bad_day_test aborted that way in CI once, as a test tore
// its gateway down while the last worker call was still returning from OnDone.
//
// Each case fails on the code before the fix: the owner's destructor returned at once (the
// ordering checks), and destroying owners right after starting calls to a closed port aborts the
// process within a few hundred rounds (the stress cases; seen at every run of a stand-alone loop).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/client_calls.h"
#include "gpu_worker/service/peer_fetch.h"
#include "services/gateway/worker_pool.h"

namespace cascade::testing {
namespace {

using cascade::v2::WorkerServiceGenerateRequest;
using cascade::v2::WorkerServiceGenerateResponse;

// A worker whose streams stay open until released (or cancelled by the client).
class HoldingWorker final : public cascade::v2::WorkerService::Service {
 public:
  HoldingWorker() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~HoldingWorker() override {
    Release();
    server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int opened() const { return opened_; }
  void Release() { released_ = true; }

  grpc::Status Generate(grpc::ServerContext* ctx, const WorkerServiceGenerateRequest*,
                        grpc::ServerWriter<WorkerServiceGenerateResponse>*) override {
    return Hold(ctx);
  }
  grpc::Status FetchKv(grpc::ServerContext* ctx, const cascade::v2::FetchKvRequest*,
                       grpc::ServerWriter<cascade::v2::FetchKvResponse>*) override {
    return Hold(ctx);
  }

 private:
  grpc::Status Hold(grpc::ServerContext* ctx) {
    ++opened_;
    while (!released_ && !ctx->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "released");
  }

  int port_ = 0;
  std::atomic<int> opened_{0};
  std::atomic<bool> released_{false};
  std::unique_ptr<grpc::Server> server_;
};

void WaitUntil(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(done());
}

TEST(ClientCallsTest, WaitsForEveryTokenAndTimesOutWhileOneLives) {
  common::ClientCalls calls;
  EXPECT_TRUE(calls.WaitForNone(std::chrono::milliseconds(0)));
  auto a = std::make_unique<common::ClientCalls::Token>(calls.Add());
  common::ClientCalls::Token b = calls.Add();
  EXPECT_EQ(calls.live(), 2);
  EXPECT_FALSE(calls.WaitForNone(std::chrono::milliseconds(20)));
  common::ClientCalls::Token moved = std::move(b);  // a move is still one call
  EXPECT_EQ(calls.live(), 2);
  // Set before the last token goes, so the wait cannot return without seeing it.
  std::atomic<bool> first_released{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    a.reset();
    first_released = true;
    moved = common::ClientCalls::Token();  // assigning over a token releases it
  });
  EXPECT_TRUE(calls.WaitForNone(std::chrono::seconds(20)));
  EXPECT_TRUE(first_released);
  EXPECT_EQ(calls.live(), 0);
  t.join();
}

TEST(ClientCallsTest, WaitOrKeepKeepsTheChannelOnlyWhileACallLingers) {
  common::ClientCalls calls;
  auto channel = std::make_shared<int>(1);  // stands for what holds the channel
  std::weak_ptr<int> seen = channel;
  calls.WaitOrKeep(std::move(channel), "test", std::chrono::milliseconds(10));
  EXPECT_TRUE(seen.expired()) << "no call: the owner's reference was the last";
  common::ClientCalls::Token lingering = calls.Add();
  channel = std::make_shared<int>(2);
  seen = channel;
  calls.WaitOrKeep(std::move(channel), "test", std::chrono::milliseconds(10));
  EXPECT_FALSE(seen.expired()) << "a call still lives: the channel is kept for good";
}

// Records OnDone, and lingers in it so that a destructor that does not wait returns first.
class SlowObserver final : public gateway::WorkerCallObserver {
 public:
  bool OnMessage(const WorkerServiceGenerateResponse&) override { return true; }
  void OnDone(const grpc::Status& status) override {
    code = status.error_code();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    done = true;
  }
  std::atomic<grpc::StatusCode> code{grpc::StatusCode::OK};
  std::atomic<bool> done{false};
};

TEST(ClientLifetimeTest, TheWorkerPoolOutlivesItsCallsOnAnotherThread) {
  HoldingWorker worker;
  auto pool = std::make_unique<gateway::WorkerPool>(common::ClientChannelOptions{},
                                                    std::vector<std::string>{});
  WorkerServiceGenerateRequest req;
  SlowObserver observer;
  {
    auto handle = pool->Get(worker.address());
    ASSERT_NE(handle, nullptr);
    auto call = handle->client->Generate(
        req, {std::chrono::system_clock::now() + std::chrono::seconds(20), "lifetime-1"},
        &observer);
    call->Start();
  }  // the call keeps itself (and with its context, the channel) until OnDone
  WaitUntil([&] { return worker.opened() == 1; });
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    worker.Release();
  });
  pool.reset();  // waits for the call: its OnDone ran and returned before this returns
  EXPECT_TRUE(observer.done);
  EXPECT_EQ(observer.code, grpc::StatusCode::UNAVAILABLE);
  releaser.join();
}

// Counts OnDone.
class CountingObserver final : public gateway::WorkerCallObserver {
 public:
  explicit CountingObserver(std::atomic<int>* n) : n_(n) {}
  bool OnMessage(const WorkerServiceGenerateResponse&) override { return true; }
  void OnDone(const grpc::Status&) override { ++*n_; }

 private:
  std::atomic<int>* const n_;
};

TEST(ClientLifetimeTest, PoolsDestroyedRightAfterTheirCallsStartNeverCrash) {
  // A closed port: each call fails on its own, racing the pool's destruction.
  for (int round = 0; round < 300; ++round) {
    auto pool = std::make_unique<gateway::WorkerPool>(common::ClientChannelOptions{},
                                                      std::vector<std::string>{});
    WorkerServiceGenerateRequest req;
    std::atomic<int> done{0};
    CountingObserver observer(&done);
    auto handle = pool->Get("127.0.0.1:1");
    ASSERT_NE(handle, nullptr);
    for (int i = 0; i < 2; ++i) {
      handle->client
          ->Generate(req, {std::chrono::system_clock::now() + std::chrono::seconds(20), "r"},
                     &observer)
          ->Start();
    }
    handle.reset();
    pool.reset();
    EXPECT_EQ(done, 2);
  }
}

TEST(ClientLifetimeTest, ClientsEvictedWhileTheirCallsFinishNeverCrash) {
  // The pool lets go of a worker's client as soon as no attempt holds it (evict_after 0), while
  // its calls may still be returning from OnDone on gRPC's threads.
  gateway::WorkerPool pool(common::ClientChannelOptions{}, std::vector<std::string>{});
  pool.set_evict_after(std::chrono::seconds(0));
  WorkerServiceGenerateRequest req;
  std::atomic<int> done{0};
  CountingObserver observer(&done);
  for (int round = 0; round < 300; ++round) {
    auto handle = pool.Get("127.0.0.1:1");
    ASSERT_NE(handle, nullptr);
    handle->client
        ->Generate(req, {std::chrono::system_clock::now() + std::chrono::seconds(20), "r"},
                   &observer)
        ->Start();
    handle.reset();
    pool.Remember({});
    EXPECT_TRUE(pool.Clients().empty());
    EXPECT_EQ(done, round + 1);  // the eviction waited for the call
  }
}

worker::FetchPlan PlanFor(const std::string& address) {
  worker::FetchPlan p;
  p.address = address;
  p.model = "tiny";
  p.backend = "cpu";
  p.block_bytes = 64;
  p.block_size = 16;
  p.keys = {hash::Hash128{}};
  return p;
}

TEST(ClientLifetimeTest, ThePeerFetcherOutlivesItsFetches) {
  HoldingWorker holder;
  auto fetcher = std::make_unique<worker::PeerFetcher>(worker::PeerFetchOptions{});
  std::atomic<bool> done{false};
  fetcher->Fetch(PlanFor(holder.address()),
                 std::chrono::system_clock::now() + std::chrono::seconds(20),
                 [&](worker::FetchOutcome o) {
                   EXPECT_EQ(o.result, worker::FetchResult::kUnavailable) << o.detail;
                   std::this_thread::sleep_for(std::chrono::milliseconds(100));
                   done = true;
                 });
  WaitUntil([&] { return holder.opened() == 1; });
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    holder.Release();
  });
  fetcher.reset();
  EXPECT_TRUE(done);
  releaser.join();
}

TEST(ClientLifetimeTest, APeerChannelWithAFetchInFlightIsNeverEvicted) {
  HoldingWorker holder;
  worker::PeerFetcher fetcher(worker::PeerFetchOptions{});
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
  std::atomic<int> done{0};
  auto count = [&](worker::FetchOutcome) { ++done; };
  // "127.0.0.1:<port>" sorts before every "127.0.0.9:<n>": the first entry, first to go if
  // eviction ignored live fetches.
  fetcher.Fetch(PlanFor(holder.address()), deadline, count);
  WaitUntil([&] { return holder.opened() == 1; });
  const int n = static_cast<int>(worker::PeerFetcher::kMaxPeerChannels) + 8;
  for (int i = 0; i < n; ++i) {
    fetcher.Fetch(PlanFor("127.0.0.9:" + std::to_string(1000 + i)), deadline, count);
  }
  WaitUntil([&] { return done == n; });  // the closed ports have all failed
  std::vector<std::string> peers = fetcher.peers();
  EXPECT_EQ(peers.size(), worker::PeerFetcher::kMaxPeerChannels);
  ASSERT_FALSE(peers.empty());
  EXPECT_EQ(peers.front(), holder.address());
  holder.Release();
  WaitUntil([&] { return done == n + 1; });
}

TEST(ClientLifetimeTest, FetchersDestroyedRightAfterTheirFetchesStartNeverCrash) {
  for (int round = 0; round < 300; ++round) {
    auto fetcher = std::make_unique<worker::PeerFetcher>(worker::PeerFetchOptions{});
    std::atomic<int> done{0};
    for (int i = 0; i < 2; ++i) {
      fetcher->Fetch(PlanFor("127.0.0.1:1"),
                     std::chrono::system_clock::now() + std::chrono::seconds(20),
                     [&](worker::FetchOutcome) { ++done; });
    }
    fetcher.reset();
    EXPECT_EQ(done, 2);
  }
}

}  // namespace
}  // namespace cascade::testing
