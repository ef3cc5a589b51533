// UTF-8 validation and repair, and the streaming decoder: it never emits part of a code point,
// even when Qwen3 splits one over several byte-level tokens, and repairs what can never be valid.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/tokenizer/tokenizer.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::tokenizer {
namespace {

using ::cascade::tokenizer::testutil::Qwen3;

constexpr char kFffd[] = "\xEF\xBF\xBD";

// The id of the single-byte token for `byte`.
int32_t ByteToken(const Tokenizer& t, uint8_t byte) {
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    absl::StatusOr<std::string_view> b = t.TokenBytes(id);
    if (b.ok() && b->size() == 1 && static_cast<uint8_t>((*b)[0]) == byte) return id;
  }
  ADD_FAILURE() << "no token for byte " << int{byte};
  return -1;
}

TEST(Utf8Test, IsValidUtf8RejectsOverlongSurrogatesOutOfRangeAndTruncated) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC2\x80 \xE0\xA0\x80 \xED\x9F\xBF \xF0\x90\x80\x80 \xF4\x8F\xBF\xBF"));
  EXPECT_TRUE(IsValidUtf8("日本語 👨‍👩‍👧"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong, 3 bytes
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\x80"));        // lone continuation
  EXPECT_FALSE(IsValidUtf8("ab\xE6\x97"));  // truncated at the end
  EXPECT_FALSE(IsValidUtf8("\xE6\x97x"));   // truncated in the middle
  EXPECT_FALSE(IsValidUtf8(std::string("\xFF", 1)));
}

TEST(Utf8Test, ToValidUtf8ReplacesEachMaximalSubpartOnce) {
  const std::string f = kFffd;
  EXPECT_EQ(ToValidUtf8("ok 日本"), "ok 日本");
  EXPECT_EQ(ToValidUtf8("a\x80"
                        "b"),
            "a" + f + "b");
  EXPECT_EQ(ToValidUtf8("\xF0\x9F\x98"), f);  // truncated emoji: one U+FFFD
  EXPECT_EQ(ToValidUtf8("\xF0\x9F\x98x"), f + "x");
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), f + f);          // C0 is never a lead byte
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), f + f + f);  // surrogate: ED then 2 strays
  EXPECT_EQ(ToValidUtf8("\xE6\x97\xA5\xE6"), "日" + f);
  EXPECT_TRUE(IsValidUtf8(ToValidUtf8("\xFF\xFE\xF8\x88\x80\x80\x80")));
}

TEST(IncrementalDecoderTest, MultiByteCharactersSplitOverTokensAreHeldUntilComplete) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  const std::string text =
      "Emoji 👨‍👩‍👧‍👦🇯🇵🤗 and rare CJK 𠀀𪚥龘 and ꙮ, "
      "Hindi नमस्ते, "
      "Arabic مرحبا.";
  absl::StatusOr<std::vector<int32_t>> ids = t->Encode(text);
  ASSERT_TRUE(ids.ok());
  // The test is only meaningful if some token ends inside a code point.
  int partial_tokens = 0;
  for (int32_t id : *ids) partial_tokens += IsValidUtf8(*t->TokenBytes(id)) ? 0 : 1;
  ASSERT_GT(partial_tokens, 3) << "no token splits a code point; pick rarer characters";

  IncrementalDecoder decoder(*t);
  std::string streamed;
  int held_steps = 0;
  for (int32_t id : *ids) {
    absl::StatusOr<std::string> piece = decoder.Add(id);
    ASSERT_TRUE(piece.ok()) << piece.status();
    EXPECT_TRUE(IsValidUtf8(*piece)) << "emitted a split code point after id " << id;
    if (piece->empty()) ++held_steps;
    streamed += *piece;
  }
  EXPECT_GT(held_steps, 0);
  EXPECT_EQ(decoder.Flush(), "");
  EXPECT_EQ(streamed, text);
}

TEST(IncrementalDecoderTest, FlushReplacesAnIncompleteTailAndInvalidBytesAreNotHeld) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  IncrementalDecoder decoder(*t);
  // "日" is E6 97 A5: feed two of its bytes, then end the stream.
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0xE6)), "");
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0x97)), "");
  EXPECT_EQ(decoder.Flush(), kFffd);
  EXPECT_EQ(decoder.Flush(), "");

  // A lead byte followed by ASCII can never complete: replaced at once, the ASCII kept.
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0xE6)), "");
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 'a')), std::string(kFffd) + "a");
  // A stray continuation byte and a byte that is never valid.
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0x80)), kFffd);
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0xFF)), kFffd);
  // A special token in the middle of a code point ends it.
  EXPECT_EQ(*decoder.Add(ByteToken(*t, 0xF0)), "");
  EXPECT_EQ(*decoder.Add(t->AddedTokenId("<|im_end|>")), std::string(kFffd) + "<|im_end|>");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(IncrementalDecoderTest, SkipsSpecialTokensWhenAskedAndRejectsUnknownIds) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  IncrementalDecoder decoder(*t, /*skip_special=*/true);
  EXPECT_EQ(*decoder.Add(t->AddedTokenId("<|im_end|>")), "");
  EXPECT_EQ(*decoder.Add(9707), "Hello");
  EXPECT_EQ(decoder.Add(-5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoder.Add(t->vocab_size()).status().code(), absl::StatusCode::kInvalidArgument);
}

// DecodeText: Decode made valid UTF-8 (a prompt's ids may end inside a code point).
TEST(TokenizerTest, DecodeTextReplacesACodePointCutShortAndRejectsUnknownIds) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // "Hello" and two of the three bytes of "日" (E6 97 A5).
  const std::vector<int32_t> ids = {9707, ByteToken(*t, 0xE6), ByteToken(*t, 0x97)};
  EXPECT_FALSE(IsValidUtf8(*t->Decode(ids)));
  EXPECT_EQ(*t->DecodeText(ids), std::string("Hello") + kFffd);
  EXPECT_EQ(t->DecodeText(std::vector<int32_t>{9707, -5}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cascade::tokenizer
