// A small command-line flag library for Cascade's binaries: typed flags registered by each
// binary, `--name=value` and `--name value`, `--help`, and clear errors with exit code 2.
// Why not absl flags: its --help exits 1 and its flags are process-global, which tests dislike.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace cascade::common {

// Exit codes of flag handling, as scripts see them.
inline constexpr int kExitHelp = 0;
inline constexpr int kExitBadFlags = 2;

// A set of flags for one program. Each flag writes into a variable owned by the caller; the
// variable's value at registration time is the default shown by --help.
// Not thread-safe: register and parse from one thread, before the program starts its work.
class FlagSet {
 public:
  // `description` heads the --help text (what the program is, one line or a few).
  explicit FlagSet(std::string program, std::string description = "");

  // Registration. `name` is without dashes, unique in the set; `value` must outlive Parse().
  // Bool flags accept `--name`, `--name=true|false|1|0|yes|no`, and `--noname`; a bool never
  // takes the next argument as its value, so `--name value` works for every other type only.
  void AddString(std::string_view name, std::string* value, std::string_view help);
  void AddInt64(std::string_view name, int64_t* value, std::string_view help);
  void AddInt(std::string_view name, int* value, std::string_view help);
  void AddDouble(std::string_view name, double* value, std::string_view help);
  void AddBool(std::string_view name, bool* value, std::string_view help);
  // Durations are written as absl::ParseDuration reads them: "500ms", "10s", "1m30s", "inf".
  void AddDuration(std::string_view name, absl::Duration* value, std::string_view help);
  // Any other type: `set` parses the text and stores it, or returns an error that explains the
  // accepted values (the flag's name is added to the message by Parse).
  void AddCustom(std::string_view name, std::string_view type, std::string_view default_text,
                 std::string_view help, std::function<absl::Status(std::string_view)> set);

  // Parses argv[1..argc). Arguments that are not flags, and everything after a bare "--", are
  // kept in positional(). Returns InvalidArgument naming the flag on an unknown flag, a missing
  // value or a bad value. `--help` (or `-h`) is not an error: it sets help_requested().
  absl::Status Parse(int argc, const char* const* argv);

  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }

  // The --help text: program, description, then per flag its name, type, default and help.
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::string type;
    std::string default_text;
    std::string help;
    bool is_bool = false;
    std::function<absl::Status(std::string_view)> set;
  };
  void Add(Flag flag);
  const Flag* Find(std::string_view name) const;

  std::string program_;
  std::string description_;
  std::vector<Flag> flags_;  // in registration order, which is the --help order
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

// Parses flags the way every Cascade binary does. Returns nullopt when the program should go on;
// otherwise the exit code the program should return, having printed the usage to `out` (--help,
// code 0) or the error plus a hint to `err` (code 2). Tests call this; main() returns its value.
std::optional<int> ParseFlags(FlagSet& flags, int argc, const char* const* argv, std::ostream& out,
                              std::ostream& err);
// Same, with std::cout and std::cerr.
std::optional<int> ParseFlags(FlagSet& flags, int argc, const char* const* argv);

}  // namespace cascade::common
