// UTF-8 validation and repair, and the streaming decoder. Byte-level BPE tokens are arbitrary
// byte strings, so a code point can be split over tokens; a stream must hold such bytes back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "services/tokenizer/tokenizer.h"

namespace cascade::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

enum class Step { kValid, kInvalid, kTruncated };

// Classifies the sequence starting at s[i]. kValid/kInvalid set `len` to the bytes consumed
// (for kInvalid: the maximal subpart, at least 1); kTruncated means every byte up to the end is
// a valid prefix of some code point, so more input may complete it.
Step Next(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *len = 1;
    return Step::kValid;
  }
  int need;           // continuation bytes
  uint8_t lo = 0x80;  // allowed range of the second byte (excludes overlongs and surrogates)
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return Step::kInvalid;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return Step::kTruncated;
    const auto b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *len = k;
      return Step::kInvalid;
    }
  }
  *len = need + 1;
  return Step::kValid;
}

// Appends the repaired form of `s` to `out`. With `hold_tail`, a truncated sequence at the end
// is not replaced but returned (the caller keeps it for the next call).
std::string_view Repair(std::string_view s, bool hold_tail, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    switch (Next(s, i, &len)) {
      case Step::kValid:
        out->append(s.substr(i, len));
        i += len;
        break;
      case Step::kInvalid:
        out->append(kReplacement);
        i += len;
        break;
      case Step::kTruncated:
        if (hold_tail) return s.substr(i);
        out->append(kReplacement);  // one maximal subpart: the whole valid prefix
        return {};
    }
  }
  return {};
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    if (Next(s, i, &len) != Step::kValid) return false;
    i += len;
  }
  return true;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  Repair(s, /*hold_tail=*/false, &out);
  return out;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

absl::StatusOr<std::string> IncrementalDecoder::Add(int32_t id) {
  absl::StatusOr<std::string_view> bytes = tokenizer_.TokenBytes(id);
  if (!bytes.ok()) return bytes.status();
  if (skip_special_ && tokenizer_.IsSpecial(id)) return std::string();
  pending_.append(*bytes);
  std::string out;
  std::string held(Repair(pending_, /*hold_tail=*/true, &out));
  pending_ = std::move(held);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out;
  Repair(pending_, /*hold_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace cascade::tokenizer
