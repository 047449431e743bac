#include "sim/sim_input.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::sim {
namespace {

using ::testing::HasSubstr;

constexpr char kSmall[] = R"(fleet: { nodes: 10, gpus_per_node: 2, streams_per_gpu: 3 }
failures:
  gpu: { mtbf_hours: 1000, repair_hours: 10 }
  node: { mtbf_hours: 5000, repair_hours: 8, distribution: weibull, shape: 1.5 }
)";

std::string ErrorOf(const std::string& yaml) {
  absl::StatusOr<SimInput> in = ParseSimInput(yaml, "s.yaml");
  if (in.ok()) return "ok";
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(in.status().message());
}

TEST(SimInputTest, ReadsAFleetWithDefaults) {
  absl::StatusOr<SimInput> in = ParseSimInput(kSmall, "s.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->fleet.nodes, 10);
  EXPECT_EQ(in->fleet.redundancy, 1);
  EXPECT_EQ(in->runs, 10);
  ASSERT_EQ(in->failures.size(), 2u);
  EXPECT_EQ(in->failures[0].name, "gpu");
  EXPECT_EQ(in->failures[1].scope, Scope::kNode);
  EXPECT_EQ(in->failures[1].distribution, Distribution::kWeibull);
  EXPECT_DOUBLE_EQ(in->failures[1].shape, 1.5);
  // Every built-in strategy when none is named, in order.
  ASSERT_EQ(in->strategies.size(), BuiltinStrategies().size());
  EXPECT_EQ(in->strategies.front().name, "no-ha");
  EXPECT_EQ(in->strategies.back().name, "gpuha");
  EXPECT_EQ(in->daily_load, DefaultDailyLoad());
}

TEST(SimInputTest, TheExampleFilesParse) {
  for (const char* f : {"fleet.yaml", "published-rates.yaml", "scale-10k.yaml", "strategies.yaml",
                        "server-per-node.yaml"}) {
    absl::StatusOr<SimInput> in =
        LoadSimInputFile(std::string(GPUHA_SOURCE_DIR) + "/examples/sim/" + f);
    EXPECT_TRUE(in.ok()) << f << ": " << in.status();
  }
}

// The written-out rates are the preset's, so the two cannot drift apart.
TEST(SimInputTest, PublishedRatesFileMatchesThePreset) {
  absl::StatusOr<SimInput> file =
      LoadSimInputFile(std::string(GPUHA_SOURCE_DIR) + "/examples/sim/published-rates.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<FailureClass> preset = PublishedFailureRates();
  ASSERT_EQ(file->failures.size(), preset.size());
  for (const FailureClass& p : preset) {
    auto it = std::find_if(file->failures.begin(), file->failures.end(),
                           [&](const FailureClass& c) { return c.name == p.name; });
    ASSERT_NE(it, file->failures.end()) << p.name;
    EXPECT_NEAR(it->mtbf_hours, p.mtbf_hours, p.mtbf_hours * 1e-5) << p.name;
    EXPECT_DOUBLE_EQ(it->repair_hours, p.repair_hours) << p.name;
    EXPECT_EQ(it->scope, p.scope) << p.name;
    EXPECT_EQ(it->fixed_repair, p.fixed_repair) << p.name;
  }
}

// The built-ins written out behave as the built-ins, so the copyable file
// cannot drift from the code.
TEST(SimInputTest, StrategiesFileMatchesTheBuiltIns) {
  absl::StatusOr<SimInput> file =
      LoadSimInputFile(std::string(GPUHA_SOURCE_DIR) + "/examples/sim/strategies.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->strategies.size(), BuiltinStrategies().size());
  for (size_t i = 0; i < file->strategies.size(); ++i) {
    const Strategy& f = file->strategies[i];
    const Strategy& b = BuiltinStrategies()[i];
    EXPECT_EQ(f.name, b.name);
    EXPECT_EQ(f.reserve, b.reserve) << b.name;
    EXPECT_EQ(f.spares, b.spares) << b.name;
    EXPECT_EQ(f.unit, b.unit) << b.name;
    EXPECT_DOUBLE_EQ(f.node.detect_s, b.node.detect_s) << b.name;
    EXPECT_DOUBLE_EQ(f.node.restart_s, b.node.restart_s) << b.name;
    EXPECT_DOUBLE_EQ(f.gpu.detect_s, b.gpu.detect_s) << b.name;
    EXPECT_DOUBLE_EQ(f.gpu.restart_s, b.gpu.restart_s) << b.name;
    EXPECT_DOUBLE_EQ(f.planned_outage_s, b.planned_outage_s) << b.name;
  }
}

// The input exactly as issue 17 writes it.
TEST(SimInputTest, TheIssuesExampleParses) {
  absl::StatusOr<SimInput> in = ParseSimInput(
      R"(fleet: { nodes: 100, gpus_per_node: 8, streams_per_gpu: 4, redundancy: 1, passive_nodes: 1 }
failures:
  node: { mtbf_hours: 20000, repair_hours: 8 }
  gpu:  { mtbf_hours: 80000, repair_hours: 4 }
horizon_years: 1
runs: 10
strategies: [no-ha, scenario-a, gpuha]
)",
      "issue.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->failures.size(), 2u);
  EXPECT_EQ(in->strategies.size(), 3u);
  EXPECT_EQ(in->fleet.passive_nodes, 1);
}

TEST(SimInputTest, PresetClassesCanBeReplacedOneByOne) {
  absl::StatusOr<SimInput> in =
      ParseSimInput(R"(fleet: { nodes: 4, gpus_per_node: 1, streams_per_gpu: 1 }
failures:
  preset: llama3
  node_nic: { mtbf_hours: 10, repair_hours: 1 }
)",
                    "s.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->failures.size(), PublishedFailureRates().size());
  for (const FailureClass& c : in->failures) {
    if (c.name == "node_nic") {
      EXPECT_DOUBLE_EQ(c.mtbf_hours, 10);
      EXPECT_EQ(c.source, "config");
    } else {
      EXPECT_THAT(c.source, HasSubstr("Llama 3"));
    }
  }
}

TEST(SimInputTest, StrategyDefsChangeABuiltInOrMakeANewOne) {
  absl::StatusOr<SimInput> in = ParseSimInput(std::string(kSmall) + R"(strategy_defs:
  - { name: fast-k8s, base: scenario-a, node: { detect_s: 40 }, unit: node }
  - { name: gpuha, planned_outage_s: 1 }
strategies: [fast-k8s, gpuha]
)",
                                              "s.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ(in->strategies.size(), 2u);
  EXPECT_EQ(in->strategies[0].name, "fast-k8s");
  EXPECT_DOUBLE_EQ(in->strategies[0].node.detect_s, 40);
  EXPECT_DOUBLE_EQ(in->strategies[0].node.restart_s, 90);  // kept from scenario-a
  EXPECT_EQ(in->strategies[0].unit, Unit::kNode);
  EXPECT_DOUBLE_EQ(in->strategies[1].planned_outage_s, 1);
  EXPECT_EQ(in->strategies[1].spares, Spares::kPassive);
}

TEST(SimInputTest, BadInputNamesTheFieldAndItsLine) {
  const std::string fleet = "fleet: { nodes: 10, gpus_per_node: 1, streams_per_gpu: 1 }\n";
  EXPECT_THAT(ErrorOf(fleet + "failures:\n  gpu: { mtbf_hours: -5, repair_hours: 1 }\n"),
              HasSubstr("s.yaml:3:22: failures.gpu.mtbf_hours: must be above 0"));
  EXPECT_THAT(ErrorOf(fleet + "failures:\n  node: { mtbf_hours: 5 }\n"),
              HasSubstr("s.yaml:3:9: failures.node.repair_hours: is required but missing"));
  EXPECT_THAT(
      ErrorOf(fleet + "failures:\n  maintenance: { interval_hours: 0, duration_hours: 1 }\n"),
      HasSubstr("failures.maintenance.interval_hours: must be above 0"));
  EXPECT_THAT(ErrorOf(fleet + "failures:\n  gpu_hmb: { mtbf_hours: 5, repair_hours: 1 }\n"),
              HasSubstr("s.yaml:3:3: failures.gpu_hmb: unknown key (did you mean 'gpu_hbm'?)"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nstrategies: [no-ha, scenario-z]\n"),
              HasSubstr("s.yaml:3:13: strategies: unknown strategy 'scenario-z'"));
  EXPECT_THAT(ErrorOf("fleet: { nodes: 2, gpus_per_node: 1, streams_per_gpu: 1, redundancy: 2 }\n"
                      "failures: {}\n"),
              HasSubstr("fleet.redundancy: a fleet of 2 node(s) cannot keep N+2"));
  EXPECT_THAT(ErrorOf("fleet: { nodes: 2, gpus_per_node: 1, streams_per_gpu: 1, redundancy: 0,"
                      " passive_nodes: 2 }\nfailures: {}\n"),
              HasSubstr("fleet.passive_nodes: 2 of 2 nodes leaves no node to serve"));
  EXPECT_THAT(ErrorOf("fleet: { nodes: 2, streams_per_gpu: 1 }\nfailures: {}\n"),
              HasSubstr("fleet.gpus_per_node: is required but missing"));
  EXPECT_THAT(ErrorOf(fleet), HasSubstr("failures: is required but missing"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nload: { daily: [1, 0.5] }\n"),
              HasSubstr("load.daily: give 1 value (flat) or 24 (one per hour), got 2"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nload: { daily: [1.5] }\n"),
              HasSubstr("load.daily: item 0: expected a share between 0 and 1, got '1.5'"));
  EXPECT_THAT(ErrorOf(fleet + "failures:\n  gpu: { mtbf_hours: 5, repair_hours: 1, shape: 2 }\n"),
              HasSubstr("failures.gpu.shape: only a weibull distribution has a shape"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nstrategy_defs:\n  - { name: x, base: y }\n"),
              HasSubstr("strategy_defs[0].base: unknown strategy 'y'"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nstrategies: [gpuha, no-ha, gpuha]\n"),
              HasSubstr("s.yaml:3:13: strategies: 'gpuha' is named twice"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nruns: 0\n"),
              HasSubstr("runs: must be between 1 and 10000, got 0"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nhorizon_years: -1\n"),
              HasSubstr("horizon_years: must be above 0"));
  EXPECT_THAT(ErrorOf(fleet + "failures: { preset: llama2 }\n"), HasSubstr("failures.preset"));
  EXPECT_THAT(ErrorOf(fleet + "failures: {}\nsweep_nodes: [1]\n"),
              HasSubstr("sweep_nodes: each size must be a whole number above redundancy"));
}

}  // namespace
}  // namespace gpuha::sim
