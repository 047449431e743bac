#include "plan/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "sim/simulator.h"

namespace gpuha::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

// The recommended default: stateless, restart tolerated, 3 L4 nodes, N+1.
PlanInput BaseInput() {
  PlanInput in;
  in.workload = {.stateless = true,
                 .zero_downtime = false,
                 .restart_tolerance_minutes = 5,
                 .expected_restart_minutes = 5};
  in.cluster.gpu = "L4";
  in.cluster.nodes = 3;
  in.cluster.gpus_per_node = 1;
  in.cluster.streams_per_gpu = 10;
  in.cluster.redundancy = 1;
  in.cluster.target_streams = 20;
  return in;
}

struct LeafCase {
  const char* name;
  std::function<void(PlanInput&)> change;
  const char* outcome;
  Design design;
  std::vector<std::string> questions;
};

void PrintTo(const LeafCase& c, std::ostream* os) { *os << c.name; }

class LeafTest : public ::testing::TestWithParam<LeafCase> {};

TEST_P(LeafTest, FlowEndsAtLeafWithDesignAndPath) {
  const LeafCase& c = GetParam();
  PlanInput in = BaseInput();
  c.change(in);
  Plan p = MakePlan(in);
  EXPECT_EQ(p.outcome, c.outcome);
  EXPECT_EQ(p.design.allocation, c.design.allocation);
  EXPECT_EQ(p.design.san, c.design.san);
  EXPECT_EQ(p.design.hba, c.design.hba);
  EXPECT_EQ(p.design.orchestration, c.design.orchestration);
  EXPECT_EQ(p.design.capacity_model, c.design.capacity_model);
  std::vector<std::string> questions;
  for (const Decision& d : p.path) questions.push_back(d.question);
  EXPECT_EQ(questions, c.questions);
}

const std::vector<std::string> kDefaultPath = {"stateless",         "zero_downtime",
                                               "vm_ha_mandatory",   "gpu_sharing",
                                               "restart_tolerable", "shared_storage"};

std::vector<LeafCase> LeafCases() {
  return {LeafCase{"Stateful",
                   [](PlanInput& in) { in.workload.stateless = false; },
                   "stateful-dedicated-san",
                   {"dedicated", "required", "not-needed", "none", "n+k"},
                   {"stateless", "shared_storage", "san_type"}},
          LeafCase{"StatefulOverFcNeedsHba",
                   [](PlanInput& in) {
                     in.workload.stateless = false;
                     in.san = SanType::kFc;
                   },
                   "stateful-dedicated-san",
                   {"dedicated", "required", "required", "none", "n+k"},
                   {"stateless", "shared_storage", "san_type"}},
          LeafCase{"ZeroDowntime",
                   [](PlanInput& in) { in.workload.zero_downtime = true; },
                   "active-active-traffic-routing",
                   {"pci-passthrough", "none", "not-needed", "traffic-routing", "active-active"},
                   {"stateless", "zero_downtime", "shared_storage"}},
          LeafCase{"VmHaWithSharing",
                   [](PlanInput& in) {
                     in.policy.vm_ha_mandatory = true;
                     in.policy.gpu_sharing = true;
                     in.san = SanType::kIscsi;
                   },
                   "vgpu-san",
                   {"vgpu", "required", "not-needed", "vmware-ha", "n+k"},
                   {"stateless", "zero_downtime", "vm_ha_mandatory", "gpu_sharing",
                    "shared_storage", "san_type"}},
          LeafCase{"VmHaWithoutSharing",
                   [](PlanInput& in) {
                     in.policy.vm_ha_mandatory = true;
                     in.san = SanType::kFc;
                   },
                   "passthrough-san",
                   {"pci-passthrough", "required", "required", "vmware-ha", "n+k"},
                   {"stateless", "zero_downtime", "vm_ha_mandatory", "gpu_sharing",
                    "shared_storage", "san_type"}},
          LeafCase{"SharingJustified",
                   [](PlanInput& in) {
                     in.policy.gpu_sharing = true;
                     in.policy.sharing_cost_justified = true;
                     in.san = SanType::kFc;
                   },
                   "vgpu-san-recommended",
                   {"vgpu", "recommended", "required", "kubernetes", "n+k"},
                   {"stateless", "zero_downtime", "vm_ha_mandatory", "gpu_sharing",
                    "sharing_cost_justified", "shared_storage", "san_type"}},
          LeafCase{"SharingNotJustified",
                   [](PlanInput& in) { in.policy.gpu_sharing = true; },
                   "re-evaluate-workload",
                   {"pci-passthrough", "none", "not-needed", "none", "none"},
                   {"stateless", "zero_downtime", "vm_ha_mandatory", "gpu_sharing",
                    "sharing_cost_justified", "shared_storage"}},
          LeafCase{"RestartTolerated",
                   [](PlanInput&) {},
                   "passthrough-k8s-n+1",
                   {"pci-passthrough", "none", "not-needed", "kubernetes", "n+k"},
                   kDefaultPath},
          LeafCase{"RestartNotTolerated",
                   [](PlanInput& in) { in.workload.restart_tolerance_minutes = 1; },
                   "buffer-node",
                   {"pci-passthrough", "none", "not-needed", "kubernetes", "buffer-node"},
                   kDefaultPath}};
}

INSTANTIATE_TEST_SUITE_P(EveryLeaf, LeafTest, ::testing::ValuesIn(LeafCases()),
                         [](const ::testing::TestParamInfo<LeafCase>& info) {
                           return info.param.name;
                         });

TEST(LeafCoverageTest, EveryOutcomeIsReachedByTheTable) {
  std::set<std::string> reached;
  for (const LeafCase& c : LeafCases()) {
    PlanInput in = BaseInput();
    c.change(in);
    reached.insert(MakePlan(in).outcome);
  }
  EXPECT_EQ(reached, std::set<std::string>(AllOutcomes().begin(), AllOutcomes().end()));
}

TEST(DecisionPathTest, SanTypeAnswerIsTheStorageWord) {
  PlanInput in = BaseInput();
  in.policy.vm_ha_mandatory = true;
  in.san = SanType::kIscsi;
  Plan p = MakePlan(in);
  ASSERT_FALSE(p.path.empty());
  EXPECT_EQ(p.path.back().question, "san_type");
  EXPECT_EQ(p.path.back().answer, "iscsi");
  EXPECT_FALSE(p.path.back().is_bool);
}

TEST(DecisionPathTest, RestartExactlyAtToleranceIsTolerable) {
  PlanInput in = BaseInput();
  in.workload.restart_tolerance_minutes = 2;
  in.workload.expected_restart_minutes = 2;
  EXPECT_EQ(MakePlan(in).outcome, "passthrough-k8s-n+1");
  in.workload.restart_tolerance_minutes = 1.9;
  EXPECT_EQ(MakePlan(in).outcome, "buffer-node");
}

// --- capacity (seed 002 §5) -------------------------------------------------

TEST(CapacityTest, SeedExampleNPlusOne) {
  Capacity c = ComputeCapacity(BaseInput().cluster);
  EXPECT_EQ(c.total_streams, 30);
  EXPECT_EQ(c.failover_reserve_streams, 10);
  EXPECT_EQ(c.max_production_streams, 20);
  EXPECT_EQ(c.headroom_streams, 0);
  EXPECT_TRUE(c.survives_node_loss);
  EXPECT_EQ(c.nodes_needed_for_target, 3);
}

TEST(CapacityTest, NPlusTwoReservesTwoNodes) {
  PlanInput in = BaseInput();
  in.cluster.nodes = 5;
  in.cluster.gpus_per_node = 2;
  in.cluster.redundancy = 2;
  in.cluster.target_streams = 55;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.total_streams, 100);
  EXPECT_EQ(c.failover_reserve_streams, 40);
  EXPECT_EQ(c.max_production_streams, 60);
  EXPECT_EQ(c.headroom_streams, 5);
  EXPECT_TRUE(c.survives_node_loss);
  EXPECT_EQ(c.nodes_needed_for_target, 5);  // ceil(55/20) + 2
}

TEST(CapacityTest, GpuBufferNodeAddsOneNodeOfCapacity) {
  PlanInput in = BaseInput();
  in.cluster.buffer_node = BufferNode::kGpu;
  in.cluster.target_streams = 30;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.total_streams, 40);
  EXPECT_EQ(c.max_production_streams, 30);
  EXPECT_EQ(c.headroom_streams, 0);
  EXPECT_TRUE(c.survives_node_loss);
}

TEST(CapacityTest, CpuBufferNodeAddsNoGpuCapacity) {
  PlanInput in = BaseInput();
  in.cluster.buffer_node = BufferNode::kCpu;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.total_streams, 30);
  EXPECT_EQ(c.max_production_streams, 20);
}

TEST(CapacityTest, NPlusTwoWithGpuBuffer) {
  PlanInput in = BaseInput();
  in.cluster.nodes = 4;
  in.cluster.redundancy = 2;
  in.cluster.buffer_node = BufferNode::kGpu;
  in.cluster.target_streams = 35;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.total_streams, 50);
  EXPECT_EQ(c.failover_reserve_streams, 20);
  EXPECT_EQ(c.max_production_streams, 30);
  EXPECT_EQ(c.headroom_streams, -5);
  EXPECT_FALSE(c.survives_node_loss);
}

TEST(CapacityTest, AllGpusAtFullLoadHasNoHa) {
  PlanInput in = BaseInput();
  in.cluster.target_streams = 30;  // every GPU at 100%
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.headroom_streams, -10);
  EXPECT_FALSE(c.survives_node_loss);
  EXPECT_EQ(c.nodes_needed_for_target, 4);
}

TEST(CapacityTest, ZeroRedundancyNeverSurvivesNodeLoss) {
  PlanInput in = BaseInput();
  in.cluster.redundancy = 0;
  in.cluster.target_streams = 10;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.headroom_streams, 20);
  EXPECT_FALSE(c.survives_node_loss);
}

// --- facilities -------------------------------------------------------------

TEST(FacilitiesTest, L4ClusterSizing) {
  FacilitiesSizing f = ComputeFacilities(BaseInput());
  // 3 x (1 x 72 W x 1.3 + 350 W)
  EXPECT_DOUBLE_EQ(f.gpu_tdp_watts, 72);
  EXPECT_NEAR(f.it_load_watts, 1330.8, 1e-9);
  EXPECT_NEAR(f.ups_va, 1330.8 * 1.25 / 0.9, 1e-9);
  EXPECT_NEAR(f.cooling_btu_per_hour, 1330.8 * 3.412, 1e-9);
}

TEST(FacilitiesTest, TheBufferNodeDrawsPowerToo) {
  PlanInput in = BaseInput();
  in.cluster.buffer_node = BufferNode::kGpu;  // a full fourth node, held spare
  FacilitiesSizing gpu = ComputeFacilities(in);
  EXPECT_EQ(gpu.powered_nodes, 4);
  EXPECT_NEAR(gpu.it_load_watts, 1330.8 + 72 * 1.3 + 350, 1e-9);
  EXPECT_NEAR(gpu.ups_va, gpu.it_load_watts * 1.25 / 0.9, 1e-9);
  in.cluster.buffer_node = BufferNode::kCpu;  // a host without a GPU
  FacilitiesSizing cpu = ComputeFacilities(in);
  EXPECT_EQ(cpu.powered_nodes, 4);
  EXPECT_NEAR(cpu.it_load_watts, 1330.8 + 350, 1e-9);
  EXPECT_EQ(ComputeFacilities(BaseInput()).powered_nodes, 3);
}

TEST(FacilitiesTest, TdpOverrideWinsOverTable) {
  PlanInput in = BaseInput();
  in.cluster.gpu = "MysteryGPU";
  in.cluster.tdp_watts = 100;
  in.facilities.host_watts = 0;
  in.facilities.surge_factor = 1;
  EXPECT_DOUBLE_EQ(ComputeFacilities(in).it_load_watts, 300);
}

// --- warnings ---------------------------------------------------------------

std::set<std::string> WarningCodes(const Plan& p) {
  std::set<std::string> codes;
  for (const Warning& w : p.warnings) codes.insert(w.code);
  return codes;
}

struct WarningCase {
  const char* name;
  std::function<void(PlanInput&)> change;
  const char* code;
};

void PrintTo(const WarningCase& c, std::ostream* os) { *os << c.name; }

class WarningTest : public ::testing::TestWithParam<WarningCase> {};

TEST_P(WarningTest, RaisedWhenItsConditionHolds) {
  PlanInput in = BaseInput();
  EXPECT_EQ(WarningCodes(MakePlan(in)).count(GetParam().code), 0u) << "raised on the base input";
  GetParam().change(in);
  EXPECT_EQ(WarningCodes(MakePlan(in)).count(GetParam().code), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    EveryWarning, WarningTest,
    ::testing::Values(
        WarningCase{"NoHaCapacity", [](PlanInput& in) { in.cluster.target_streams = 21; },
                    "no-ha-capacity"},
        WarningCase{"CpuBuffer", [](PlanInput& in) { in.cluster.buffer_node = BufferNode::kCpu; },
                    "cpu-buffer-degrades"},
        WarningCase{"SanMissing", [](PlanInput& in) { in.policy.vm_ha_mandatory = true; },
                    "san-missing"},
        WarningCase{"SanMissingStateful", [](PlanInput& in) { in.workload.stateless = false; },
                    "san-missing"},
        WarningCase{"VgpuLicense",
                    [](PlanInput& in) {
                      in.policy.gpu_sharing = true;
                      in.policy.sharing_cost_justified = true;
                    },
                    "vgpu-license"},
        WarningCase{"UnknownGpu",
                    [](PlanInput& in) {
                      in.cluster.gpu = "B300X";
                      in.cluster.tdp_watts = 1100;
                    },
                    "unknown-gpu"},
        WarningCase{"NoRedundancy", [](PlanInput& in) { in.cluster.redundancy = 0; },
                    "no-redundancy"},
        WarningCase{"BufferNodeMissing",
                    [](PlanInput& in) { in.workload.restart_tolerance_minutes = 1; },
                    "buffer-node-missing"},
        WarningCase{"ManualRebind",
                    [](PlanInput& in) {
                      in.policy.vm_ha_mandatory = true;
                      in.san = SanType::kFc;
                    },
                    "manual-gpu-rebind"},
        WarningCase{"SanOverBudget",
                    [](PlanInput& in) {
                      in.policy.budget_constrained = true;
                      in.workload.stateless = false;
                      in.san = SanType::kIscsi;
                    },
                    "san-over-budget"},
        WarningCase{"SanNotNeeded", [](PlanInput& in) { in.san = SanType::kIscsi; },
                    "san-not-needed"}),
    [](const ::testing::TestParamInfo<WarningCase>& info) { return info.param.name; });

TEST(WarningTest, NoHaCapacityShowsTheArithmetic) {
  PlanInput in = BaseInput();
  in.cluster.target_streams = 30;
  Plan p = MakePlan(in);
  ASSERT_EQ(WarningCodes(p).count("no-ha-capacity"), 1u);
  const Warning& w = *std::find_if(p.warnings.begin(), p.warnings.end(),
                                   [](const Warning& w) { return w.code == "no-ha-capacity"; });
  EXPECT_THAT(w.message, ::testing::HasSubstr("limit of 20 (30 total - 10 failover reserve)"));
  EXPECT_THAT(w.message, ::testing::HasSubstr("no HA exists"));
  EXPECT_THAT(w.message, ::testing::HasSubstr("Use 4 nodes"));
}

TEST(WarningTest, BaseInputHasNoWarnings) { EXPECT_TRUE(MakePlan(BaseInput()).warnings.empty()); }

// --- decision matrix (seed 002 §6) --------------------------------------------

TEST(MatrixTest, DefaultPathRows) {
  PlanInput in = BaseInput();
  in.policy.budget_constrained = true;
  Plan p = MakePlan(in);
  EXPECT_THAT(p.matrix, ElementsAre(Field(&MatrixRow::requirement, "Lowest cost"),
                                    Field(&MatrixRow::requirement, "Fastest inference"),
                                    Field(&MatrixRow::requirement, "Edge / IIoT"),
                                    Field(&MatrixRow::requirement, "Predictable restart"),
                                    Field(&MatrixRow::requirement, "Zero infra drama")));
}

TEST(MatrixTest, VmwareSharingRows) {
  PlanInput in = BaseInput();
  in.policy.vm_ha_mandatory = true;
  in.policy.gpu_sharing = true;
  Plan p = MakePlan(in);
  EXPECT_THAT(p.matrix, ElementsAre(Field(&MatrixRow::best_choice, "vGPU"),
                                    Field(&MatrixRow::best_choice, "vGPU + SAN")));
}

// --- expected loss (gpuha sim's model) ---------------------------------------

TEST(ExpectedLossTest, EveryOutcomeIsModelledOrSaysWhyNot) {
  for (const std::string& o : AllOutcomes()) {
    std::string s = StrategyForOutcome(o);
    if (o == "stateful-dedicated-san") {
      EXPECT_EQ(s, "") << o;
    } else {
      EXPECT_NE(sim::FindBuiltinStrategy(s), nullptr) << o << " -> '" << s << "'";
    }
  }
  PlanInput in = BaseInput();
  in.workload.stateless = false;
  Plan p = MakePlan(in);
  EXPECT_EQ(p.outcome, "stateful-dedicated-san");
  EXPECT_EQ(p.expected_loss.strategy, "");
  EXPECT_THAT(p.expected_loss.skipped, ::testing::HasSubstr("stateful"));
}

TEST(ExpectedLossTest, TheRecommendedDesignGetsItsYearlyLoss) {
  Plan p = MakePlan(BaseInput());
  EXPECT_EQ(p.expected_loss.strategy, StrategyForOutcome(p.outcome));
  EXPECT_EQ(p.expected_loss.runs, 10);
  EXPECT_GT(p.expected_loss.availability, 0.99);
  EXPECT_LE(p.expected_loss.availability, 1.0);
  EXPECT_LE(p.expected_loss.lo, p.expected_loss.stream_hours_lost_per_year);
  EXPECT_GE(p.expected_loss.hi, p.expected_loss.stream_hours_lost_per_year);
  // The same model as `gpuha sim`: the same cluster there gives the same figure.
  sim::SimInput s;
  s.fleet = {.nodes = p.input.cluster.nodes,
             .gpus_per_node = p.input.cluster.gpus_per_node,
             .streams_per_gpu = p.input.cluster.streams_per_gpu,
             .redundancy = p.input.cluster.redundancy,
             .passive_nodes = 0,
             .nodes_per_rack = 16};
  s.failures = sim::PublishedFailureRates();
  s.daily_load = sim::DefaultDailyLoad();
  s.strategies.push_back(*sim::FindBuiltinStrategy(p.expected_loss.strategy));
  EXPECT_DOUBLE_EQ(sim::Simulate(s).strategies[0].stream_hours_lost_per_year.mean,
                   p.expected_loss.stream_hours_lost_per_year);
}

// Issue 16: multi-GPU nodes and slices, and the GPU-level headroom.
TEST(CapacityTest, SlicesAndGpuLevelHeadroom) {
  PlanInput in = BaseInput();
  in.cluster.nodes = 4;
  in.cluster.gpus_per_node = 8;
  in.cluster.streams_per_gpu = 14;  // 7 MIG slices of 2 streams
  in.cluster.slices_per_gpu = 7;
  in.cluster.slice_profile = "1g.10gb";
  in.cluster.target_streams = 300;
  Capacity c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.total_streams, 4 * 8 * 14);          // 448
  EXPECT_EQ(c.failover_reserve_streams, 8 * 14);   // one node
  EXPECT_EQ(c.headroom_streams, 448 - 112 - 300);  // 36
  EXPECT_EQ(c.gpu_failures_absorbed, 2);           // 36 / 14
  EXPECT_EQ(c.slice_failures_absorbed, 18);        // 36 / 2
  in.cluster.target_streams = 400;                 // short of N+1
  c = ComputeCapacity(in.cluster);
  EXPECT_EQ(c.gpu_failures_absorbed, 0);
}

}  // namespace
}  // namespace gpuha::plan
