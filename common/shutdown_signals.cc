// SIGTERM/SIGINT via a self-pipe: see shutdown_signals.h.
#include "common/shutdown_signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace cascade::common::internal {
namespace {

int g_pipe_write = -1;  // read by the handler; set before the handlers are installed

void OnSignal(int signo) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  (void)!::write(g_pipe_write, &byte, 1);
  errno = saved;
}

struct State {
  absl::Mutex mu;
  std::map<int, std::function<void()>> callbacks ABSL_GUARDED_BY(mu);
  int next_id ABSL_GUARDED_BY(mu) = 1;
  int signals_seen ABSL_GUARDED_BY(mu) = 0;
  int pipe_read = -1;
  std::thread watcher;
  struct sigaction old_term, old_int;
};
State& GetState() {
  static State* state = new State;
  return *state;
}

void Watch(State* state, int fd) {
  for (;;) {
    unsigned char byte;
    ssize_t n = ::read(fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || byte == 0) return;  // 0 is the stop request from RemoveShutdownCallback
    std::vector<std::function<void()>> to_run;
    {
      absl::MutexLock lock(&state->mu);
      if (++state->signals_seen > 1) {
        LogWarn("second_signal_exiting_now", {{"signal", static_cast<int>(byte)}});
        std::_Exit(128 + byte);
      }
      for (auto& [id, fn] : state->callbacks) to_run.push_back(fn);
    }
    LogInfo("shutdown_signal", {{"signal", static_cast<int>(byte)}});
    for (auto& fn : to_run) fn();
  }
}

}  // namespace

int AddShutdownCallback(std::function<void()> on_signal) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  if (s.callbacks.empty()) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      LogError("signal_pipe_failed", {{"errno", errno}});
    } else {
      s.pipe_read = fds[0];
      g_pipe_write = fds[1];
      s.signals_seen = 0;
      s.watcher = std::thread(Watch, &s, s.pipe_read);
      struct sigaction sa {};
      sa.sa_handler = OnSignal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      sigaction(SIGTERM, &sa, &s.old_term);
      sigaction(SIGINT, &sa, &s.old_int);
    }
  }
  int id = s.next_id++;
  s.callbacks[id] = std::move(on_signal);
  return id;
}

void RemoveShutdownCallback(int id) {
  State& s = GetState();
  std::thread watcher;
  int pipe_read = -1;
  int pipe_write = -1;
  {
    absl::MutexLock lock(&s.mu);
    if (s.callbacks.erase(id) == 0 || !s.callbacks.empty() || !s.watcher.joinable()) return;
    sigaction(SIGTERM, &s.old_term, nullptr);
    sigaction(SIGINT, &s.old_int, nullptr);
    unsigned char stop = 0;
    (void)!::write(g_pipe_write, &stop, 1);
    watcher = std::move(s.watcher);
    pipe_read = s.pipe_read;
    pipe_write = g_pipe_write;
  }
  // Joined outside mu_: the watcher may be waiting for it to run callbacks.
  watcher.join();
  ::close(pipe_read);
  ::close(pipe_write);
}

}  // namespace cascade::common::internal
