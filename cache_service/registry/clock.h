// Time source of the registry, injected so that lease and pin tests run on a fake clock.
#pragma once

#include <atomic>
#include <cstdint>

namespace cascade::registry {

// Milliseconds on a unix-epoch scale (leases and pins are shown to admins as unix ms).
// Thread-safe: implementations are called from many threads at once.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
};

// The process clock: unix time at first use, then advanced by the monotonic clock, so a wall
// clock step (NTP) cannot expire every lease at once. Never null; lives for the whole process.
Clock* RealClock();

// A clock tests move by hand.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(std::memory_order_relaxed); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace cascade::registry
