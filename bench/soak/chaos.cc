// Scheduled SIGKILLs of `cascade up`'s children; see chaos.h.
#include "bench/soak/chaos.h"

#include <signal.h>

#include <algorithm>
#include <ostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "services/cli/proc_info.h"

namespace cascade::bench {

std::vector<ChaosEvent> ChaosSchedule(absl::Duration duration, int workers,
                                      absl::Duration worker_interval,
                                      absl::Duration registry_interval,
                                      absl::Duration registry_offset) {
  std::vector<ChaosEvent> events;
  if (worker_interval > absl::ZeroDuration() && workers > 0) {
    int next = 0;
    for (absl::Duration t = worker_interval; t < duration; t += worker_interval) {
      events.push_back({t, absl::StrCat("worker-", next)});
      next = (next + 1) % workers;
    }
  }
  if (registry_interval > absl::ZeroDuration()) {
    for (absl::Duration t = registry_offset; t < duration; t += registry_interval) {
      if (t > absl::ZeroDuration()) events.push_back({t, "registry"});
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const ChaosEvent& a, const ChaosEvent& b) { return a.at < b.at; });
  return events;
}

pid_t FindStackChild(pid_t up_pid, const std::string& target) {
  if (target != "registry") return cli::FindChildWithArg(up_pid, "--worker_id=" + target);
  for (const cli::ProcessInfo& p : cli::ChildProcesses(up_pid)) {
    if (!p.args.empty() && absl::EndsWith(p.args[0], "/cascade-registry")) return p.pid;
  }
  return -1;
}

std::vector<ChaosRecord> RunChaos(pid_t up_pid, const std::vector<ChaosEvent>& schedule,
                                  const std::atomic<bool>& stop, std::ostream& log) {
  std::vector<ChaosRecord> records;
  const absl::Time t0 = absl::Now();
  for (const ChaosEvent& e : schedule) {
    while (!stop.load() && absl::Now() < t0 + e.at) absl::SleepFor(absl::Milliseconds(50));
    if (stop.load()) break;
    ChaosRecord r;
    r.event = e;
    r.pid = FindStackChild(up_pid, e.target);
    if (r.pid > 0) {
      r.rss_bytes = cli::ResidentBytes(r.pid);
      kill(r.pid, SIGKILL);
    }
    r.actual_at = absl::Now() - t0;
    log << absl::StrFormat("[chaos %6.1f s] SIGKILL %s (pid %d, RSS %.1f MiB)%s\n",
                           absl::ToDoubleSeconds(r.actual_at), e.target, r.pid,
                           r.rss_bytes / 1048576.0,
                           r.pid > 0 ? "" : ": not running, nothing killed")
        << std::flush;
    records.push_back(r);
  }
  return records;
}

}  // namespace cascade::bench
