// WorkerPool lets go of the clients of workers the registry stopped listing (after evict_after),
// but never of one an attempt holds, a --workers address or one listed again; it counts the
// clients it makes. Scripted clients: no network.
#include "services/gateway/worker_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/gateway/fake_worker.h"

namespace cascade::gateway::testing {
namespace {

using ::testing::ElementsAre;

Candidate Live(const std::string& address) { return Candidate{"w-" + address, address}; }

// A pool whose factory makes a FakeWorkerClient for any address and counts what it made.
struct CountingPool {
  explicit CountingPool(std::vector<std::string> statics = {})
      : pool(
            [this](const std::string&) -> std::unique_ptr<WorkerClient> {
              ++made;
              return std::make_unique<FakeWorkerClient>(&worker);
            },
            std::move(statics)) {}
  FakeWorker worker{"fake"};
  int made = 0;
  WorkerPool pool;
};

TEST(WorkerPoolTest, LetsGoOfWorkersNoLongerListedButNotOfOnesInUse) {
  CountingPool p;
  p.pool.set_evict_after(std::chrono::seconds(0));
  p.pool.Get("a");
  p.pool.Get("b");
  std::shared_ptr<WorkerHandle> held = p.pool.Get("c");  // an attempt in flight
  EXPECT_EQ(p.made, 3);
  p.pool.Remember({Live("a")});
  EXPECT_THAT(p.pool.Clients(), ElementsAre("a", "c"));
  held.reset();
  p.pool.Remember({Live("a")});
  EXPECT_THAT(p.pool.Clients(), ElementsAre("a"));
  // A worker back under an evicted address gets a new client; the listed one keeps its own.
  p.pool.Get("a");
  p.pool.Get("b");
  EXPECT_EQ(p.made, 4);
}

TEST(WorkerPoolTest, KeepsAWorkerMissingForLessThanEvictAfterAndTheStaticOnes) {
  CountingPool p({"s"});
  p.pool.Get("a");
  p.pool.Get("s");
  p.pool.Remember({});  // the default 5 minutes: a few missed heartbeats keep the channel
  EXPECT_THAT(p.pool.Clients(), ElementsAre("a", "s"));
  p.pool.set_evict_after(std::chrono::seconds(0));
  p.pool.Remember({});
  EXPECT_THAT(p.pool.Clients(), ElementsAre("s"));  // --workers stay
  EXPECT_EQ(p.made, 2);
}

}  // namespace
}  // namespace cascade::gateway::testing
