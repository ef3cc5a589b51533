// Structured logging: see log.h.
#include "common/log.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/absl_compat.h"
#include "common/mutex.h"
#include "nlohmann/json.hpp"

namespace cascade::common {
namespace {

using internal::ToAbsl;

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};

struct Sink {
  Mutex mu;
  std::function<void(std::string_view)> fn ABSL_GUARDED_BY(mu);
};
Sink& GetSink() {
  static Sink* sink = new Sink;  // never destroyed: threads may log during static destruction
  return *sink;
}

// JSON strings through nlohmann_json: the escapes are its, and bytes that are not UTF-8 become
// U+FFFD, so a log line is valid JSON whatever a client sent.
void AppendJsonString(std::string* out, std::string_view s) {
  out->append(nlohmann::json(std::string(s))
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Text values are quoted only when needed, so the common case stays grep-friendly.
void AppendTextValue(std::string* out, std::string_view s) {
  bool needs_quotes = s.empty();
  for (unsigned char c : s) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) needs_quotes = true;
  }
  if (needs_quotes) {
    AppendJsonString(out, s);  // the same escapes read well in text too
  } else {
    out->append(s);
  }
}

}  // namespace

LogValue::LogValue(long v) : text_(absl::StrCat(v)), is_string_(false) {}
LogValue::LogValue(unsigned long v) : text_(absl::StrCat(v)), is_string_(false) {}
LogValue::LogValue(double v) : is_string_(!std::isfinite(v)) {
  // JSON has no NaN or infinity, so those become strings.
  text_ = std::isfinite(v) ? absl::StrFormat("%.6g", v) : absl::StrCat(v);
}
LogValue::LogValue(absl::Duration v) : text_(absl::FormatDuration(v)), is_string_(true) {}
LogValue::LogValue(const absl::Status& v) : text_(v.ToString()), is_string_(true) {}

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view text) {
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "error") return LogLevel::kError;
  return absl::InvalidArgumentError("expected one of debug, info, warn, error");
}

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError("expected text or json");
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void SetLogSink(std::function<void(std::string_view line)> sink) {
  Sink& s = GetSink();
  MutexLock lock(&s.mu);
  s.fn = std::move(sink);
}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level, std::string_view event,
                          std::initializer_list<LogField> fields) {
  std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
  std::string line;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", ToAbsl(LogLevelName(level)),
                    "\",\"event\":");
    AppendJsonString(&line, event);
    for (const LogField& f : fields) {
      line.push_back(',');
      AppendJsonString(&line, f.key);
      line.push_back(':');
      if (f.value.is_string()) {
        AppendJsonString(&line, f.value.text());
      } else {
        line.append(f.value.text());
      }
    }
    line.append("}\n");
  } else {
    absl::StrAppend(&line, "ts=", ts, " level=", ToAbsl(LogLevelName(level)), " event=");
    AppendTextValue(&line, event);
    for (const LogField& f : fields) {
      absl::StrAppend(&line, " ", ToAbsl(f.key), "=");
      AppendTextValue(&line, f.value.text());
    }
    line.push_back('\n');
  }
  return line;
}

void Log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::string line =
      FormatLogLine(static_cast<LogFormat>(g_format.load()), absl::Now(), level, event, fields);
  Sink& s = GetSink();
  // One lock around the write keeps lines whole across threads.
  MutexLock lock(&s.mu);
  if (s.fn) {
    s.fn(line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace cascade::common
