// The real clock: unix-epoch scale, monotonic steps.
#include "cache_service/registry/clock.h"

#include <chrono>

namespace cascade::registry {
namespace {

class SteadyUnixClock final : public Clock {
 public:
  SteadyUnixClock()
      : unix_at_start_ms_(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count()),
        steady_start_(std::chrono::steady_clock::now()) {}

  int64_t NowMs() const override {
    auto elapsed = std::chrono::steady_clock::now() - steady_start_;
    return unix_at_start_ms_ +
           std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  }

 private:
  const int64_t unix_at_start_ms_;
  const std::chrono::steady_clock::time_point steady_start_;
};

}  // namespace

Clock* RealClock() {
  static Clock* clock = new SteadyUnixClock();  // never destroyed: used until exit
  return clock;
}

}  // namespace cascade::registry
