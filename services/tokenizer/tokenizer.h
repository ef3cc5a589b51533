// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (Qwen3 family), the
// per-chunk ChatML template, UTF-8-safe streaming decode, and the `tokenize`/`detokenize` CLI
// commands. Plain C++ (no gRPC, no CUDA): the gateway, the worker and the CLI all link it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cascade::tokenizer {

class Tokenizer {
 public:
  // Reads `<dir>/tokenizer.json` and, if present, `<dir>/tokenizer_config.json`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // Same from file contents; `config_json` may be empty. Errors: kInvalidArgument for
  // malformed JSON or an unsupported model/normalizer/pre-tokenizer.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 text. Added/special tokens written in the text (e.g. "<|im_start|>") become
  // their ids, like HF `encode(text, add_special_tokens=False)`: Qwen3 adds no BOS/EOS.
  // kInvalidArgument if `text` is not valid UTF-8. Thread-safe.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  // The bytes the ids stand for, concatenated; may end inside a UTF-8 code point (use
  // IncrementalDecoder for streams, ToValidUtf8 for display). Special tokens decode to their
  // content unless `skip_special` is set. kInvalidArgument for an unknown id. Thread-safe.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Decode made valid UTF-8 (ToValidUtf8: the ids may end inside a code point), for text that
  // is shown or sent as a string. kInvalidArgument for an unknown id. Thread-safe.
  absl::StatusOr<std::string> DecodeText(std::span<const int32_t> ids) const;
  // The bytes of one token; kInvalidArgument for an unknown id.
  absl::StatusOr<std::string_view> TokenBytes(int32_t id) const;

  // One past the largest id (vocab plus added tokens); ids below it may still be unused.
  int32_t vocab_size() const;
  // Id of an added token by content ("<|im_end|>"), or -1.
  int32_t AddedTokenId(std::string_view content) const;
  bool IsSpecial(int32_t id) const;
  // `eos_token` from tokenizer_config.json ("<|im_end|>" for Qwen3), or -1.
  int32_t eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer for one sequence: never emits part of a UTF-8 code point. Bytes that
// can still become a valid code point are held back; bytes that never can become U+FFFD.
// Not thread-safe; `tokenizer` must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Text completed by this token (possibly empty); always valid UTF-8.
  absl::StatusOr<std::string> Add(int32_t id);
  // End of stream: the held-back bytes, each maximal invalid subpart replaced by U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_;
  std::string pending_;  // trailing bytes of an incomplete code point (at most 3)
};

bool IsValidUtf8(std::string_view s);
// Replaces each maximal invalid subpart (Unicode 15, 3.9 "U+FFFD substitution") by U+FFFD, as
// Python's errors="replace" and the WHATWG decoder do.
std::string ToValidUtf8(std::string_view s);

// Mirrors cascade.v2.ChunkKind numerically (the hash folds in the number).
enum class ChunkKind : int32_t {
  kUnspecified = 0,
  kSystem = 1,
  kContext = 2,
  kQuery = 3,
  kRaw = 4,
  kGenerationPrompt = 5,
  kAssistant = 6,
};

struct Chunk {
  ChunkKind kind = ChunkKind::kUnspecified;
  std::string text;  // must be empty for kGenerationPrompt
  // kGenerationPrompt only: false ends it with Qwen3's empty think block (its chat template with
  // enable_thinking=false), so the model answers without reasoning first.
  bool thinking = true;
};

// Qwen3 ChatML, one piece per chunk:
//   SYSTEM            "<|im_start|>system\n{text}<|im_end|>\n"
//   CONTEXT           "<|im_start|>user\n{text}<|im_end|>\n"   (a user turn carrying the
//                     documents; Qwen3 has no "context" role, and a user turn is what its chat
//                     template renders for a user message, so the model sees familiar input)
//   QUERY             "<|im_start|>user\n{text}<|im_end|>\n"
//   ASSISTANT         "<|im_start|>assistant\n{text}<|im_end|>\n"
//   RAW               text as is
//   GENERATION_PROMPT "<|im_start|>assistant\n" (text must be empty); with thinking false
//                     "<|im_start|>assistant\n<think>\n\n</think>\n\n" (Qwen3's template
//                     with enable_thinking=false)
// kInvalidArgument for kUnspecified, an unknown kind, or text on a generation prompt.
absl::StatusOr<std::string> ApplyChatTemplate(ChunkKind kind, std::string_view text,
                                              bool thinking = true);

// Templates and encodes each chunk on its own; result[i] are chunk i's ids, and the prompt is
// their concatenation. For every kind except RAW this equals encoding the whole templated
// prompt at once (each templated piece starts with a special token and ends with
// "<|im_end|>\n"; see chat_template.cc). A RAW chunk's edges are forced token boundaries.
// kInvalidArgument for a bad chunk, invalid UTF-8, or a generation prompt that is not last.
absl::StatusOr<std::vector<std::vector<int32_t>>> EncodeChunks(const Tokenizer& tokenizer,
                                                               std::span<const Chunk> chunks);

// `cascade tokenize`: each input line is a JSON string; prints its ids as a JSON array. Blank
// lines are echoed blank, so output lines stay aligned with input lines. Stops at the first bad
// line with kInvalidArgument "line N: ..." (also written to `err` when given).
absl::Status RunTokenizeCommand(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                                std::ostream* err = nullptr);
// `cascade detokenize`: each input line is a JSON array of ids; prints the decoded text as a
// JSON string (invalid UTF-8 replaced by U+FFFD). Same line and error rules as above.
absl::Status RunDetokenizeCommand(std::istream& in, std::ostream& out, const Tokenizer& tokenizer,
                                  std::ostream* err = nullptr);

}  // namespace cascade::tokenizer
