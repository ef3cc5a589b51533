// Metrics registry and text exposition: see metrics.h.
#include "common/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/absl_compat.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

[[noreturn]] void Die(std::string_view message) {
  std::fprintf(stderr, "FATAL: metrics: %.*s\n", static_cast<int>(message.size()), message.data());
  std::abort();
}

bool ValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

void AtomicAdd(std::atomic<double>& a, double delta) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + delta, std::memory_order_relaxed)) {
  }
}

// Integers print exactly ("12", not "1.2e+01"); other values with full precision.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  // Shortest text that reads back as the same double: "0.1", not "0.10000000000000001".
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

std::string EscapeLabelValue(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="1",le="0.5"}`, or "" with no labels; `extra` (the histogram's le) comes last.
std::string FormatLabels(const Labels& labels, std::string_view extra_name = {},
                         std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
    first = false;
  }
  if (!extra_name.empty()) {
    absl::StrAppend(&out, first ? "" : ",", ToAbsl(extra_name), "=\"", ToAbsl(extra_value), "\"");
  }
  out += "}";
  return out;
}

}  // namespace

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;
  AtomicAdd(value_, delta);
}

void Gauge::Increment(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  // First bucket whose upper bound is >= value (Prometheus buckets are "less or equal").
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

std::vector<double> DefaultLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

MetricsRegistry& MetricsRegistry::Default() {
  static MetricsRegistry* registry = new MetricsRegistry;  // outlives every user thread
  return *registry;
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(std::string_view name, std::string_view help,
                                                    Type type, const std::vector<double>& bounds,
                                                    const Labels& labels) {
  if (!ValidName(name, /*allow_colon=*/true)) Die(absl::StrCat("bad metric name '", ToAbsl(name), "'"));
  for (const auto& [k, v] : labels) {
    if (!ValidName(k, /*allow_colon=*/false) || k.rfind("__", 0) == 0 ||
        (type == Type::kHistogram && k == "le")) {
      Die(absl::StrCat("bad label name '", k, "' on metric ", ToAbsl(name)));
    }
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    if (type == Type::kHistogram) {
      for (size_t i = 0; i < bounds.size(); ++i) {
        if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
          Die(absl::StrCat("histogram ", ToAbsl(name), " needs finite, strictly increasing buckets"));
        }
      }
    }
    it = families_.emplace(std::string(name), Family{type, std::string(help), bounds}).first;
  }
  Family& family = it->second;
  if (family.type != type) Die(absl::StrCat("metric ", ToAbsl(name), " registered with two types"));
  if (type == Type::kHistogram && family.bounds != bounds) {
    Die(absl::StrCat("histogram ", ToAbsl(name), " registered with two bucket lists"));
  }
  return family;
}

Counter* MetricsRegistry::GetCounter(std::string_view name, std::string_view help,
                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kCounter, {}, labels).counters[labels];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kGauge, {}, labels).gauges[labels];
  if (slot == nullptr) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                         const std::vector<double>& bounds,
                                         const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kHistogram, bounds, labels).histograms[labels];
  if (slot == nullptr) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

std::string MetricsRegistry::RenderText() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    static constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", kTypeNames[static_cast<int>(family.type)], "\n");
    for (const auto& [labels, c] : family.counters) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(c->Value()), "\n");
    }
    for (const auto& [labels, g] : family.gauges) {
      absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(g->Value()), "\n");
    }
    for (const auto& [labels, h] : family.histograms) {
      Histogram::Snapshot s = h->Read();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", FormatLabels(labels, "le", le), " ",
                        s.cumulative[i], "\n");
      }
      absl::StrAppend(&out, name, "_sum", FormatLabels(labels), " ", FormatValue(s.sum), "\n");
      absl::StrAppend(&out, name, "_count", FormatLabels(labels), " ", s.cumulative.back(), "\n");
    }
  }
  return out;
}

}  // namespace cascade::common
