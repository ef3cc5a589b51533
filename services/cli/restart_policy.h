// When `cascade up` restarts a child that died: exponential backoff, bounded, reset once the
// child has stayed up for a while; and when it stops trying (a child that crash-loops).
// Plain C++ with the time passed in, so tests drive it without processes or sleeps.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace cascade::cli {

struct RestartOptions {
  absl::Duration initial_backoff = absl::Milliseconds(500);  // wait before the first restart
  absl::Duration max_backoff = absl::Seconds(30);            // the wait never grows beyond this
  double multiplier = 2.0;                                   // each quick death multiplies it
  // A child up (ready) at least this long is healthy again: its next death starts over from
  // initial_backoff and is not counted towards max_restarts.
  absl::Duration stable_after = absl::Seconds(30);
  // Restarts in a row, each of which died before stable_after (or never became ready), after
  // which the child is given up on. 0: never restart.
  int max_restarts = 5;
};

// Checks the options; the message names the `cascade up` flag at fault.
std::string ValidateRestartOptions(const RestartOptions& options);

// One child's restart bookkeeping. Thread-compatible.
class RestartPolicy {
 public:
  explicit RestartPolicy(RestartOptions options) : options_(options) {}

  // The child printed its ready line at `now`.
  void OnReady(absl::Time now);
  // The child died (or failed to start) at `now`. Returns the time to restart it, or
  // absl::InfiniteFuture() when it should be given up on.
  absl::Time OnDeath(absl::Time now);

  // Deaths in a row that count towards max_restarts (reset by a stable run).
  int quick_deaths() const { return quick_deaths_; }
  // The wait chosen by the last OnDeath (zero before any).
  absl::Duration last_backoff() const { return last_backoff_; }
  const RestartOptions& options() const { return options_; }

 private:
  RestartOptions options_;
  absl::Time ready_at_ = absl::InfinitePast();  // InfinitePast: not ready since the last death
  int quick_deaths_ = 0;
  absl::Duration last_backoff_ = absl::ZeroDuration();
};

}  // namespace cascade::cli
