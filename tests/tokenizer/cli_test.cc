// The `tokenize` / `detokenize` command functions: line-for-line JSON in and out, special
// tokens recognised, and a bad line stops with its line number on the error stream.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "services/tokenizer/tokenizer.h"
#include "tests/tokenizer/qwen3_tokenizer.h"

namespace cascade::tokenizer {
namespace {

using ::cascade::tokenizer::testutil::Qwen3;
using ::testing::HasSubstr;

TEST(CliTest, TokenizePrintsOneIdArrayPerLine) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  std::istringstream in("\"Hello world\"\n\n\"<|im_start|>user\\n你好\"\n");
  std::ostringstream out, err;
  ASSERT_TRUE(RunTokenizeCommand(in, out, *t, &err).ok());
  EXPECT_EQ(out.str(), "[9707,1879]\n\n[151644,872,198,108386]\n");
  EXPECT_EQ(err.str(), "");
}

TEST(CliTest, DetokenizeInvertsTokenize) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  std::istringstream in("[9707,1879]\n[151644,872,198,108386]\n[]\n");
  std::ostringstream out;
  ASSERT_TRUE(RunDetokenizeCommand(in, out, *t).ok());
  EXPECT_EQ(out.str(), "\"Hello world\"\n\"<|im_start|>user\\n你好\"\n\"\"\n");
}

TEST(CliTest, DetokenizeReplacesASplitCodePoint) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  // The first byte-level token of a rare character alone is not valid UTF-8.
  std::vector<int32_t> ids = *t->Encode("𪚥");
  ASSERT_GT(ids.size(), 1u);
  std::istringstream in("[" + std::to_string(ids[0]) + "]\n");
  std::ostringstream out;
  ASSERT_TRUE(RunDetokenizeCommand(in, out, *t).ok());
  EXPECT_EQ(out.str(), "\"\xEF\xBF\xBD\"\n");
}

TEST(CliTest, BadLinesFailWithTheirLineNumber) {
  const Tokenizer* t = Qwen3();
  ASSERT_NE(t, nullptr);
  struct Case {
    bool tokenize;
    std::string input;
    std::string expected;
  };
  const Case cases[] = {
      {true, "\"ok\"\nnot json\n\"never reached\"\n", "line 2: not JSON"},
      {true, "\"ok\"\n\n[1,2]\n", "line 3: expected a JSON string"},
      {false, "[1]\n{\"a\":1}\n", "line 2: expected a JSON array"},
      {false, "[1, -3]\n", "line 1: not a token id: -3"},
      {false, "[1, 999999999]\n", "line 1: not a token id: 999999999"},
      {false, "[\"x\"]\n", "line 1: not a token id: \"x\""},
  };
  for (const Case& c : cases) {
    std::istringstream in(c.input);
    std::ostringstream out, err;
    absl::Status s = c.tokenize ? RunTokenizeCommand(in, out, *t, &err)
                                : RunDetokenizeCommand(in, out, *t, &err);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.input;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expected));
    EXPECT_THAT(err.str(), HasSubstr(c.expected));
    EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("never reached")));
  }
}

}  // namespace
}  // namespace cascade::tokenizer
