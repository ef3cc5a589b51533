// Spawning and stopping one child server: fork/exec with pipes and a log file, ready-line
// detection on a reader thread, and SIGTERM-then-SIGKILL shutdown.
#include "services/cli/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace cascade::cli {
namespace {

std::string Errno(std::string_view what) {
  return absl::StrCat(absl::string_view(what.data(), what.size()), ": ", std::strerror(errno));
}

// Writes all of `data` to `fd`, retrying on EINTR and short writes.
void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

int PortOf(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  int port = 0;
  std::string digits = address.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return -1;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    port = port * 10 + (c - '0');
  }
  return port <= 65535 ? port : -1;
}

std::string DialAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  std::string host = address.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
    return absl::StrCat("127.0.0.1", address.substr(colon));
  }
  return address;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const ChildSpec& spec) {
  if (access(spec.path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(spec.path, " is missing or not executable: build it (",
                                            "ninja -C <build dir> ", spec.name, ")"));
  }
  std::unique_ptr<ChildProcess> child(new ChildProcess(spec));
  child->log_fd_ = open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (child->log_fd_ < 0) return absl::InternalError(Errno("cannot open log " + spec.log_path));
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out[2];
  if (devnull < 0 || pipe2(out, O_CLOEXEC) != 0) {
    if (devnull >= 0) close(devnull);
    return absl::InternalError(Errno("cannot create a pipe for " + spec.name));
  }
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> argv_storage = {spec.path};
  argv_storage.insert(argv_storage.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  static constexpr char kExecFailed[] = "cascade: exec failed\n";
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    close(devnull);
    close(out[0]);
    close(out[1]);
    return absl::InternalError(Errno("fork"));
  }
  if (pid == 0) {
    setpgid(0, 0);  // own group: the terminal's Ctrl-C goes to the launcher only
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // `up` blocks SIGINT/SIGTERM; exec keeps masks
    signal(SIGPIPE, SIG_DFL);
    dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(child->log_fd_, 2);
    execv(argv[0], argv.data());
    WriteAll(2, kExecFailed, sizeof(kExecFailed) - 1);
    _exit(127);
  }
  close(devnull);
  close(out[1]);
  child->pid_ = pid;
  child->stdout_fd_ = out[0];
  child->reader_ = std::thread([c = child.get()] { c->DrainStdout(); });
  return child;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Stop(absl::Seconds(10));
  if (reader_.joinable()) reader_.join();
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (log_fd_ >= 0) close(log_fd_);
}

void ChildProcess::DrainStdout() {
  const std::string marker =
      spec_.ready_marker.empty() ? spec_.name + " serving on " : spec_.ready_marker;
  std::string partial;
  char buf[4096];
  while (true) {
    ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    WriteAll(log_fd_, buf, static_cast<size_t>(n));
    partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      std::string line = partial.substr(0, nl);
      partial.erase(0, nl + 1);
      for (const std::string& note : spec_.note_markers) {
        const size_t n_at = line.find(note);
        if (n_at == std::string::npos) continue;
        std::string text = line.substr(n_at + note.size());
        text = text.substr(0, text.find_first_of(" \t\r"));
        absl::MutexLock lock(&mu_);
        noted_.emplace(note, std::move(text));  // (the first line wins)
      }
      size_t at = line.find(marker);
      if (at == std::string::npos) continue;
      std::string address = line.substr(at + marker.size());
      address = address.substr(0, address.find_first_of(" \t\r"));
      absl::MutexLock lock(&mu_);
      if (ready_address_.empty()) ready_address_ = address;
    }
  }
  absl::MutexLock lock(&mu_);
  stdout_closed_ = true;
}

std::optional<std::string> ChildProcess::ReadyAddress() const {
  absl::MutexLock lock(&mu_);
  if (ready_address_.empty()) return std::nullopt;
  return ready_address_;
}

std::optional<std::string> ChildProcess::Noted(const std::string& marker) const {
  absl::MutexLock lock(&mu_);
  const auto it = noted_.find(marker);
  if (it == noted_.end()) return std::nullopt;
  return it->second;
}

bool ChildProcess::Reap(bool block) {
  if (reaped_) return true;
  while (true) {
    pid_t r = waitpid(pid_, &wait_status_, block ? 0 : WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r == pid_ || r < 0) reaped_ = true;  // r < 0: not our child any more (ECHILD)
    return reaped_;
  }
}

bool ChildProcess::Running() { return !Reap(/*block=*/false); }

std::string ChildProcess::ExitDescription() {
  if (!Reap(/*block=*/false)) return "running";
  if (WIFEXITED(wait_status_)) return absl::StrCat("exited with code ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    int sig = WTERMSIG(wait_status_);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "ended";
}

absl::StatusOr<std::string> ChildProcess::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready_or_closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !ready_address_.empty() || stdout_closed_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready_or_closed), absl::Milliseconds(100));
      if (!ready_address_.empty()) return ready_address_;
    }
    if (!Running()) {
      Reap(/*block=*/true);
      return absl::UnavailableError(absl::StrCat(spec_.name, " ", ExitDescription(),
                                                 " before it was ready. Its log (", spec_.log_path,
                                                 ") ends with:\n", LogTail()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(spec_.name, " printed no ready line (\"", spec_.name,
                       " serving on HOST:PORT\") within ", absl::FormatDuration(timeout),
                       ". Its log (", spec_.log_path, ") ends with:\n", LogTail()));
    }
  }
}

std::string ChildProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return "not started";
  if (!Reap(/*block=*/false)) {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    while (!Reap(/*block=*/false) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    if (!Reap(/*block=*/false)) {
      kill(pid_, SIGKILL);
      Reap(/*block=*/true);
    }
  }
  if (reader_.joinable()) reader_.join();
  return ExitDescription();
}

std::string ChildProcess::LogTail(int max_lines) const {
  std::ifstream in(spec_.log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(ss.str(), '\n', absl::SkipEmpty());
  size_t from = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  std::string tail;
  for (size_t i = from; i < lines.size(); ++i) absl::StrAppend(&tail, "  | ", lines[i], "\n");
  if (tail.empty()) tail = "  | (empty)\n";
  return tail;
}

}  // namespace cascade::cli
