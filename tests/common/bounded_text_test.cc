// What a server echoes of its input is bounded and printable, status messages are capped
// without splitting a code point, and client ids are checked for what gRPC metadata accepts.
#include "common/bounded_text.h"

#include <gtest/gtest.h>

namespace cascade::common {
namespace {

TEST(BoundedTextTest, ExcerptKeepsShortPrintableTextAsIs) {
  EXPECT_EQ(Excerpt("qwen3-0.6b"), "qwen3-0.6b");
}

TEST(BoundedTextTest, ExcerptCutsLongInputAndSaysHowLongItWas) {
  const std::string e = Excerpt(std::string(100000, 'm'));
  EXPECT_LE(e.size(), 64u + 32u);
  EXPECT_NE(e.find("...(100000 bytes)"), std::string::npos);
}

TEST(BoundedTextTest, ExcerptEscapesControlAndNonAsciiBytes) {
  EXPECT_EQ(Excerpt(std::string("a\nb\0c\xc3\xa9", 7)), "a\\x0ab\\x00c\\xc3\\xa9");
  EXPECT_EQ(Excerpt("back\\slash"), "back\\x5cslash");
}

TEST(BoundedTextTest, CapStatusMessageLeavesShortMessagesAlone) {
  EXPECT_EQ(CapStatusMessage("chunks[0].text is empty"), "chunks[0].text is empty");
}

TEST(BoundedTextTest, CapStatusMessageCutsOnACodePointBoundary) {
  std::string msg;
  while (msg.size() < 3000) msg += "\xe4\xbd\xa0";  // U+4F60, three bytes
  const std::string capped = CapStatusMessage(msg);
  EXPECT_LE(capped.size(), kMaxStatusMessageBytes);
  const std::string mark = "...(truncated)";
  ASSERT_GE(capped.size(), mark.size());
  EXPECT_EQ(capped.substr(capped.size() - mark.size()), mark);
  EXPECT_EQ((capped.size() - mark.size()) % 3, 0u) << "a code point was split";
}

TEST(BoundedTextTest, IdsMustBeVisibleAsciiAndShort) {
  EXPECT_TRUE(CheckIdField("request_id", "").ok());
  EXPECT_TRUE(CheckIdField("request_id", "req-1_a.b:c/d~").ok());
  for (std::string bad : {std::string("a\nb"), std::string("a\0b", 3), std::string("s\xc3\xa9"),
                          std::string("a b"), std::string(129, 'x')}) {
    absl::Status s = CheckIdField("request_id", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << Excerpt(bad);
    EXPECT_NE(s.message().find("request_id"), absl::string_view::npos);
  }
  EXPECT_TRUE(CheckIdField("request_id", std::string(129, 'x'), 256).ok());
}

}  // namespace
}  // namespace cascade::common
