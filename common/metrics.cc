// Metrics registry and text exposition: see metrics.h.
#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/absl_compat.h"
#include "prometheus/client_metric.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

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

}  // namespace

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;
  impl_->Increment(delta);
}
double Counter::Value() const { return impl_->Value(); }

void Gauge::Set(double value) { impl_->Set(value); }
void Gauge::Increment(double delta) { impl_->Increment(delta); }
double Gauge::Value() const { return impl_->Value(); }

void Histogram::Observe(double value) { impl_->Observe(value); }

Histogram::Snapshot Histogram::Read() const {
  const prometheus::ClientMetric m = impl_->Collect();
  Snapshot s;
  for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
    if (!std::isinf(b.upper_bound)) s.bounds.push_back(b.upper_bound);
    s.cumulative.push_back(b.cumulative_count);
  }
  s.sum = m.histogram.sample_sum;
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

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry& MetricsRegistry::Default() {
  static MetricsRegistry* registry = new MetricsRegistry;  // outlives every user thread
  return *registry;
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(std::string_view name, std::string_view help,
                                                    Type type, const std::vector<double>& bounds,
                                                    const Labels& labels) {
  if (!ValidName(name, /*allow_colon=*/true))
    Die(absl::StrCat("bad metric name '", ToAbsl(name), "'"));
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
          Die(absl::StrCat("histogram ", ToAbsl(name),
                           " needs finite, strictly increasing buckets"));
        }
      }
    }
    Family f{type, std::string(help), bounds};
    const std::string n(name), h(help);
    switch (type) {
      case Type::kCounter:
        f.counter_family = &prometheus::BuildCounter().Name(n).Help(h).Register(*registry_);
        break;
      case Type::kGauge:
        f.gauge_family = &prometheus::BuildGauge().Name(n).Help(h).Register(*registry_);
        break;
      case Type::kHistogram:
        f.histogram_family = &prometheus::BuildHistogram().Name(n).Help(h).Register(*registry_);
        break;
    }
    it = families_.emplace(n, std::move(f)).first;
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
  if (slot == nullptr) {
    slot = std::make_unique<Counter>(&families_.find(name)->second.counter_family->Add(labels));
  }
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kGauge, {}, labels).gauges[labels];
  if (slot == nullptr) {
    slot = std::make_unique<Gauge>(&families_.find(name)->second.gauge_family->Add(labels));
  }
  return slot.get();
}

void MetricsRegistry::RemoveGauge(std::string_view name, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto family = families_.find(name);
  if (family == families_.end() || family->second.type != Type::kGauge) return;
  auto series = family->second.gauges.find(labels);
  if (series == family->second.gauges.end()) return;
  family->second.gauge_family->Remove(series->second->impl_);
  family->second.gauges.erase(series);
}

Histogram* MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                         const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kHistogram, bounds, labels).histograms[labels];
  if (slot == nullptr) {
    slot = std::make_unique<Histogram>(
        &families_.find(name)->second.histogram_family->Add(labels, bounds));
  }
  return slot.get();
}

std::string MetricsRegistry::RenderText() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) {
              return a.name < b.name;
            });
  for (prometheus::MetricFamily& f : families) {
    std::sort(f.metric.begin(), f.metric.end(),
              [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
                return a.label < b.label;
              });
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace cascade::common
