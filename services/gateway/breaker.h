// A circuit breaker for a dependency that fails slowly: the gateway's registry Resolve runs on
// a gRPC reaction thread, so a registry that hangs (alive, answering nothing) would hold a thread
// for the whole resolve timeout on every request, and the gateway's token relay with it. After a
// failure the calls are skipped (the caller uses its fallback: load-only routing) for a backoff,
// 1 s doubling up to 5 s while the failures go on (so routing by prefix resumes within 5 s of
// the registry's return); when it ends one call probes while the others keep skipping; a
// success closes the breaker. Thread-safe.
#pragma once

#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace cascade::gateway {

class Breaker {
 public:
  struct Options {
    absl::Duration initial_backoff = absl::Seconds(1);
    absl::Duration max_backoff = absl::Seconds(5);
  };
  using NowFn = std::function<absl::Time()>;

  // `name` goes into the log lines of each change (breaker_open, breaker_closed).
  Breaker(std::string name, Options options, NowFn now = nullptr);

  // Whether to make the call now. Every true must be followed by Record with the outcome.
  bool Allow();
  // `failed`: the dependency's fault (unreachable, timed out, overloaded), not the request's.
  void Record(bool failed, const std::string& error = "");
  bool open() const;

 private:
  const std::string name_;
  const Options options_;
  const NowFn now_;
  mutable Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool probing_ ABSL_GUARDED_BY(mu_) = false;  // the one call let through after the backoff
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  absl::Time until_ ABSL_GUARDED_BY(mu_);     // open: calls skip until then
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;  // since it opened (logged when it closes)
};

}  // namespace cascade::gateway
