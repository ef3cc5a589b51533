// Bounding what a server echoes of its input. An error message that quotes a client's field
// verbatim can be made arbitrarily large (a 100 KB model name froze a grpc-js connection: the
// status travels in HTTP/2 trailers, which clients cap at a few KB) and can carry control bytes
// into logs. Every echo of input goes through Excerpt(); every status leaving a service is capped
// by CapStatusMessage() as a last line of defence.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace cascade::common {

// absl::string_view, not std::string_view: Debian 12's abseil has its own string_view type (what
// absl::Status::message() returns); std::string and literals convert to either.

// Longest status message a service sends; long enough for every message we write ourselves.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// At most `max_bytes` of `s` for an error message: printable ASCII kept, any other byte written
// as \xNN, and a cut marked with the total size ("abc...(100000 bytes)").
inline std::string Excerpt(absl::string_view s, size_t max_bytes = 64) {
  std::string out;
  size_t i = 0;
  for (; i < s.size() && out.size() < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (i < s.size()) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

// `message` cut to kMaxStatusMessageBytes on a UTF-8 code point boundary, marked when cut.
inline std::string CapStatusMessage(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  const absl::string_view kMark = "...(truncated)";
  size_t cut = kMaxStatusMessageBytes - kMark.size();
  // Back up over UTF-8 continuation bytes (10xxxxxx) so a code point is never split.
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), kMark);
}

// Longest client-chosen identifier (request_id, session_id) accepted.
inline constexpr size_t kMaxIdBytes = 128;

// A client-chosen identifier travels on as gRPC metadata (x-request-id) and into logs, so it must
// be a valid metadata value: visible ASCII (0x21-0x7E) only, at most `max_bytes`. An empty id is
// fine (the server assigns one). InvalidArgument naming `field` otherwise.
inline absl::Status CheckIdField(absl::string_view field, absl::string_view id,
                                 size_t max_bytes = kMaxIdBytes) {
  if (id.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", id.size(), " bytes, at most ", max_bytes));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: byte %d is 0x%02x; use visible ASCII characters (0x21-0x7E) only", field, i, c));
    }
  }
  return absl::OkStatus();
}

}  // namespace cascade::common
