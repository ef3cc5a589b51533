// Reading other processes from /proc (Linux): the children of a process with their command
// lines, and resident memory. Used to find `cascade up`'s children from outside (tests, the soak)
// and to report their memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cascade::cli {

struct ProcessInfo {
  pid_t pid = -1;
  std::vector<std::string> args;  // argv, argv[0] first
};

// The live (not zombie) direct children of `parent`; empty when there are none or /proc cannot
// be read.
std::vector<ProcessInfo> ChildProcesses(pid_t parent);

// The child of `parent` whose arguments include `arg` exactly (e.g. "--worker_id=worker-1"), or -1.
pid_t FindChildWithArg(pid_t parent, const std::string& arg);

// VmRSS of `pid` in bytes, or -1 when it cannot be read (the process is gone).
int64_t ResidentBytes(pid_t pid);

}  // namespace cascade::cli
