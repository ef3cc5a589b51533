// The project's lock type: annotated locks over the standard library's mutexes. Why not
// absl::Mutex: Debian's abseil is built without ThreadSanitizer, so TSan cannot see its
// happens-before edges and reports false races, while pthread-based std mutexes are intercepted.
// The concurrency test under -DCASCADE_TSAN=ON depends on this. Clang's thread-safety analysis
// still applies.
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace cascade {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

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

}  // namespace cascade
