// Persistent workers woken per ParallelFor through a generation counter, so a decode step's few
// dozen parallel sections cost microseconds each instead of thread creations.
#include "gpu_worker/backend/cpu/thread_pool.h"

#include <algorithm>

namespace cascade::cpu {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

// Part `index` of the current job: chunks of `grain` dealt out contiguously.
void ThreadPool::RunPart(int index) {
  int64_t chunks = (n_ + grain_ - 1) / grain_;
  int64_t c0 = chunks * index / parts_, c1 = chunks * (index + 1) / parts_;
  int64_t begin = c0 * grain_, end = std::min(n_, c1 * grain_);
  if (begin < end) (*fn_)(begin, end);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      MutexLock lock(&mu_);
      work_cv_.Wait(
          &mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= parts_) continue;  // not needed for this job
    }
    RunPart(index);
    MutexLock lock(&mu_);
    if (--pending_ == 0) done_cv_.Signal();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t chunks = (n + grain - 1) / grain;
  int parts = static_cast<int>(std::min<int64_t>(size(), chunks));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
  }
  work_cv_.SignalAll();
  RunPart(0);
  MutexLock lock(&mu_);
  done_cv_.Wait(&mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
}

}  // namespace cascade::cpu
