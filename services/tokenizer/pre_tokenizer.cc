// NFC through utf8proc and the Split pre-tokenizer through PCRE2 (JIT where the build has it).
#include "services/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cascade::tokenizer::internal {
namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<char*>(buf);
}

}  // namespace

absl::StatusOr<std::string> Nfc(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NFC normalization failed: ", utf8proc_errmsg(n)));
  }
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto impl = std::make_unique<Impl>();
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer regex does not compile at ",
                                                   offset, ": ", Pcre2Message(error)));
  }
  // JIT is an optimization only: without it (unsupported platform) pcre2_match interprets.
  pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<SplitRegex>(new SplitRegex(std::move(impl)));
}

absl::Status SplitRegex::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  // Match data is per call so that one compiled regex serves all threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t gap_start = 0;
  // The caller validated the UTF-8 once; re-checking on every match would be quadratic.
  const uint32_t options = PCRE2_NO_UTF_CHECK;
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(absl::StrCat("pre-tokenizer regex failed: ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0];
    size_t end = ov[1];
    if (start > gap_start) pieces->push_back(text.substr(gap_start, start - gap_start));
    if (end == start) {
      // An empty match yields no piece; step over one code point so the scan progresses.
      end = start + 1;
      while (end < text.size() && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) ++end;
      gap_start = start;
      pos = end;
      continue;
    }
    pieces->push_back(text.substr(start, end - start));
    gap_start = pos = end;
  }
  if (gap_start < text.size()) pieces->push_back(text.substr(gap_start));
  return absl::OkStatus();
}

}  // namespace cascade::tokenizer::internal
