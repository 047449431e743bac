#include "sim/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "sim/sim_report.h"

namespace gpuha::sim {
namespace {

SimInput Parse(const std::string& yaml) {
  absl::StatusOr<SimInput> in = ParseSimInput(yaml, "t.yaml");
  EXPECT_TRUE(in.ok()) << in.status();
  return in.ok() ? *in : SimInput{};
}

SimOptions Threads(int n) {
  SimOptions o;
  o.threads = n;
  return o;
}

double Binomial(int n, int k, double p) {
  return std::tgamma(n + 1) / (std::tgamma(k + 1) * std::tgamma(n - k + 1)) * std::pow(p, k) *
         std::pow(1 - p, n - k);
}

// `widen` scales the 95% interval's half-width (1.5: about 99.7%).
void ExpectWithin(const Figure& f, double closed_form, const char* what, double widen = 1) {
  double half = (f.hi - f.lo) / 2 * widen;
  EXPECT_LE(f.mean - half, closed_form)
      << what << ": mean " << f.mean << ", closed form " << closed_form;
  EXPECT_GE(f.mean + half, closed_form)
      << what << ": mean " << f.mean << ", closed form " << closed_form;
  EXPECT_LT(f.hi - f.lo, 0.02) << what << ": the interval is too wide to mean anything";
}

// A pool of n nodes that needs k of them, each up with probability
// p = MTBF / (MTBF + MTTR), independent repairs, and failover that takes no
// time: the share of time with room for every stream is P(U >= k), and the
// share of stream-hours served is E[min(U, k)] / k, with U ~ Binomial(n, p).
TEST(SimulatorTest, KOutOfNPoolMatchesItsBinomialAvailability) {
  SimInput in = Parse(R"(
fleet: { nodes: 10, gpus_per_node: 1, streams_per_gpu: 1, redundancy: 2 }
failures:
  node: { mtbf_hours: 100, repair_hours: 25 }
load: { daily: [1] }
horizon_years: 20
runs: 10
strategy_defs:
  - { name: instant, base: scenario-a, node: { detect_s: 0, restart_s: 0 } }
strategies: [instant]
)");
  const int n = 10, k = 8;
  const double p = 100.0 / 125.0;
  double at_least_k = 0, served = 0;
  for (int u = 0; u <= n; ++u) {
    if (u >= k) at_least_k += Binomial(n, u, p);
    served += Binomial(n, u, p) * std::min(u, k) / k;
  }
  SimResult r = Simulate(in, Threads(2));
  ASSERT_EQ(r.strategies.size(), 1u);
  EXPECT_EQ(r.strategies[0].admitted_streams, k);
  ExpectWithin(r.strategies[0].capacity_availability, at_least_k, "P(U >= k)");
  ExpectWithin(r.strategies[0].availability, served, "E[min(U, k)] / k");
}

// With every GPU at 100% nothing can move: the streams lost are exactly the
// capacity that was down, hour by hour under the daily curve, for every kind
// of failure at once.
TEST(SimulatorTest, NoHaLosesExactlyTheFailedCapacity) {
  SimInput in = Parse(R"(
fleet: { nodes: 20, gpus_per_node: 4, streams_per_gpu: 3, redundancy: 1, passive_nodes: 2,
         nodes_per_rack: 5 }
failures:
  gpu: { mtbf_hours: 2000, repair_hours: 30, distribution: weibull, shape: 0.8 }
  node: { mtbf_hours: 4000, repair_hours: 10 }
  rack: { mtbf_hours: 20000, repair_hours: 5, repair: fixed }
  maintenance: { interval_hours: 3000, duration_hours: 2, repair: fixed }
horizon_years: 2
runs: 3
strategies: [no-ha]
)");
  for (int64_t run = 0; run < 3; ++run) {
    RunFigures f = SimulateRun(in, in.strategies[0], run);
    EXPECT_EQ(f.idle_gpus, 0);
    EXPECT_EQ(f.admitted_streams, 20 * 4 * 3);
    EXPECT_EQ(f.streams_moved, 0);
    EXPECT_GT(f.failures, 100);
    EXPECT_GT(f.stream_hours_lost, 0);
    EXPECT_NEAR(f.stream_hours_lost, f.failed_capacity_stream_hours,
                1e-9 * f.failed_capacity_stream_hours);
  }
}

// A Weibull process keeps its configured mean: one GPU is down
// MTTR / (MTBF + MTTR) of the time whatever the shape. Both shapes draw the
// same uniforms (the stream is keyed by class name), so their errors are
// correlated, and shape 0.7 is heavy-tailed: 20 runs of 40 years, and the
// check allows 1.5 times the 95% half-width.
TEST(SimulatorTest, WeibullFailuresKeepTheirMean) {
  for (const char* shape : {"0.7", "3"}) {
    SimInput in = Parse(std::string(R"(
fleet: { nodes: 2, gpus_per_node: 4, streams_per_gpu: 1, redundancy: 1 }
failures:
  gpu: { mtbf_hours: 90, repair_hours: 10, distribution: weibull, shape: )") +
                        shape + R"( }
load: { daily: [1] }
horizon_years: 40
runs: 20
strategies: [no-ha]
)");
    SimResult r = Simulate(in, Threads(2));
    ExpectWithin(r.strategies[0].availability, 0.9, shape, 1.5);
  }
}

TEST(SimulatorTest, TheSameSeedGivesTheSameResultOnAnyNumberOfThreads) {
  SimInput in = Parse(R"(
fleet: { nodes: 30, gpus_per_node: 2, streams_per_gpu: 2, redundancy: 1, passive_nodes: 1 }
failures: { preset: llama3, gpu: { mtbf_hours: 3000, repair_hours: 20 } }
runs: 4
)");
  nlohmann::json one = RenderJson(Simulate(in, Threads(1)));
  nlohmann::json two = RenderJson(Simulate(in, Threads(3)));
  one.erase("wall_seconds");
  two.erase("wall_seconds");
  EXPECT_EQ(one, two);
  in.seed = 2;
  nlohmann::json other = RenderJson(Simulate(in, Threads(2)));
  other.erase("wall_seconds");
  EXPECT_NE(one["strategies"]["no-ha"]["stream_hours_lost"],
            other["strategies"]["no-ha"]["stream_hours_lost"]);
}

// Strategies are compared on identical histories: the same faults hit each.
TEST(SimulatorTest, EveryStrategyOfARunSeesTheSameFailures) {
  SimInput in = Parse(R"(
fleet: { nodes: 12, gpus_per_node: 2, streams_per_gpu: 2, redundancy: 1, passive_nodes: 1 }
failures: { gpu: { mtbf_hours: 500, repair_hours: 20 }, node: { mtbf_hours: 900, repair_hours: 5 } }
strategies: [no-ha, scenario-a, scenario-b, scenario-c]
)");
  RunFigures base = SimulateRun(in, in.strategies[0], 3);
  for (const Strategy& s : in.strategies) {
    EXPECT_EQ(SimulateRun(in, s, 3).failures, base.failures) << s.name;
  }
}

// The built-in comparison keeps its order on published rates: hot standby
// that moves one GPU's streams (gpuha as shipped, a server per GPU) loses
// least, vSphere's restarts and then Kubernetes' more, no HA most. A server
// across a node's GPUs moves the whole node for one GPU's fault, so one
// spare node runs out: more overflow than a scheduler that moves GPUs.
TEST(SimulatorTest, HotStandbyPerGpuLosesLeastAndNoHaMostOnPublishedRates) {
  SimInput in = Parse(R"(
fleet: { nodes: 40, gpus_per_node: 8, streams_per_gpu: 4, redundancy: 1, passive_nodes: 1 }
failures: { preset: llama3 }
runs: 6
strategy_defs: [ { name: gpuha-per-node, base: gpuha, unit: node } ]
strategies: [no-ha, scenario-a, scenario-b, gpuha, gpuha-per-node]
)");
  SimResult r = Simulate(in, Threads(2));
  std::map<std::string, const StrategyResult*> by;
  for (const StrategyResult& s : r.strategies) by[s.strategy.name] = &s;
  EXPECT_GT(by["gpuha"]->availability.mean, by["scenario-b"]->availability.mean);
  EXPECT_GT(by["scenario-b"]->availability.mean, by["scenario-a"]->availability.mean);
  EXPECT_GT(by["scenario-a"]->availability.mean, by["no-ha"]->availability.mean);
  EXPECT_GT(by["gpuha-per-node"]->overflow_events.mean, by["scenario-a"]->overflow_events.mean);
  EXPECT_EQ(by["no-ha"]->idle_gpus, 0);
  EXPECT_EQ(by["scenario-a"]->idle_gpus, 8);  // N+1: one node's worth, spread
  EXPECT_EQ(by["gpuha"]->idle_gpus, 8);       // the passive node
  EXPECT_EQ(by["gpuha-per-node"]->idle_gpus, 8);
  EXPECT_GT(by["scenario-a"]->streams_moved.mean, 0);
}

// A rack takes all its nodes at once; N+1 cannot hold four lost nodes.
TEST(SimulatorTest, ARackFailureIsCorrelatedAndOverflowsNPlusOne) {
  SimInput in = Parse(R"(
fleet: { nodes: 8, gpus_per_node: 1, streams_per_gpu: 2, redundancy: 1, nodes_per_rack: 4 }
failures: { rack: { mtbf_hours: 1000, repair_hours: 10 } }
horizon_years: 1
strategies: [scenario-a]
)");
  RunFigures f = SimulateRun(in, in.strategies[0], 0);
  EXPECT_GT(f.failures, 0);
  EXPECT_EQ(f.failures % 4, 0);
  EXPECT_GT(f.overflow_events, 0);
  EXPECT_LT(f.full_capacity_hours, 8760);
}

// gpuha drains a node for maintenance without loss; a window that finds the
// spare taken (another node in maintenance) waits for room.
TEST(SimulatorTest, MaintenanceWaitsForRoomAndDrainsWithoutLoss) {
  SimInput in = Parse(R"(
fleet: { nodes: 4, gpus_per_node: 2, streams_per_gpu: 2, redundancy: 1, passive_nodes: 1 }
failures: { maintenance: { interval_hours: 500, duration_hours: 40, repair: fixed } }
strategies: [gpuha, scenario-a]
)");
  RunFigures gpuha = SimulateRun(in, in.strategies[0], 0);
  EXPECT_GT(gpuha.failures, 10);
  EXPECT_GT(gpuha.maintenance_deferred, 0);
  EXPECT_EQ(gpuha.stream_hours_lost, 0);
  EXPECT_GT(gpuha.streams_moved, 0);
  RunFigures k8s = SimulateRun(in, in.strategies[1], 0);
  EXPECT_GT(k8s.stream_hours_lost, 0);  // a drained pod restarts elsewhere: 90 s each
}

TEST(SimulatorTest, SummarizeGivesAStudentTInterval) {
  Figure f = Summarize({1, 2, 3});
  EXPECT_DOUBLE_EQ(f.mean, 2);
  EXPECT_NEAR(f.hi - f.mean, 4.303 * 1 / std::sqrt(3.0), 1e-9);
  Figure one = Summarize({5});
  EXPECT_EQ(one.lo, 5);
  EXPECT_EQ(one.hi, 5);
}

TEST(SimReportTest, JsonCarriesEveryFigureWithItsInterval) {
  SimInput in = Parse(R"(
fleet: { nodes: 6, gpus_per_node: 1, streams_per_gpu: 2, redundancy: 1 }
failures: { node: { mtbf_hours: 300, repair_hours: 10 } }
runs: 3
strategies: [no-ha, gpuha]
)");
  nlohmann::json j = RenderJson(Simulate(in));
  for (const char* s : {"no-ha", "gpuha"}) {
    const nlohmann::json& x = j["strategies"][s];
    for (const char* k : {"availability", "stream_hours_lost", "overflow_events"}) {
      ASSERT_TRUE(x.contains(k)) << s << " " << k;
      ASSERT_TRUE(x.contains(std::string(k) + "_ci95")) << s << " " << k;
      EXPECT_LE(x[std::string(k) + "_ci95"][0].get<double>(), x[k].get<double>());
    }
    EXPECT_TRUE(x["idle_gpus"].is_number_integer());
  }
  EXPECT_EQ(j["strategies"]["no-ha"]["idle_gpus"], 0);
  EXPECT_EQ(j["strategies"]["gpuha"]["idle_gpus"], 1);
}

TEST(SimReportTest, SvgDrawsOneLinePerStrategyAcrossTheSweep) {
  SimInput in = Parse(R"(
fleet: { nodes: 16, gpus_per_node: 1, streams_per_gpu: 2, redundancy: 1 }
failures: { node: { mtbf_hours: 300, repair_hours: 10 } }
runs: 2
strategy_defs: [ { name: "k8s<fast>&co", base: scenario-a } ]
strategies: [no-ha, scenario-a, gpuha, "k8s<fast>&co"]
)");
  EXPECT_EQ(SweepSizes(in), (std::vector<int64_t>{2, 4, 8, 16}));
  std::vector<SimResult> sweep;
  for (int64_t n : SweepSizes(in)) {
    SimInput at = in;
    at.fleet.nodes = n;
    sweep.push_back(Simulate(at));
  }
  std::string svg = RenderSvg(sweep);
  EXPECT_THAT(svg, ::testing::StartsWith("<svg"));
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 8u);  // 4 strategies x 2 panels
  EXPECT_THAT(svg, ::testing::HasSubstr("scenario-a 16:"));
  EXPECT_THAT(svg, ::testing::HasSubstr(">k8s&lt;fast&gt;&amp;co</text>"));  // escaped
  EXPECT_THAT(svg, ::testing::Not(::testing::HasSubstr("k8s<fast>")));
}

}  // namespace
}  // namespace gpuha::sim
