#include "router/latency_histograms.h"

#include <gtest/gtest.h>

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
  const auto& ok = all.at({"acme", "2xx"});
  EXPECT_EQ(ok.buckets[0], 1u);  // <= 5 ms
  EXPECT_EQ(ok.buckets[3], 1u);  // <= 50 ms
  EXPECT_EQ(ok.buckets.back(), 1u);
  EXPECT_NEAR(ok.sum, 120.043, 1e-9);
  EXPECT_EQ(all.at({"acme", "5xx"}).buckets[0], 1u);
  EXPECT_EQ(all.at({"", "none"}).buckets[0], 1u);
}

}  // namespace
}  // namespace gpuha::router
