// The line-oriented `cascade tokenize` / `cascade detokenize` commands, as library functions so
// that the CLI binary stays thin and tests drive them with string streams.
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::tokenizer {
namespace {

using json = nlohmann::json;

absl::Status LineError(int line_no, absl::string_view what, std::ostream* err) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", what));
  if (err != nullptr) *err << status.message() << "\n";
  return status;
}

// Calls `handle` on each non-blank line; blank lines are echoed so output stays aligned.
template <typename Handle>
absl::Status ForEachLine(std::istream& in, std::ostream& out, std::ostream* err, Handle handle) {
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) {
      out << "\n";
      continue;
    }
    json value;
    try {
      value = json::parse(line);
    } catch (const json::exception& e) {
      return LineError(line_no, absl::StrCat("not JSON: ", e.what()), err);
    }
    absl::StatusOr<std::string> result = handle(value);
    if (!result.ok()) return LineError(line_no, result.status().message(), err);
    out << *result << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTokenizeCommand(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                                std::ostream* err) {
  return ForEachLine(in, out, err, [&](const json& value) -> absl::StatusOr<std::string> {
    if (!value.is_string()) return absl::InvalidArgumentError("expected a JSON string");
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(value.get<std::string>());
    if (!ids.ok()) return ids.status();
    return json(*ids).dump();
  });
}

absl::Status RunDetokenizeCommand(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                                  std::ostream* err) {
  return ForEachLine(in, out, err, [&](const json& value) -> absl::StatusOr<std::string> {
    if (!value.is_array()) return absl::InvalidArgumentError("expected a JSON array of token ids");
    std::vector<int32_t> ids;
    ids.reserve(value.size());
    for (const json& v : value) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= tokenizer.vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat("not a token id: ", v.dump()));
      }
      ids.push_back(v.get<int32_t>());
    }
    absl::StatusOr<std::string> text = tokenizer.DecodeText(ids);
    if (!text.ok()) return text.status();
    return json(*text).dump();
  });
}

}  // namespace cascade::tokenizer
