#include "common/stream_gate.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/log.h"

namespace cascade::common {

bool StreamGate::Enter() {
  MutexLock lock(&mu_);
  if (draining_) return false;
  ++active_;
  return true;
}

void StreamGate::Leave() {
  MutexLock lock(&mu_);
  if (--active_ == 0) ended_.SignalAll();
}

void StreamGate::Drain(absl::Time deadline, absl::Duration linger, std::string_view server) {
  int in_flight;
  bool all_ended;
  {
    MutexLock lock(&mu_);
    draining_ = true;
    in_flight = active_;
    while (active_ > 0) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      ended_.WaitFor(&mu_, absl::ToChronoMilliseconds(std::min(left, absl::Milliseconds(100))) +
                               std::chrono::milliseconds(1));
    }
    all_ended = active_ == 0;
  }
  LogInfo("streams_drained",
          {{"server", std::string(server)}, {"in_flight", in_flight}, {"all_ended", all_ended}});
  // The statuses just sent are still on their way; closing the connections now could lose them.
  if (in_flight > 0 && all_ended) absl::SleepFor(std::min(linger, deadline - absl::Now()));
}

}  // namespace cascade::common
