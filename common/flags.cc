// Flag parsing: see flags.h.
#include "common/flags.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/absl_compat.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

absl::StatusOr<bool> ParseBool(std::string_view text) {
  std::string lower = absl::AsciiStrToLower(ToAbsl(text));
  if (lower == "true" || lower == "1" || lower == "yes") return true;
  if (lower == "false" || lower == "0" || lower == "no") return false;
  return absl::InvalidArgumentError("expected true or false");
}

std::string Quote(std::string_view s) { return absl::StrCat("\"", ToAbsl(s), "\""); }

}  // namespace

FlagSet::FlagSet(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void FlagSet::Add(Flag flag) {
  // A duplicate is a programming error in the binary; the later registration would silently win.
  if (Find(flag.name) != nullptr) {
    std::cerr << "FATAL: flag --" << flag.name << " registered twice\n";
    std::abort();
  }
  flags_.push_back(std::move(flag));
}

const FlagSet::Flag* FlagSet::Find(std::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void FlagSet::AddString(std::string_view name, std::string* value, std::string_view help) {
  Add({std::string(name), "string", Quote(*value), std::string(help), false,
       [value](std::string_view text) {
         *value = std::string(text);
         return absl::OkStatus();
       }});
}

void FlagSet::AddInt64(std::string_view name, int64_t* value, std::string_view help) {
  Add({std::string(name), "int64", absl::StrCat(*value), std::string(help), false,
       [value](std::string_view text) {
         int64_t v;
         if (!absl::SimpleAtoi(ToAbsl(text), &v))
           return absl::InvalidArgumentError("expected an integer");
         *value = v;
         return absl::OkStatus();
       }});
}

void FlagSet::AddInt(std::string_view name, int* value, std::string_view help) {
  Add({std::string(name), "int", absl::StrCat(*value), std::string(help), false,
       [value](std::string_view text) {
         int v;
         if (!absl::SimpleAtoi(ToAbsl(text), &v)) {
           return absl::InvalidArgumentError("expected a 32-bit integer");
         }
         *value = v;
         return absl::OkStatus();
       }});
}

void FlagSet::AddDouble(std::string_view name, double* value, std::string_view help) {
  Add({std::string(name), "double", absl::StrCat(*value), std::string(help), false,
       [value](std::string_view text) {
         double v;
         if (!absl::SimpleAtod(ToAbsl(text), &v) || std::isnan(v)) {
           return absl::InvalidArgumentError("expected a number");
         }
         *value = v;
         return absl::OkStatus();
       }});
}

void FlagSet::AddBool(std::string_view name, bool* value, std::string_view help) {
  Add({std::string(name), "bool", *value ? "true" : "false", std::string(help), true,
       [value](std::string_view text) {
         absl::StatusOr<bool> v = ParseBool(text);
         if (!v.ok()) return v.status();
         *value = *v;
         return absl::OkStatus();
       }});
}

void FlagSet::AddDuration(std::string_view name, absl::Duration* value, std::string_view help) {
  Add({std::string(name), "duration", absl::FormatDuration(*value), std::string(help), false,
       [value](std::string_view text) {
         absl::Duration d;
         if (!absl::ParseDuration(ToAbsl(text), &d)) {
           return absl::InvalidArgumentError("expected a duration such as 500ms, 10s or 2m");
         }
         *value = d;
         return absl::OkStatus();
       }});
}

void FlagSet::AddCustom(std::string_view name, std::string_view type, std::string_view default_text,
                        std::string_view help, std::function<absl::Status(std::string_view)> set) {
  Add({std::string(name), std::string(type), std::string(default_text), std::string(help), false,
       std::move(set)});
}

absl::Status FlagSet::Parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional_.emplace_back(argv[i]);
      break;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      help_requested_ = true;
      continue;
    }
    if (arg.starts_with("--")) {
      arg.remove_prefix(2);
    } else {
      // "-x" is treated as a typo for a flag rather than a positional argument, since no
      // Cascade binary takes positional arguments that start with a dash.
      if (arg.size() > 1 && arg[0] == '-') {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag ", ToAbsl(arg), " (flags are written --name=value)"));
      }
      positional_.emplace_back(arg);
      continue;
    }
    std::string_view name = arg;
    std::optional<std::string_view> value;
    if (size_t eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const Flag* flag = Find(name);
    if (flag == nullptr && !value.has_value() && name.starts_with("no")) {
      const Flag* negated = Find(name.substr(2));
      if (negated != nullptr && negated->is_bool) {
        flag = negated;
        value = "false";
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", ToAbsl(name)));
    }
    if (!value.has_value()) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", ToAbsl(name), " needs a value (", flag->type, ")"));
      }
    }
    if (absl::Status s = flag->set(*value); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bad value ", Quote(*value), " for flag --",
                                                     ToAbsl(name), " (", flag->type,
                                                     "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("Usage: ", program_, " [flags]\n");
  if (!description_.empty()) absl::StrAppend(&out, description_, "\n");
  absl::StrAppend(&out, "\nFlags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, " (", f.type, ", default ", f.default_text, ")\n");
    absl::StrAppend(&out, "      ", f.help, "\n");
  }
  absl::StrAppend(&out, "  --help\n      Print this text and exit.\n");
  return out;
}

std::optional<int> ParseFlags(FlagSet& flags, int argc, const char* const* argv, std::ostream& out,
                              std::ostream& err) {
  absl::Status status = flags.Parse(argc, argv);
  std::string_view program = argc > 0 ? argv[0] : "program";
  if (!status.ok()) {
    err << program << ": " << status.message() << "\n"
        << "Run " << program << " --help for the list of flags.\n";
    return kExitBadFlags;
  }
  if (flags.help_requested()) {
    out << flags.Usage();
    out.flush();
    return kExitHelp;
  }
  return std::nullopt;
}

std::optional<int> ParseFlags(FlagSet& flags, int argc, const char* const* argv) {
  return ParseFlags(flags, argc, argv, std::cout, std::cerr);
}

}  // namespace cascade::common
