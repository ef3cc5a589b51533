// The project's lock type: annotated locks over the standard library's mutexes, and a condition
// variable that waits on them. Why not absl::Mutex / absl::CondVar: Debian's abseil is built
// without ThreadSanitizer, so TSan cannot see its happens-before edges and reports false races,
// while pthread-based std mutexes and condition variables are intercepted. The concurrency test
// under -DCASCADE_TSAN=ON depends on this. Clang's thread-safety analysis still applies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace cascade {

class CondVar;

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope: `MutexLock lock(&mu_);`.
template <typename M>
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(M* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  M* const mu_;
};

// A condition variable over cascade::Mutex (std::condition_variable underneath, so TSan sees it).
// The waits release `mu` while blocked and hold it again when they return; wakeups may be
// spurious, so callers re-check their condition (or use the predicate forms). Thread-safe.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's MutexLock unlocks it
  }
  // Waits until `done()` (called with `mu` held) is true.
  template <typename Pred>
  void Wait(Mutex* mu, Pred done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, std::move(done));
    lock.release();
  }
  // Returns false if `timeout` passed without a notification.
  bool WaitFor(Mutex* mu, std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool notified = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  // Waits until `done()` (called with `mu` held) is true or `timeout` passes; returns done().
  template <typename Pred>
  bool WaitFor(Mutex* mu, std::chrono::milliseconds timeout, Pred done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool result = cv_.wait_for(lock, timeout, std::move(done));
    lock.release();
    return result;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cascade
