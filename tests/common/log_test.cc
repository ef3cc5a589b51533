// Structured logs: text and JSON lines carry timestamp, level, event and typed fields, the level
// filter works, and lines from many threads never interleave.
#include "common/log.h"

#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cascade::common {
namespace {

using ::testing::HasSubstr;

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
    });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(LogLevel::kInfo);
    SetLogFormat(LogFormat::kText);
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(LogTest, TextLineHasKeyValuesAndQuotesOnlyWhenNeeded) {
  absl::Time t = absl::FromUnixSeconds(1700000000);
  std::string line =
      FormatLogLine(LogFormat::kText, t, LogLevel::kWarn, "queue_full",
                    {{"model", "qwen3"}, {"depth", 12}, {"msg", "two words"}, {"ok", false}});
  EXPECT_EQ(line,
            "ts=2023-11-14T22:13:20.000000Z level=warn event=queue_full model=qwen3 depth=12 "
            "msg=\"two words\" ok=false\n");
}

TEST_F(LogTest, JsonLineIsValidJsonWithTypedValues) {
  std::string line = FormatLogLine(LogFormat::kJson, absl::Now(), LogLevel::kInfo, "done",
                                   {{"id", "a\"b\n"},
                                    {"tokens", 42},
                                    {"ratio", 0.25},
                                    {"cached", true},
                                    {"took", absl::Milliseconds(1500)},
                                    {"status", absl::NotFoundError("gone")}});
  ASSERT_EQ(line.back(), '\n');
  nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["event"], "done");
  EXPECT_EQ(j["id"], "a\"b\n");
  EXPECT_EQ(j["tokens"], 42);
  EXPECT_DOUBLE_EQ(j["ratio"].get<double>(), 0.25);
  EXPECT_EQ(j["cached"], true);
  EXPECT_EQ(j["took"], "1.5s");
  EXPECT_THAT(j["status"].get<std::string>(), HasSubstr("gone"));
  EXPECT_TRUE(j.contains("ts"));
}

// A client's bytes may be anything: a field with invalid UTF-8 and control characters still
// gives a line that parses as JSON, the bad bytes replaced by U+FFFD.
TEST_F(LogTest, JsonLineStaysValidForBytesThatAreNotUtf8) {
  std::string bad = "ok\xff\xc3(\x01\x7f";
  std::string line =
      FormatLogLine(LogFormat::kJson, absl::Now(), LogLevel::kWarn, bad, {{"request_id", bad}});
  nlohmann::json j = nlohmann::json::parse(line);  // throws on invalid JSON
  EXPECT_EQ(j["event"], "ok\xef\xbf\xbd\xef\xbf\xbd(\x01\x7f");
  EXPECT_EQ(j["request_id"], j["event"]);
  EXPECT_THAT(line, HasSubstr("\\u0001"));
}

TEST_F(LogTest, LevelFilterDropsLessSevereEvents) {
  SetLogLevel(LogLevel::kWarn);
  LogDebug("d");
  LogInfo("i");
  LogWarn("w");
  LogError("e");
  std::vector<std::string> got = lines();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_THAT(got[0], HasSubstr("level=warn event=w"));
  EXPECT_THAT(got[1], HasSubstr("level=error event=e"));
}

TEST_F(LogTest, ConcurrentLinesStayWhole) {
  SetLogFormat(LogFormat::kJson);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) LogInfo("tick", {{"thread", t}, {"i", i}});
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::string> got = lines();
  ASSERT_EQ(got.size(), 1600u);
  for (const std::string& line : got) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << line;
  }
}

TEST_F(LogTest, ParsesLevelAndFormatNames) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_FALSE(ParseLogLevel("loud").ok());
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("yaml").ok());
}

}  // namespace
}  // namespace cascade::common
