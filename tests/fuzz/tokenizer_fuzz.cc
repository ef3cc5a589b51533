// libFuzzer target: the Qwen3 byte-level BPE tokenizer on arbitrary input. Byte 0 picks the mode:
//   0: encode the rest as text. Invalid UTF-8 must be refused with a status; valid text must
//      round-trip up to normalization: NFC(decode(encode(t))) == NFC(t). (The tokenizer splits
//      out added tokens and then NFC-normalizes the pieces between them, as Hugging Face does,
//      so the decode is canonically equivalent to t but need not be NFC(t) itself: "<|im_end|>"
//      followed by U+0338 keeps its ">" while NFC(t) composes ">" + U+0338 into U+226F.)
//   1: decode the rest as a list of ids (4 bytes each, mapped mostly into the vocabulary, some
//      outside and negative): unknown ids refused, known ones decoded, with and without specials.
//   2: incremental decode of those ids: every piece is valid UTF-8, and the pieces plus Flush()
//      equal ToValidUtf8 of the whole decode (streams show what a one-shot decode shows).
#include <utf8proc.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"

namespace cascade::fuzz {
namespace {

using tokenizer::IsValidUtf8;
using tokenizer::Tokenizer;

std::string Nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  FUZZ_CHECK(n >= 0, "utf8proc refused valid UTF-8");
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

std::vector<int32_t> Ids(const uint8_t* data, size_t size, int32_t vocab) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint32_t v;
    std::memcpy(&v, data + i, 4);
    // Mostly inside [0, vocab + 64), where the special and unused ids are; now and then a
    // negative or huge one.
    if ((v >> 28) == 0xf) {
      ids.push_back(static_cast<int32_t>(v));
    } else {
      ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(vocab + 64)));
    }
  }
  return ids;
}

void Encode(const Tokenizer& tok, std::string_view text) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  if (!IsValidUtf8(text)) {
    FUZZ_CHECK(!ids.ok(), "invalid UTF-8 was encoded");
    FUZZ_CHECK(ids.status().message().size() <= kMaxMessageBytes, "unbounded error message");
    return;
  }
  FUZZ_CHECK(ids.ok(), "valid UTF-8 refused: %s", std::string(ids.status().message()).c_str());
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id %d out of range", id);
  absl::StatusOr<std::string> back = tok.Decode(*ids);
  FUZZ_CHECK(back.ok(), "decoding encoded ids failed");
  FUZZ_CHECK(Nfc(*back) == Nfc(text), "NFC(decode(encode(t))) != NFC(t) for %zu bytes",
             text.size());
}

void Decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  bool all_known = true;
  for (int32_t id : ids) all_known = all_known && tok.TokenBytes(id).ok();
  for (bool skip : {false, true}) {
    absl::StatusOr<std::string> s = tok.Decode(ids, skip);
    FUZZ_CHECK(s.ok() == all_known, "Decode ok=%d but all ids known=%d", s.ok(), all_known);
    if (!s.ok()) {
      FUZZ_CHECK(s.status().message().size() <= kMaxMessageBytes, "unbounded error message");
    }
  }
}

void Incremental(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> known;
  tokenizer::IncrementalDecoder dec(tok);
  std::string streamed;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = dec.Add(id);
    if (!piece.ok()) {
      FUZZ_CHECK(!tok.TokenBytes(id).ok(), "Add refused a known id %d", id);
      continue;  // an unknown id is skipped; the stream goes on
    }
    known.push_back(id);
    FUZZ_CHECK(IsValidUtf8(*piece), "a streamed piece is not valid UTF-8");
    streamed += *piece;
  }
  streamed += dec.Flush();
  FUZZ_CHECK(IsValidUtf8(streamed), "streamed text is not valid UTF-8");
  absl::StatusOr<std::string> whole = tok.Decode(known);
  FUZZ_CHECK(whole.ok(), "known ids did not decode");
  FUZZ_CHECK(streamed == tokenizer::ToValidUtf8(*whole),
             "streamed text differs from the one-shot decode (%zu vs %zu bytes)", streamed.size(),
             whole->size());
}

}  // namespace
}  // namespace cascade::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cascade::fuzz;
  if (size == 0) return 0;
  const cascade::tokenizer::Tokenizer& tok = Qwen3();
  const uint8_t mode = data[0] % 3;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0) {
    Encode(tok, rest);
  } else {
    std::vector<int32_t> ids = Ids(data + 1, size - 1, tok.vocab_size());
    if (mode == 1) {
      Decode(tok, ids);
    } else {
      Incremental(tok, ids);
    }
  }
  return 0;
}
