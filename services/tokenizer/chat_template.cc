// The Qwen3 ChatML template applied per chunk, and per-chunk encoding.
//
// Why per-chunk encoding equals encoding the whole prompt (the invariant "chunk boundaries are
// token boundaries"): every templated piece except RAW starts with the special token
// "<|im_start|>" and ends with "<|im_end|>\n" (the generation prompt, "<|im_start|>assistant\n",
// may only be last). Added tokens are split out of the text before normalization and
// pre-tokenization, so in the whole prompt the text between two pieces' special tokens is the
// lone "\n" after "<|im_end|>", bounded by "<|im_start|>" on the right: it is tokenized alone,
// exactly as at the end of its own piece (id 198). No added token contains "\n" or starts with
// it, so no added-token match can straddle a boundary either. Text inside a piece (with its
// trailing spaces, newlines, combining marks or CJK) always ends at the piece's own
// "<|im_end|>", so nothing of it can merge or NFC-compose across the boundary.
//
// RAW pieces have no such guard: RAW "hel" then RAW "lo" would tokenize as "hello" in one
// string, and RAW text starting with "\n" after "<|im_end|>\n" would join that "\n" ("\n\n" is
// one token). We do not patch this: a RAW chunk is encoded on its own, so its edges are token
// boundaries by definition and the prompt's tokens are still the concatenation of the chunks'.
// It just may differ from what encoding the concatenated string would give.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::tokenizer {
namespace {

std::string Turn(std::string_view role, std::string_view text) {
  std::string out = "<|im_start|>";
  out.append(role).append("\n").append(text).append("<|im_end|>\n");
  return out;
}

}  // namespace

absl::StatusOr<std::string> ApplyChatTemplate(ChunkKind kind, std::string_view text,
                                              bool thinking) {
  switch (kind) {
    case ChunkKind::kSystem:
      return Turn("system", text);
    case ChunkKind::kContext:
      // Qwen3 has no "context" role. Documents go in a user turn of their own, which is what the
      // model's chat template renders for a user message; a query chunk then follows as another
      // user turn. Keeping the context a complete turn keeps the piece self-delimited.
    case ChunkKind::kQuery:
      return Turn("user", text);
    case ChunkKind::kAssistant:
      return Turn("assistant", text);
    case ChunkKind::kRaw:
      return std::string(text);
    case ChunkKind::kGenerationPrompt:
      if (!text.empty()) {
        return absl::InvalidArgumentError("a generation prompt chunk carries no text");
      }
      // Qwen3's template: `{%- if enable_thinking is defined and enable_thinking is false %}
      // {{- '<think>\n\n</think>\n\n' }}` after the assistant's start.
      return std::string(thinking ? "<|im_start|>assistant\n"
                                  : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    case ChunkKind::kUnspecified:
      return absl::InvalidArgumentError("chunk kind is unspecified");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chunk kind ", static_cast<int32_t>(kind)));
}

absl::StatusOr<std::vector<std::vector<int32_t>>> EncodeChunks(const Tokenizer& tokenizer,
                                                               std::span<const Chunk> chunks) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    if (chunk.kind == ChunkKind::kGenerationPrompt && i + 1 != chunks.size()) {
      // Its trailing "\n" is not followed by a special token, so anything after it could merge
      // with it; the generation prompt is the prompt's end.
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, ": the generation prompt must be the last chunk"));
    }
    absl::StatusOr<std::string> templated =
        ApplyChatTemplate(chunk.kind, chunk.text, chunk.thinking);
    if (!templated.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, ": ", templated.status().message()));
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*templated);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": ", ids.status().message()));
    }
    out.push_back(*std::move(ids));
  }
  return out;
}

}  // namespace cascade::tokenizer
