// Internal: NFC normalization (utf8proc) and the HF "Split" pre-tokenizer evaluated with PCRE2.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cascade::tokenizer::internal {

// NFC of valid UTF-8. ASCII input is returned unchanged without calling utf8proc.
absl::StatusOr<std::string> Nfc(std::string_view text);

// HF `Split { pattern: Regex, behavior: Isolated, invert: false }`: every match is a piece and
// so is every gap between matches, in order. HF compiles the pattern with Oniguruma; PCRE2 in
// UTF + UCP mode agrees on the constructs tokenizer.json files use: \p{L}, \p{N}, (?i:...),
// lookahead, and \s as Unicode White_Space (U+0085 NEL included, unlike JavaScript's \s; the
// tests pin HF's ids for it). Thread-safe.
class SplitRegex {
 public:
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(std::string_view pattern);
  ~SplitRegex();

  // Appends the pieces of `text` (valid UTF-8) to `pieces` as views into `text`.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Impl;
  explicit SplitRegex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cascade::tokenizer::internal
