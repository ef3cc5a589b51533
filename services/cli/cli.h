// The `cascade` command-line tool as a library: main() is one call to RunCli(), and tests drive
// the same entry point (or a single command) with their own streams.
//   cascade help | mkmodel | tokenize | detokenize | generate | up | demo
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace cascade::cli {

// Exit codes every command uses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the command ran and failed (RPC error, check failed)
inline constexpr int kExitUsage = 2;   // unknown command, bad flags

// Runs `cascade <args...>` (args exclude the program name). Reads stdin from `in` (tokenize,
// detokenize), writes results to `out` and diagnostics/progress to `err`. Returns the exit code.
int RunCli(const std::vector<std::string>& args, std::istream& in, std::ostream& out,
           std::ostream& err);

// One command each; `args` exclude the command name. Same streams and exit codes as RunCli.
int RunMkmodelCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunTokenizeCommand(const std::vector<std::string>& args, bool detokenize, std::istream& in,
                       std::ostream& out, std::ostream& err);
int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
// `up` blocks until SIGINT/SIGTERM; it must run on the main thread (the children's
// PR_SET_PDEATHSIG is tied to the thread that forks them).
int RunUpCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunCertsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int RunDemoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The top-level help text.
std::string Usage();

}  // namespace cascade::cli
