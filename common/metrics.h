// Prometheus metrics: counters, gauges and histograms with labels in a registry that renders the
// text exposition format (version 0.0.4), served at GET /metrics by MetricsHttpServer. The
// storage and the exposition are prometheus-cpp's.
//   Counter* c = MetricsRegistry::Default().GetCounter("cascade:requests_total", "Requests.",
//                                                       {{"model", "qwen3"}});
//   c->Increment();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace cascade::common {

// Label name -> value. Order does not matter: {{"a","1"},{"b","2"}} and {{"b","2"},{"a","1"}}
// name the same series.
using Labels = std::map<std::string, std::string>;

// The metric objects are prometheus-cpp's (Debian's prometheus-cpp-dev, core library), held
// behind these small handles so callers need not include it; the registry below adds the checks
// that catch a wrong metric at its first use (names, label names, one type per name).

// A monotonically increasing value. Thread-safe and lock-free.
class Counter {
 public:
  explicit Counter(prometheus::Counter* impl) : impl_(impl) {}
  // REQUIRES: delta >= 0 (a negative delta is ignored: counters never go down).
  void Increment(double delta = 1.0);
  double Value() const;

 private:
  prometheus::Counter* const impl_;
};

// A value that goes up and down. Thread-safe and lock-free.
class Gauge {
 public:
  explicit Gauge(prometheus::Gauge* impl) : impl_(impl) {}
  void Set(double value);
  void Increment(double delta = 1.0);
  void Decrement(double delta = 1.0) { Increment(-delta); }
  double Value() const;

 private:
  friend class MetricsRegistry;  // RemoveGauge
  prometheus::Gauge* const impl_;
};

// Counts observations into buckets with fixed upper bounds (plus +Inf). Thread-safe.
class Histogram {
 public:
  explicit Histogram(prometheus::Histogram* impl) : impl_(impl) {}
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // [bounds.size() + 1], the last is +Inf == count
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  prometheus::Histogram* const impl_;
};

// Bucket helpers: `count` bounds start, start*factor, ... and start, start+width, ....
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);
// Latency buckets in seconds from 1 ms to 60 s, for TTFT, inter-token and RPC latencies.
std::vector<double> DefaultLatencyBuckets();

// Owns every metric; returned pointers stay valid for the registry's life. Getting the same name
// and labels again returns the same object, so modules need not coordinate. Thread-safe.
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and label names [a-zA-Z_][a-zA-Z0-9_]*; reusing a
// name with another type (or a histogram with other buckets) is a programming error and aborts
// with a message, as a wrong metric would otherwise go unnoticed.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The process-wide registry that servers expose by default.
  static MetricsRegistry& Default();

  Counter* GetCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge* GetGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  // Drops the gauge series `name` with `labels` from the exposition (nothing when there is none),
  // for series whose subject is gone for good (a departed worker's): label values that churn
  // would otherwise grow the exposition without bound. Frees the Gauge: REQUIRES no caller keeps
  // the pointer GetGauge returned for it (a later GetGauge makes a new series).
  void RemoveGauge(std::string_view name, const Labels& labels);
  Histogram* GetHistogram(std::string_view name, std::string_view help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // All metrics in the Prometheus text format (prometheus-cpp's TextSerializer), families
  // sorted by name, series by labels.
  std::string RenderText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;  // histograms only
    prometheus::Family<prometheus::Counter>* counter_family = nullptr;
    prometheus::Family<prometheus::Gauge>* gauge_family = nullptr;
    prometheus::Family<prometheus::Histogram>* histogram_family = nullptr;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family& GetFamily(std::string_view name, std::string_view help, Type type,
                    const std::vector<double>& bounds, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  std::map<std::string, Family, std::less<>> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cascade::common
