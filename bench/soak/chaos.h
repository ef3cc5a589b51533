// The soak's fault injection against a running `cascade up`: on a schedule, SIGKILL one of its
// children (found through /proc by its command line), noting its pid and memory just before.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace cascade::bench {

struct ChaosEvent {
  absl::Duration at;   // from the start of the schedule
  std::string target;  // "registry" or "worker-<i>"
};

struct ChaosRecord {
  ChaosEvent event;
  pid_t pid = -1;            // the process killed; -1: none found (it was down already)
  int64_t rss_bytes = -1;    // its VmRSS just before the kill
  absl::Duration actual_at;  // when it happened
};

// Worker kills at every `worker_interval` (workers in turn), registry kills at
// `registry_offset` + k * `registry_interval`, all strictly before `duration`. An interval of
// zero schedules no kills of that kind.
std::vector<ChaosEvent> ChaosSchedule(absl::Duration duration, int workers,
                                      absl::Duration worker_interval,
                                      absl::Duration registry_interval,
                                      absl::Duration registry_offset);

// The child of `up_pid` that plays `target` ("registry": the cascade-registry binary;
// "worker-<i>": the worker started with --worker_id=worker-<i>), or -1.
pid_t FindStackChild(pid_t up_pid, const std::string& target);

// Runs `schedule` against `up_pid`'s children, from now, until it is done or `stop` turns true.
// One line per kill goes to `log`. Blocking; run it on its own thread.
std::vector<ChaosRecord> RunChaos(pid_t up_pid, const std::vector<ChaosEvent>& schedule,
                                  const std::atomic<bool>& stop, std::ostream& log);

}  // namespace cascade::bench
