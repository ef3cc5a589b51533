// A small persistent thread pool for the CPU backend: ParallelFor splits an index range into one
// contiguous part per participant. Callers only ever split independent outputs (rows, heads,
// output columns), never a reduction, so results do not depend on the number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace cascade::cpu {

class ThreadPool {
 public:
  // `num_threads` participants in total, the calling thread included (>= 1).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), each a multiple of `grain` long
  // except the last, and returns when all are done. Runs inline when one part suffices.
  // Thread safety: one ParallelFor at a time (the backend's Forward is single-threaded).
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunPart(int index);

  std::vector<std::thread> workers_;  // set at construction

  Mutex mu_;
  CondVar work_cv_;
  CondVar done_cv_;
  // The job of the current generation. A worker reads fn_, n_, grain_ and parts_ in RunPart
  // without mu_: they are written before the generation's signal and stay put until every part
  // is done (pending_ == 0).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  int parts_ = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cascade::cpu
