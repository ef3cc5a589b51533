// /proc readers; see proc_info.h.
#include "services/cli/proc_info.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace cascade::cli {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The parent pid and state letter from /proc/PID/stat. The command name (field 2) is in
// parentheses and may itself hold spaces and parentheses, so fields are read after the last ')'.
bool ReadStat(pid_t pid, pid_t* ppid, char* state) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 2 || fields[0].size() != 1) return false;
  *state = fields[0][0];
  int parent = 0;
  if (!absl::SimpleAtoi(fields[1], &parent)) return false;
  *ppid = parent;
  return true;
}

}  // namespace

std::vector<ProcessInfo> ChildProcesses(pid_t parent) {
  std::vector<ProcessInfo> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    pid_t ppid = -1;
    char state = '?';
    if (!ReadStat(pid, &ppid, &state) || ppid != parent || state == 'Z' || state == 'X') continue;
    ProcessInfo info;
    info.pid = pid;
    const std::string cmdline = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    info.args = absl::StrSplit(cmdline, '\0', absl::SkipEmpty());
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const ProcessInfo& a, const ProcessInfo& b) { return a.pid < b.pid; });
  return out;
}

pid_t FindChildWithArg(pid_t parent, const std::string& arg) {
  for (const ProcessInfo& p : ChildProcesses(parent)) {
    if (std::find(p.args.begin(), p.args.end(), arg) != p.args.end()) return p.pid;
  }
  return -1;
}

int64_t ResidentBytes(pid_t pid) {
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmRSS:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, "kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb)) return kb * 1024;
  }
  return -1;
}

}  // namespace cascade::cli
