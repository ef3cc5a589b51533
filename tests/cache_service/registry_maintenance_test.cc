// The registry's per-worker metrics over a worker's life: published while it holds a lease, 0
// (up 0) once it departs, and gone from the exposition after the departed-series time, so worker
// ids that churn (a pod's name per restart) do not grow /metrics without bound; a worker that
// comes back is published again.
#include "cache_service/server/registry_maintenance.h"

#include <gtest/gtest.h>

#include <string>

#include "cache_service/registry/clock.h"
#include "cache_service/registry/registry.h"
#include "common/metrics.h"
#include "tests/cache_service/registry_test_util.h"

namespace cascade::registry {
namespace {

TEST(RegistryMaintenanceTest, ADepartedWorkersSeriesReadZeroThenLeaveTheExposition) {
  FakeClock clock;
  RegistryOptions o;
  o.clock = &clock;
  o.lease_ms = 3'600'000;  // w1 stays live while the clock moves past w0's departed-series time
  Registry reg(o);
  common::MetricsRegistry metrics;
  constexpr int64_t kDepartedMs = 60'000;
  RegistryMaintenance m(&reg, &metrics, 1000, kDepartedMs);
  const std::string up_w0 = "cascade_registry_worker_up{model=\"m\",worker=\"w0\"}";
  const std::string up_w1 = "cascade_registry_worker_up{model=\"m\",worker=\"w1\"}";

  ASSERT_TRUE(reg.RegisterWorker(testing::Info("w0")).ok());
  ASSERT_TRUE(reg.RegisterWorker(testing::Info("w1")).ok());
  m.RunOnce();
  std::string text = metrics.RenderText();
  EXPECT_NE(text.find(up_w0 + " 1"), std::string::npos) << text;
  EXPECT_NE(text.find(up_w1 + " 1"), std::string::npos) << text;

  ASSERT_TRUE(reg.DeregisterWorker("w0").ok());
  m.RunOnce();
  text = metrics.RenderText();
  EXPECT_NE(text.find(up_w0 + " 0"), std::string::npos) << text;  // seen to go
  clock.AdvanceMs(kDepartedMs - 1);
  ASSERT_TRUE(reg.Heartbeat("w1", {}).ok());
  m.RunOnce();
  EXPECT_NE(metrics.RenderText().find(up_w0 + " 0"), std::string::npos);
  clock.AdvanceMs(1);
  m.RunOnce();
  text = metrics.RenderText();
  EXPECT_EQ(text.find("worker=\"w0\""), std::string::npos) << text;  // every series of w0
  EXPECT_NE(text.find(up_w1 + " 1"), std::string::npos) << text;     // w1 untouched

  // Back again: published again, and its departure timed afresh.
  ASSERT_TRUE(reg.RegisterWorker(testing::Info("w0")).ok());
  m.RunOnce();
  EXPECT_NE(metrics.RenderText().find(up_w0 + " 1"), std::string::npos);
  ASSERT_TRUE(reg.DeregisterWorker("w0").ok());
  m.RunOnce();
  clock.AdvanceMs(kDepartedMs / 2);
  ASSERT_TRUE(reg.Heartbeat("w1", {}).ok());
  m.RunOnce();
  EXPECT_NE(metrics.RenderText().find(up_w0 + " 0"), std::string::npos);
}

TEST(MetricsRegistryTest, RemoveGaugeDropsOneSeriesAndIgnoresWhatIsNotThere) {
  common::MetricsRegistry metrics;
  metrics.GetGauge("g", "A gauge.", {{"k", "a"}})->Set(1);
  metrics.GetGauge("g", "A gauge.", {{"k", "b"}})->Set(2);
  metrics.RemoveGauge("g", {{"k", "a"}});
  metrics.RemoveGauge("g", {{"k", "zzz"}});  // no such series
  metrics.RemoveGauge("nope", {});           // no such family
  std::string text = metrics.RenderText();
  EXPECT_EQ(text.find("g{k=\"a\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("g{k=\"b\"} 2"), std::string::npos) << text;
  // Asked for again, it is a new series from 0.
  EXPECT_EQ(metrics.GetGauge("g", "A gauge.", {{"k", "a"}})->Value(), 0.0);
}

}  // namespace
}  // namespace cascade::registry
