// cascade::CondVar over cascade::Mutex: a signal wakes a waiter that then sees the guarded state,
// a timed wait with no signal times out, and the predicate forms return once the state holds.
#include "common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace cascade {
namespace {

using std::chrono::milliseconds;

TEST(CondVarTest, TimedWaitWithoutASignalTimesOut) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  const auto start = std::chrono::steady_clock::now();
  bool notified = true;
  // A spurious wakeup may end one wait early; no signal ever comes, so some wait times out.
  for (int i = 0; i < 10 && notified; ++i) notified = cv.WaitFor(&mu, milliseconds(20));
  EXPECT_FALSE(notified);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  EXPECT_FALSE(cv.WaitFor(&mu, milliseconds(5), [] { return false; }));
}

TEST(CondVarTest, SignalWakesAWaiterThatSeesTheGuardedState) {
  Mutex mu;
  CondVar cv;
  int value = 0;  // guarded by mu
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(10));
    {
      MutexLock lock(&mu);
      value = 42;
    }
    cv.SignalAll();
  });
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(cv.WaitFor(&mu, milliseconds(10000), [&] { return value == 42; }));
    EXPECT_EQ(value, 42);
  }
  producer.join();
}

TEST(CondVarTest, UntimedPredicateWaitReturnsOnceTheStateHolds) {
  Mutex mu;
  CondVar cv;
  int count = 0;  // guarded by mu
  std::thread producer([&] {
    for (int i = 0; i < 3; ++i) {
      {
        MutexLock lock(&mu);
        ++count;
      }
      cv.Signal();
    }
  });
  {
    MutexLock lock(&mu);
    cv.Wait(&mu, [&] { return count == 3; });
    EXPECT_EQ(count, 3);
  }
  producer.join();
  // The lock is usable afterwards: the waits left it held exactly once.
  MutexLock again(&mu);
  EXPECT_EQ(count, 3);
}

}  // namespace
}  // namespace cascade
