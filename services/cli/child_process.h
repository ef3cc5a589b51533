// One child server process of a local stack: spawned with its stdout on a pipe (read for the
// ready line "<name> serving on HOST:PORT") and its stderr in a log file, in its own process
// group (so Ctrl-C reaches only the launcher, which stops children in order), and with
// PR_SET_PDEATHSIG so it never outlives the launcher.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cascade::cli {

struct ChildSpec {
  std::string name;               // names the ready line and messages, e.g. "cascade-worker"
  std::string path;               // executable
  std::vector<std::string> args;  // without argv[0]
  std::string log_path;           // stderr and stdout are appended here
  // The stdout text that precedes the address in the ready line; empty: "<name> serving on ".
  // The address runs to the next whitespace.
  std::string ready_marker;
  // Other stdout lines worth keeping, printed before the ready line (the gateway's OpenAI HTTP
  // address): for each marker, the text after its first occurrence up to whitespace (Noted).
  std::vector<std::string> note_markers;
};

// Thread-compatible: one thread drives it (an internal thread drains stdout).
// REQUIRES: Spawn() is called from a thread that lives as long as the child should (the kernel
// sends PR_SET_PDEATHSIG when the forking *thread* exits); the main thread is the safe choice.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const ChildSpec& spec);
  // Stops the child (Stop with a 10 s grace) if it still runs.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Waits for "<name> serving on HOST:PORT" and returns "HOST:PORT" as printed. Errors
  // (DeadlineExceeded, or Unavailable when the child exits first) carry its log's tail.
  absl::StatusOr<std::string> WaitReady(absl::Duration timeout);

  // The address of the ready line if it came already (non-blocking).
  std::optional<std::string> ReadyAddress() const;
  // The text after `marker` (one of ChildSpec::note_markers) if its line came already; a child
  // that prints it before its ready line has it by the time WaitReady returns.
  std::optional<std::string> Noted(const std::string& marker) const;

  // True while the child runs; reaps it when it has exited.
  bool Running();
  // "exited with code 3", "killed by signal 9", or "running".
  std::string ExitDescription();

  // SIGTERM, wait up to `grace` for the child to exit, then SIGKILL. Idempotent. Returns how the
  // child ended.
  std::string Stop(absl::Duration grace);

  // The last `max_lines` lines of the child's log (stderr and stdout).
  std::string LogTail(int max_lines = 20) const;

  const std::string& name() const { return spec_.name; }
  const std::string& log_path() const { return spec_.log_path; }
  pid_t pid() const { return pid_; }

 private:
  explicit ChildProcess(ChildSpec spec) : spec_(std::move(spec)) {}
  void DrainStdout();  // runs on reader_
  bool Reap(bool block);

  // Set at Spawn.
  ChildSpec spec_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int log_fd_ = -1;
  std::thread reader_;

  // Main thread only.
  bool reaped_ = false;
  int wait_status_ = 0;

  mutable absl::Mutex mu_;
  std::string ready_address_ ABSL_GUARDED_BY(mu_);  // non-empty once the ready line came
  std::map<std::string, std::string> noted_ ABSL_GUARDED_BY(mu_);  // note marker -> its text
  bool stdout_closed_ ABSL_GUARDED_BY(mu_) = false;
};

// "HOST:PORT" -> the port, or -1. Accepts "[::]:PORT".
int PortOf(const std::string& address);
// What a local client dials for a server that printed `address`: wildcard hosts (0.0.0.0, [::])
// become 127.0.0.1.
std::string DialAddress(const std::string& address);

}  // namespace cascade::cli
