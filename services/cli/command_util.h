// Flag helpers the `cascade` subcommands share: parsing a subcommand's arguments with the common
// FlagSet, and flag kinds FlagSet lacks (repeated strings, optional numbers).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/flags.h"

namespace cascade::cli {

// Parses `args` (the subcommand's arguments) into `flags`. Returns nullopt to go on, or the exit
// code to return: 0 after printing --help to `out`, 2 after printing the error to `err`.
// Positional arguments are an error: no subcommand takes any.
std::optional<int> ParseCommandFlags(common::FlagSet& flags, const std::vector<std::string>& args,
                                     std::ostream& out, std::ostream& err);

// `--name V` may be given several times; each appends V.
void AddRepeatedString(common::FlagSet* flags, std::string_view name,
                       std::vector<std::string>* values, std::string_view help);
// Unset unless given.
void AddOptionalDouble(common::FlagSet* flags, std::string_view name, std::optional<double>* value,
                       std::string_view help);
void AddOptionalInt(common::FlagSet* flags, std::string_view name, std::optional<int>* value,
                    std::string_view help);
void AddOptionalUint64(common::FlagSet* flags, std::string_view name,
                       std::optional<uint64_t>* value, std::string_view help);

}  // namespace cascade::cli
