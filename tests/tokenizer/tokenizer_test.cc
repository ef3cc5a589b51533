// Encoding and decoding: pinned Qwen3 ids, merge order and merge file formats on a synthetic
// vocab, added-token splitting (longest match, lstrip/rstrip), NFC, errors, and speed.
#include "services/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "services/tokenizer/bpe.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::tokenizer {
namespace {

using ::cascade::tokenizer::testutil::Qwen3;
using ::testing::ElementsAre;
using json = nlohmann::json;

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view text) {
  absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// A tiny byte-level BPE: ids 0..255 are the bytes, then the merges' results in order.
// `array_merges` picks the ["a","b"] merge format over the older "a b" one.
std::string TinyTokenizerJson(const std::vector<std::pair<std::string, std::string>>& merges,
                              bool array_merges, const json& added_tokens = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[internal::BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  }
  json merge_list = json::array();
  int next_id = 256;
  for (const auto& [l, r] : merges) {
    const std::string ls = internal::BytesToByteLevel(l), rs = internal::BytesToByteLevel(r);
    if (!vocab.contains(ls + rs)) vocab[ls + rs] = next_id++;
    if (array_merges) {
      merge_list.push_back(json::array({ls, rs}));
    } else {
      merge_list.push_back(ls + " " + rs);
    }
  }
  json root = {
      {"version", "1.0"},
      {"added_tokens", added_tokens},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
  };
  return root.dump();
}

std::unique_ptr<Tokenizer> Tiny(const std::string& tokenizer_json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(tokenizer_json, "");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(TokenizerTest, Qwen3LoadsWithItsAddedTokensAndEos) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 151669);
  EXPECT_EQ(t->AddedTokenId("<|im_start|>"), 151644);
  EXPECT_EQ(t->eos_id(), 151645);
  EXPECT_TRUE(t->IsSpecial(151645));
  EXPECT_FALSE(t->IsSpecial(151657));  // <tool_call> is added but not special
  EXPECT_FALSE(t->IsSpecial(9707));
}

TEST(TokenizerTest, Qwen3EncodesPinnedIds) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "Hello world"), ElementsAre(9707, 1879));
  EXPECT_THAT(Enc(*t, "<|im_start|>user\n你好<|im_end|>\n"),
              ElementsAre(151644, 872, 198, 108386, 151645, 198));
  EXPECT_THAT(Enc(*t, ""), ElementsAre());
}

TEST(TokenizerTest, AddedTokensAreSplitOutBeforeTheRegex) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // Without the split, "x<|" would be one pre-token and merge; with it, the token stays whole.
  const std::vector<int32_t> ids = Enc(*t, "x<|im_end|>y");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 151645);
  EXPECT_EQ(ids[0], Enc(*t, "x")[0]);
  EXPECT_EQ(ids[2], Enc(*t, "y")[0]);
  // A near miss is ordinary text.
  for (int32_t id : Enc(*t, "<|im_end|")) EXPECT_LT(id, 151643);
}

TEST(TokenizerTest, MergesApplyByRankLeftmostFirst) {
  // "ab" outranks "bc": "abc" -> "ab" "c". "aa" on "aaa" -> leftmost first: "aa" "a".
  auto t = Tiny(TinyTokenizerJson({{"a", "b"}, {"b", "c"}, {"a", "a"}}, true));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "abc"), ElementsAre(256, 'c'));
  EXPECT_THAT(Enc(*t, "bcab"), ElementsAre(257, 256));
  EXPECT_THAT(Enc(*t, "aaa"), ElementsAre(258, 'a'));
  // Merges chain: "ab"+"c" only if that merge exists.
  auto t2 = Tiny(TinyTokenizerJson({{"b", "c"}, {"a", "bc"}, {"a", "b"}}, true));
  ASSERT_NE(t2, nullptr);
  EXPECT_THAT(Enc(*t2, "abc"), ElementsAre(257));
}

TEST(TokenizerTest, StringAndArrayMergeFormatsGiveTheSameIds) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"}, {"h", "e"}, {" t", "he"}, {"e", "r"}, {" the", "r"}, {"1", "2"}};
  auto a = Tiny(TinyTokenizerJson(merges, /*array_merges=*/true));
  auto s = Tiny(TinyTokenizerJson(merges, /*array_merges=*/false));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(s, nullptr);
  for (std::string_view text : {"over there, the other 123", " ther", "\t\tthe  \n"}) {
    EXPECT_EQ(Enc(*a, text), Enc(*s, text)) << text;
  }
  EXPECT_THAT(Enc(*a, " ther"), ElementsAre(260));
}

TEST(TokenizerTest, LongestAddedTokenWinsAndStripFlagsSwallowWhitespace) {
  json added = json::array({
      {{"id", 300}, {"content", "<a>"}, {"special", true}},
      {{"id", 301}, {"content", "<a>b"}, {"special", true}},
      {{"id", 302}, {"content", "[L]"}, {"lstrip", true}},
      {{"id", 303}, {"content", "[R]"}, {"rstrip", true}},
  });
  auto t = Tiny(TinyTokenizerJson({}, true, added));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t, "<a>b<a>"), ElementsAre(301, 300));
  EXPECT_THAT(Enc(*t, "x  [L]y"), ElementsAre('x', 302, 'y'));
  EXPECT_THAT(Enc(*t, "x[R] \n y"), ElementsAre('x', 303, 'y'));
  EXPECT_THAT(Enc(*t, "x [R]"), ElementsAre('x', ' ', 303));
}

TEST(TokenizerTest, InputIsNfcNormalized) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "caf\u00e9"), Enc(*t, "cafe\u0301"));
  EXPECT_EQ(Enc(*t, "\u1100\u1161"), Enc(*t, "\uac00"));  // Hangul jamo compose
}

TEST(TokenizerTest, NelCountsAsWhitespaceLikeHuggingFace) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // Ids from HF tokenizers 0.23.2 (the JS port splits " \u0085x" differently: its \s lacks NEL).
  EXPECT_THAT(Enc(*t, " \u0085x"), ElementsAre(220, 126, 227, 87));
  EXPECT_THAT(Enc(*t, "x \u0085\u0085 y"), ElementsAre(87, 2139, 227, 126, 227, 379));
  EXPECT_THAT(Enc(*t, "\u0085\n"), ElementsAre(126, 227, 198));
}

TEST(TokenizerTest, DecodeRoundTripsNfcText) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  for (std::string_view text :
       {"Hello, world!", "  leading and trailing  \n\n", "日本語のテキスト、句読点。",
        "مرحبا بالعالم", "नमस्ते दुनिया", "👨‍👩‍👧‍👦 family 🇯🇵",
        "int main() {\n\treturn 0;\n}\n", "<|im_start|>system\nYou are helpful.<|im_end|>\n",
        "12345678901234567890"}) {
    absl::StatusOr<std::string> back = t->Decode(Enc(*t, text));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  absl::StatusOr<std::string> skipped = t->Decode(Enc(*t, "<|im_start|>hi<|im_end|>"), true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "hi");
}

TEST(TokenizerTest, BadInputIsInvalidArgument) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("ab\xff").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Encode("\xe4\xbd").status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {9707, 151669};
  EXPECT_EQ(t->Decode(bad).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> negative = {-1};
  EXPECT_EQ(t->Decode(negative).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("{", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson(R"({"model": {"type": "WordPiece"}})", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Load("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerTest, EncodesOneMegabyteWellUnderASecond) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // Distinct words (a counter in each) so the word cache cannot carry the whole load.
  std::string text;
  for (int i = 0; text.size() < (1 << 20); ++i) {
    text += "The quick brown fox " + std::to_string(i * 7919) +
            " jumps over the lazy dog. 快速的棕色狐狸跳过了懒狗。 مرحبا\n\tindent_" +
            std::to_string(i) + "();\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = Enc(*t, text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s\n", text.size(), ids.size(), seconds);
  EXPECT_GT(ids.size(), text.size() / 8);
  // Generous bound so sanitizer and debug builds pass; a release build takes a fraction of it.
  EXPECT_LT(seconds, 3.0);
}

}  // namespace
}  // namespace cascade::tokenizer
