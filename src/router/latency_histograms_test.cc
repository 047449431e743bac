#include "router/latency_histograms.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace gpuha::router {
namespace {

using std::chrono::milliseconds;

TEST(LatencyHistogramsTest, ObservationsLandInTheirBucketTenantAndClass) {
  LatencyHistograms a, b;  // two loops
  a.Observe("acme", 200, milliseconds(3));
  a.Observe("acme", 204, milliseconds(40));
  b.Observe("acme", 200, milliseconds(120000));  // past the last bound: +Inf
  b.Observe("acme", 503, milliseconds(1));
  a.Observe("", 0, milliseconds(2));  // no tenant, no answer (client gone)
  LatencyHistograms::Map all;
  a.AddTo(&all);
  b.AddTo(&all);
  ASSERT_EQ(all.size(), 3u);
  // The bucket whose upper bound is `le` seconds.
  auto le = [](double bound) {
    const auto& k = LatencyHistograms::kBounds;
    return static_cast<size_t>(std::find(k.begin(), k.end(), bound) - k.begin());
  };
  const auto& ok = all.at({"acme", "2xx"});
  EXPECT_EQ(ok.buckets[le(0.005)], 1u);  // 3 ms: (2.5, 5] ms
  EXPECT_EQ(ok.buckets[le(0.04)], 1u);   // 40 ms: (30, 40] ms
  EXPECT_EQ(ok.buckets.back(), 1u);
  EXPECT_NEAR(ok.sum, 120.043, 1e-9);
  EXPECT_EQ(all.at({"acme", "5xx"}).buckets[le(0.001)], 1u);
  EXPECT_EQ(all.at({"", "none"}).buckets[le(0.0025)], 1u);
}

// Prometheus' default bounds up to 60 s are all kept (no `le` series goes
// away), and the bounds rise.
TEST(LatencyHistogramsTest, TheBoundsKeepPrometheusDefaultsAndRise) {
  const auto& k = LatencyHistograms::kBounds;
  for (double d : {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0}) {
    EXPECT_NE(std::find(k.begin(), k.end(), d), k.end()) << d;
  }
  EXPECT_TRUE(std::is_sorted(k.begin(), k.end()));
}

}  // namespace
}  // namespace gpuha::router
