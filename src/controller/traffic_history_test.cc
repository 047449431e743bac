#include "controller/traffic_history.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace gpuha::controller {
namespace {

const std::vector<double> kBounds = {0.005, 0.01, 0.1, 1};

v1::RouterStats Stats(uint64_t answered, uint64_t errors, uint64_t resends,
                      std::vector<uint64_t> counts) {
  v1::RouterStats s;
  s.set_answered(answered);
  s.set_errors(errors);
  s.set_resends(resends);
  for (double b : kBounds) s.add_latency_bounds(b);
  for (uint64_t c : counts) s.add_latency_counts(c);
  return s;
}

TEST(TrafficHistoryTest, QuantileInterpolatesInsideItsBucketLikePrometheus) {
  // 100 answers: 90 under 5 ms, 10 between 10 and 100 ms.
  std::vector<uint64_t> counts = {90, 0, 10, 0, 0};
  EXPECT_DOUBLE_EQ(*TrafficHistory::Quantile(0.5, kBounds, counts), 0.005 * 50 / 90);
  EXPECT_DOUBLE_EQ(*TrafficHistory::Quantile(0.99, kBounds, counts), 0.01 + 0.09 * 9 / 10);
  EXPECT_DOUBLE_EQ(*TrafficHistory::Quantile(0.99, kBounds, {0, 0, 0, 0, 3}), 1);  // past the last
  EXPECT_FALSE(TrafficHistory::Quantile(0.99, kBounds, {0, 0, 0, 0, 0}).has_value());
  EXPECT_FALSE(TrafficHistory::Quantile(0.99, kBounds, {1, 2}).has_value());  // a bad shape
}

TEST(TrafficHistoryTest, PointsAreRatesOfWhatGrewSummedOverRouters) {
  TrafficHistory h(10);
  h.Tick(0);  // the first tick only starts the clock
  h.Report("r1", Stats(100, 0, 0, {100, 0, 0, 0, 0}), 100);
  h.Report("r2", Stats(50, 0, 0, {50, 0, 0, 0, 0}), 100);
  h.Tick(500);  // under a second: no point yet
  EXPECT_TRUE(h.points().empty());
  h.Tick(1000);
  ASSERT_EQ(h.points().size(), 1u);
  // A router's first report is a baseline: what it served before it
  // connected (or before this controller started) is not this second's.
  EXPECT_DOUBLE_EQ(h.points()[0].requests_per_s, 0);
  // r1 answers 200 more, 10 of them 5xx and slow, 4 re-sent.
  h.Report("r1", Stats(300, 10, 4, {290, 0, 0, 10, 0}), 1500);
  h.Tick(3000);
  ASSERT_EQ(h.points().size(), 2u);
  const TrafficHistory::Point& p = h.points()[1];
  EXPECT_DOUBLE_EQ(p.requests_per_s, 100);  // 200 over 2 s
  EXPECT_DOUBLE_EQ(p.errors_per_s, 5);
  EXPECT_DOUBLE_EQ(p.resends_per_s, 2);
  ASSERT_TRUE(p.p99_ms.has_value());
  EXPECT_NEAR(*p.p99_ms, 100 + 900 * 8.0 / 10, 1e-9);  // rank 198 of 200, inside (0.1, 1]
  // Nothing answered in the next second: no p99, zero rates.
  h.Tick(4000);
  EXPECT_FALSE(h.points()[2].p99_ms.has_value());
  EXPECT_DOUBLE_EQ(h.points()[2].requests_per_s, 0);
}

TEST(TrafficHistoryTest, ARestartedRouterCountsFromZeroAndOldPointsFallOff) {
  TrafficHistory h(3);
  h.Tick(0);
  h.Report("r1", Stats(1000, 0, 0, {1000, 0, 0, 0, 0}), 0);
  h.Tick(1000);
  h.Report("r1", Stats(20, 0, 0, {20, 0, 0, 0, 0}), 1500);  // restarted: 20 new
  h.Tick(2000);
  EXPECT_DOUBLE_EQ(h.points()[1].requests_per_s, 20);
  for (double t = 3000; t <= 6000; t += 1000) h.Tick(t);
  EXPECT_EQ(h.points().size(), 3u);
  EXPECT_DOUBLE_EQ(h.points().front().unix_ms, 4000);
  nlohmann::json routers = h.RoutersJson();
  ASSERT_EQ(routers.size(), 1u);
  EXPECT_EQ(routers[0]["answered"], 20);
  h.Forget("r1");
  EXPECT_TRUE(h.RoutersJson().empty());
}

// Failovers per minute come from the failovers' detection times, which
// the store keeps: each point counts the minute before it, the points run
// back from now at most the span, and never before the events begin.
TEST(TrafficHistoryTest, FailoversPerMinuteCountTheMinuteBeforeEachPoint) {
  const double now = 1'000'000;
  nlohmann::json f =
      TrafficHistory::FailoversPerMinute({now - 200'000, now - 50'000, now - 10'000}, 0, now);
  ASSERT_EQ(f.size(), 121u);  // ten minutes in 5 s steps, both ends
  EXPECT_DOUBLE_EQ(f.back()["unix_ms"].get<double>(), now);
  EXPECT_DOUBLE_EQ(f.front()["unix_ms"].get<double>(), now - 600'000);
  EXPECT_EQ(f.back()["failovers_per_min"], 2);  // 50 s and 10 s ago
  double max = 0;
  for (const nlohmann::json& p : f) max = std::max(max, p["failovers_per_min"].get<double>());
  EXPECT_EQ(max, 2);
  // 200 s ago alone in its minute: the point 150 s ago counts it, 130 s ago not.
  EXPECT_EQ(f[f.size() - 1 - 30]["failovers_per_min"], 1);
  EXPECT_EQ(f[f.size() - 1 - 26]["failovers_per_min"], 0);
  // A log that begins 20 s ago: no points before it.
  nlohmann::json young = TrafficHistory::FailoversPerMinute({now - 10'000}, now - 20'000, now);
  ASSERT_EQ(young.size(), 5u);
  EXPECT_DOUBLE_EQ(young.front()["unix_ms"].get<double>(), now - 20'000);
  EXPECT_EQ(young.back()["failovers_per_min"], 1);
}

}  // namespace
}  // namespace gpuha::controller
