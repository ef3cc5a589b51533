// Stop-string scanning over a held-back tail; see text_stream.h.
#include "services/gateway/text_stream.h"

#include <algorithm>

namespace cascade::gateway {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stops,
                       int min_tokens, bool include_stop)
    : decoder_(tokenizer, /*skip_special=*/true),
      stops_(std::move(stops)),
      min_tokens_(min_tokens),
      include_stop_(include_stop) {}

TextStream::Delta TextStream::Add(int32_t token_id) {
  if (stopped_) return Delta{"", true, ""};
  absl::StatusOr<std::string> piece = decoder_.Add(token_id);
  if (piece.ok()) held_ += *piece;  // else: an id with no text (see the header)
  if (++added_ < min_tokens_) {     // before the min_tokens-th token: no stop string yet
    Delta d;
    d.text = std::move(held_);
    held_.clear();
    return d;
  }
  return Scan();
}

TextStream::Delta TextStream::Scan() {
  Delta d;
  // Earliest complete stop string wins.
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    size_t at = held_.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      d.stop = s;
    }
  }
  if (best != std::string::npos) {
    d.text = held_.substr(0, include_stop_ ? best + d.stop.size() : best);
    d.stopped = true;
    stopped_ = true;
    held_.clear();
    return d;
  }
  // Keep the longest tail that is a proper prefix of some stop string. A stop string is valid
  // UTF-8, so the tail starts on a code point boundary.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  d.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return d;
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  std::string out = held_ + decoder_.Flush();
  held_.clear();
  return out;
}

}  // namespace cascade::gateway
