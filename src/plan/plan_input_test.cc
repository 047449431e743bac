#include "plan/plan_input.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"

namespace gpuha::plan {
namespace {

using ::testing::HasSubstr;

constexpr char kGood[] =
    R"(workload: { stateless: true, zero_downtime: false, restart_tolerance_minutes: 5 }
policy: { vm_ha_mandatory: false, gpu_sharing: false, sharing_cost_justified: false, budget_constrained: true }
storage: { san: none }
cluster:
  gpu: L4
  nodes: 3
  gpus_per_node: 1
  streams_per_gpu: 10
  redundancy: 1
  target_streams: 20
  buffer_node: none
facilities: { host_watts: 350, surge_factor: 1.3, ups_power_factor: 0.9, ups_headroom: 0.25 }
)";

std::string With(absl::string_view from, absl::string_view to) {
  std::string text = absl::StrReplaceAll(kGood, {{from, to}});
  EXPECT_NE(text, kGood) << "replacement did not apply: " << from;
  return text;
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<PlanInput> in = ParsePlanInput(text, "p.yaml");
  EXPECT_FALSE(in.ok());
  if (in.ok()) return "";
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(in.status().message());
}

TEST(PlanInputTest, ParsesTheIssueExample) {
  absl::StatusOr<PlanInput> in = ParsePlanInput(kGood, "p.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE(in->workload.stateless);
  EXPECT_TRUE(in->policy.budget_constrained);
  EXPECT_EQ(in->san, SanType::kNone);
  EXPECT_EQ(in->cluster.gpu, "L4");
  EXPECT_EQ(in->cluster.nodes, 3);
  EXPECT_EQ(in->cluster.target_streams, 20);
  EXPECT_DOUBLE_EQ(in->facilities.surge_factor, 1.3);
  // Only the planner's own extra field was left out.
  EXPECT_EQ(in->defaults_applied, std::vector<std::string>{"workload.expected_restart_minutes=5"});
}

TEST(PlanInputTest, MinimalInputListsEveryDefault) {
  absl::StatusOr<PlanInput> in = ParsePlanInput(
      "workload: { stateless: true }\ncluster: { gpu: T4, nodes: 2, streams_per_gpu: 4, "
      "target_streams: 4 }\n",
      "p.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_THAT(in->defaults_applied,
              ::testing::IsSupersetOf({"cluster.redundancy=1", "storage.san=none",
                                       "policy.vm_ha_mandatory=false", "facilities.host_watts=350",
                                       "cluster.buffer_node=none", "cluster.gpus_per_node=1"}));
}

TEST(PlanInputTest, UnknownKeyNamesFieldAndLine) {
  EXPECT_THAT(
      ErrorOf(With("  redundancy: 1", "  redundancy: 1\n  redundncy: 2")),
      HasSubstr("p.yaml:10:3: cluster.redundncy: unknown key (did you mean 'redundancy'?)"));
}

TEST(PlanInputTest, UnknownTopLevelSection) {
  EXPECT_THAT(ErrorOf(std::string(kGood) + "network: { nic: cx7 }\n"),
              HasSubstr("p.yaml:13:1: network: unknown key"));
}

TEST(PlanInputTest, WrongTypeNamesField) {
  EXPECT_THAT(ErrorOf(With("nodes: 3", "nodes: three")),
              HasSubstr("p.yaml:6:10: cluster.nodes: expected an integer, got 'three'"));
  EXPECT_THAT(ErrorOf(With("stateless: true", "stateless: maybe")),
              HasSubstr("p.yaml:1:24: workload.stateless: expected true or false, got 'maybe'"));
  EXPECT_THAT(ErrorOf(With("surge_factor: 1.3", "surge_factor: [1]")),
              HasSubstr("facilities.surge_factor: expected a number, got a list"));
  EXPECT_THAT(ErrorOf(With("cluster:\n", "cluster: 7\nx:\n")),
              HasSubstr("cluster: expected a mapping, got '7'"));
}

TEST(PlanInputTest, NodesNotAboveRedundancyIsImpossible) {
  EXPECT_THAT(ErrorOf(With("redundancy: 1", "redundancy: 3")),
              HasSubstr("p.yaml:9:15: cluster.redundancy: nodes (3) must exceed redundancy (3)"));
}

TEST(PlanInputTest, NegativeStreamsAreRefused) {
  EXPECT_THAT(ErrorOf(With("target_streams: 20", "target_streams: -5")),
              HasSubstr("cluster.target_streams: must be at least 0, got -5"));
  EXPECT_THAT(ErrorOf(With("streams_per_gpu: 10", "streams_per_gpu: -1")),
              HasSubstr("cluster.streams_per_gpu: must be at least 1, got -1"));
  EXPECT_THAT(ErrorOf(With("nodes: 3", "nodes: 0")),
              HasSubstr("cluster.nodes: must be at least 1"));
}

TEST(PlanInputTest, BadEnumListsChoices) {
  EXPECT_THAT(ErrorOf(With("san: none", "san: nfs")),
              HasSubstr("storage.san: 'nfs' is not one of: none, fc, iscsi"));
  EXPECT_THAT(ErrorOf(With("buffer_node: none", "buffer_node: tpu")),
              HasSubstr("cluster.buffer_node: 'tpu' is not one of: none, cpu, gpu"));
}

TEST(PlanInputTest, ImpossibleFacilitiesNumbers) {
  EXPECT_THAT(ErrorOf(With("ups_power_factor: 0.9", "ups_power_factor: 0")),
              HasSubstr("facilities.ups_power_factor: must be above 0"));
  EXPECT_THAT(ErrorOf(With("surge_factor: 1.3", "surge_factor: 0.5")),
              HasSubstr("facilities.surge_factor: must be at least 1"));
}

TEST(PlanInputTest, UnknownGpuNeedsTdp) {
  EXPECT_THAT(ErrorOf(With("gpu: L4", "gpu: B300X")),
              HasSubstr("cluster.gpu: 'B300X' is not a known GPU model; set cluster.tdp_watts"));
  absl::StatusOr<PlanInput> in =
      ParsePlanInput(With("gpu: L4", "gpu: B300X\n  tdp_watts: 1100"), "p.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->cluster.tdp_watts, 1100);
}

TEST(PlanInputTest, MissingRequiredField) {
  EXPECT_THAT(ErrorOf(With("  target_streams: 20\n", "")),
              HasSubstr("cluster.target_streams: is required but missing"));
  EXPECT_THAT(ErrorOf(With("stateless: true, ", "")),
              HasSubstr("workload.stateless: is required but missing"));
}

TEST(PlanInputTest, NotYaml) {
  EXPECT_THAT(ErrorOf("workload: { stateless: true\ncluster: [\n"), HasSubstr("not valid YAML"));
  EXPECT_THAT(ErrorOf("\x01\x02 binary junk: : :\n"), HasSubstr("p.yaml:"));
  EXPECT_THAT(ErrorOf("- a\n- b\n"), HasSubstr("expected a mapping at the top level"));
}

TEST(PlanInputTest, MissingFileIsNotFound) {
  absl::StatusOr<PlanInput> in = LoadPlanInputFile("/nonexistent/plan.yaml");
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), absl::StatusCode::kNotFound);
}

TEST(PlanInputTest, YamlRoundTripKeepsEveryField) {
  absl::StatusOr<PlanInput> in =
      ParsePlanInput(With("gpu: L4", "gpu: B300X\n  tdp_watts: 1100").append("\n"), "p.yaml");
  ASSERT_TRUE(in.ok()) << in.status();
  in->san = SanType::kIscsi;
  in->cluster.buffer_node = BufferNode::kGpu;
  in->cluster.slices_per_gpu = 2;
  in->cluster.streams_per_gpu = 10;
  in->cluster.slice_profile = "L4-12Q";
  absl::StatusOr<PlanInput> back = ParsePlanInput(PlanInputToYaml(*in), "round");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << PlanInputToYaml(*in);
  EXPECT_EQ(PlanInputToYaml(*back), PlanInputToYaml(*in));
  EXPECT_TRUE(back->defaults_applied.empty());
}

TEST(PlanInputTest, SlicesMustSplitTheStreamsEvenly) {
  EXPECT_THAT(ErrorOf(With("  redundancy: 1", "  redundancy: 1\n  slices_per_gpu: 3")),
              HasSubstr("cluster.slices_per_gpu: streams_per_gpu (10) must split evenly over 3"));
  EXPECT_THAT(ErrorOf(With("  redundancy: 1", "  redundancy: 1\n  slices_per_gpu: 0")),
              HasSubstr("cluster.slices_per_gpu"));
}

}  // namespace
}  // namespace gpuha::plan
