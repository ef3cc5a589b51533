// Internal: splitting text at added tokens ("<|im_start|>", "<tool_call>", ...) before any
// normalization or pre-tokenization, so they can never merge with neighbouring text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace cascade::tokenizer::internal {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false;      // the match swallows whitespace on its left
  bool rstrip = false;      // ... and on its right
  bool normalized = false;  // matched in normalized (NFC) text instead of the raw text
  bool special = false;
};

// A run of text to tokenize (id < 0) or one added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

// Leftmost-longest matching, like HF's aho-corasick LeftmostLongest. Qwen3's added tokens are
// few (26), so a per-first-byte candidate list, longest first, is as fast as an automaton.
class AddedTokenSplitter {
 public:
  // `tokens` must outlive the splitter.
  explicit AddedTokenSplitter(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return by_first_byte_.empty(); }

  // Appends the segments of `text` to `out`; text segments are never empty.
  void Split(std::string_view text, std::vector<Segment>* out) const;

 private:
  absl::flat_hash_map<uint8_t, std::vector<const AddedToken*>> by_first_byte_;
};

}  // namespace cascade::tokenizer::internal
