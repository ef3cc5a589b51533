// Backoff and crash-loop detection for supervised children; see restart_policy.h.
#include "services/cli/restart_policy.h"

#include <algorithm>

namespace cascade::cli {

std::string ValidateRestartOptions(const RestartOptions& o) {
  if (o.initial_backoff < absl::ZeroDuration()) return "--restart_backoff must not be negative";
  if (o.max_backoff < o.initial_backoff) {
    return "--restart_backoff_max must be at least --restart_backoff";
  }
  if (!(o.multiplier >= 1.0)) return "the backoff multiplier must be at least 1";
  if (o.stable_after <= absl::ZeroDuration()) return "--restart_stable_after must be positive";
  if (o.max_restarts < 0 || o.max_restarts > 1000) return "--max_restarts must be in [0, 1000]";
  return "";
}

void RestartPolicy::OnReady(absl::Time now) { ready_at_ = now; }

absl::Time RestartPolicy::OnDeath(absl::Time now) {
  const bool was_stable =
      ready_at_ != absl::InfinitePast() && now - ready_at_ >= options_.stable_after;
  ready_at_ = absl::InfinitePast();
  if (was_stable) quick_deaths_ = 0;
  ++quick_deaths_;
  if (quick_deaths_ > options_.max_restarts) {
    last_backoff_ = absl::InfiniteDuration();
    return absl::InfiniteFuture();
  }
  // initial * multiplier^(quick_deaths - 1), capped; computed stepwise so it cannot overflow.
  absl::Duration wait = options_.initial_backoff;
  for (int i = 1; i < quick_deaths_ && wait < options_.max_backoff; ++i) {
    wait = wait * options_.multiplier;
  }
  last_backoff_ = std::min(wait, options_.max_backoff);
  return now + last_backoff_;
}

}  // namespace cascade::cli
