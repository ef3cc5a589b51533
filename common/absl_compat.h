// Internal to cascade_server_common. Debian 12's abseil is built with its own absl::string_view
// rather than std::string_view, so our public APIs take std::string_view (C++20 code passes
// those) and convert where they call into abseil.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace cascade::common::internal {

inline absl::string_view ToAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view FromAbsl(absl::string_view s) {
  return std::string_view(s.data(), s.size());
}

}  // namespace cascade::common::internal
