// Circuit breaker; see breaker.h.
#include "services/gateway/breaker.h"

#include <algorithm>

#include "common/log.h"

namespace cascade::gateway {

Breaker::Breaker(std::string name, Options options, NowFn now)
    : name_(std::move(name)),
      options_(options),
      now_(now ? std::move(now) : NowFn([] { return absl::Now(); })),
      backoff_(options.initial_backoff) {}

bool Breaker::Allow() {
  MutexLock lock(&mu_);
  if (!open_) return true;
  if (probing_ || now_() < until_) {
    ++skipped_;
    return false;
  }
  probing_ = true;
  return true;
}

void Breaker::Record(bool failed, const std::string& error) {
  MutexLock lock(&mu_);
  const bool probe = probing_;
  probing_ = false;
  if (!failed) {
    if (open_) {
      common::LogInfo("breaker_closed", {{"dependency", name_}, {"skipped", skipped_}});
    }
    open_ = false;
    backoff_ = options_.initial_backoff;
    skipped_ = 0;
    return;
  }
  // A call made before it opened (in flight with the one that opened it; the resolve timeout is
  // shorter than the backoff, so it ends before the probe starts) changes nothing; a failed
  // probe doubles the backoff.
  if (open_ && !probe) return;
  backoff_ = open_ ? std::min(2 * backoff_, options_.max_backoff) : options_.initial_backoff;
  until_ = now_() + backoff_;
  open_ = true;
  common::LogWarn("breaker_open", {{"dependency", name_},
                                   {"backoff_ms", absl::ToInt64Milliseconds(backoff_)},
                                   {"error", error}});
}

bool Breaker::open() const {
  MutexLock lock(&mu_);
  return open_;
}

}  // namespace cascade::gateway
