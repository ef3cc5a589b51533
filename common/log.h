// Structured, leveled logs for Cascade's servers: one line per event on stderr, either
// `ts=... level=info event=name key=value ...` text or one JSON object per line.
//   LogInfo("request_done", {{"request_id", id}, {"tokens", n}, {"ok", true}});
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cascade::common {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kText, kJson };

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view text);    // debug|info|warn|error
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view text);  // text|json
std::string_view LogLevelName(LogLevel level);

// One field's value, converted at the call site; numbers and bools stay unquoted in JSON.
class LogValue {
 public:
  LogValue(std::string_view v) : text_(v), is_string_(true) {}    // NOLINT: implicit on purpose
  LogValue(const std::string& v) : text_(v), is_string_(true) {}  // NOLINT
  LogValue(const char* v) : text_(v == nullptr ? "" : v), is_string_(true) {}  // NOLINT
  LogValue(bool v) : text_(v ? "true" : "false"), is_string_(false) {}         // NOLINT
  LogValue(int v) : LogValue(static_cast<long>(v)) {}                          // NOLINT
  LogValue(long v);                                                            // NOLINT
  LogValue(long long v) : LogValue(static_cast<long>(v)) {}                    // NOLINT
  LogValue(unsigned v) : LogValue(static_cast<unsigned long>(v)) {}            // NOLINT
  LogValue(unsigned long v);                                                   // NOLINT
  LogValue(unsigned long long v) : LogValue(static_cast<unsigned long>(v)) {}  // NOLINT
  LogValue(double v);                                                          // NOLINT
  LogValue(absl::Duration v);                                                  // NOLINT
  LogValue(const absl::Status& v);                                             // NOLINT

  const std::string& text() const { return text_; }
  bool is_string() const { return is_string_; }

 private:
  std::string text_;
  bool is_string_;
};

struct LogField {
  std::string_view key;
  LogValue value;
};

// Process-wide settings. Thread-safe; typically set once by RunServer from the flags.
void SetLogLevel(LogLevel level);
void SetLogFormat(LogFormat format);
LogLevel GetLogLevel();
bool LogEnabled(LogLevel level);
// Where finished lines go (each call gets one complete line, newline included). The default
// writes to stderr. Tests capture lines with this; pass nullptr to restore the default.
void SetLogSink(std::function<void(std::string_view line)> sink);

// Writes one event if `level` is enabled. Thread-safe: lines from different threads never
// interleave. Keys should be snake_case; values are escaped as the format needs.
void Log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});

inline void LogDebug(std::string_view event, std::initializer_list<LogField> fields = {}) {
  if (LogEnabled(LogLevel::kDebug)) Log(LogLevel::kDebug, event, fields);
}
inline void LogInfo(std::string_view event, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kInfo, event, fields);
}
inline void LogWarn(std::string_view event, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kWarn, event, fields);
}
inline void LogError(std::string_view event, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kError, event, fields);
}

// The line Log() would write, without the level filter or the sink; exposed for tests.
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level, std::string_view event,
                          std::initializer_list<LogField> fields);

}  // namespace cascade::common
