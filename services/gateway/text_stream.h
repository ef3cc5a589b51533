// Turns a stream of generated token ids into text deltas: incremental UTF-8-safe decoding, and
// stop strings that may span tokens. Text that could still be the start of a stop string is held
// back, so a stop string is never emitted, even in part.
#pragma once

#include <string>
#include <vector>

#include "services/tokenizer/tokenizer.h"

namespace cascade::gateway {

// Not thread-safe; one per request. `tokenizer` must outlive it.
class TextStream {
 public:
  // min_tokens (vLLM's): stop strings are matched only in the text of the min_tokens-th token
  // and after it; the text before passes through unscanned. include_stop (vLLM's
  // include_stop_str_in_output): the stop string found ends the text instead of being cut.
  TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             int min_tokens = 0, bool include_stop = false);

  struct Delta {
    std::string text;      // valid UTF-8, ready to send
    bool stopped = false;  // a stop string was found; generation should end
    std::string stop;      // which one
  };

  // Adds one token. An id the tokenizer cannot decode (the model's vocabulary can be larger
  // than the tokenizer's: Qwen3 has 151936 ids, 151669 with text) adds no text; the caller
  // still streams and counts the id. After `stopped`, further tokens are ignored.
  Delta Add(int32_t token_id);
  // End of generation: releases held-back text (it did not become a stop string).
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  Delta Scan();

  tokenizer::IncrementalDecoder decoder_;
  const std::vector<std::string> stops_;
  std::string held_;  // decoded text not yet emitted
  const int min_tokens_;
  const bool include_stop_;
  int added_ = 0;  // tokens added so far
  bool stopped_ = false;
};

}  // namespace cascade::gateway
