#include "plan/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/file_util.h"

namespace gpuha::plan {
namespace {

using ::testing::HasSubstr;

const std::string kExample = std::string(GPUHA_SOURCE_DIR) + "/examples/iiot-edge.yaml";

Plan ExamplePlan() {
  absl::StatusOr<PlanInput> in = LoadPlanInputFile(kExample);
  EXPECT_TRUE(in.ok()) << in.status();
  return MakePlan(*in);
}

// Set GPUHA_UPDATE_GOLDEN=1 to rewrite the golden file after an intended change.
TEST(ReportTest, TextReportMatchesGolden) {
  const std::string golden_path =
      std::string(GPUHA_SOURCE_DIR) + "/src/plan/testdata/iiot-edge.txt";
  std::string text = RenderText(ExamplePlan(), "examples/iiot-edge.yaml");
  if (std::getenv("GPUHA_UPDATE_GOLDEN") != nullptr) {
    ASSERT_TRUE(common::WriteFileAtomic(golden_path, text).ok());
  }
  absl::StatusOr<std::string> golden = common::ReadFile(golden_path);
  ASSERT_TRUE(golden.ok()) << golden.status();
  EXPECT_EQ(text, *golden);
}

TEST(ReportTest, JsonFollowsTheContract) {
  nlohmann::json j = RenderJson(ExamplePlan());
  EXPECT_EQ(j["outcome"], "passthrough-k8s-n+1");
  EXPECT_EQ(j["path"][0], (nlohmann::json{{"question", "stateless"}, {"answer", true}}));
  EXPECT_EQ(j["design"], (nlohmann::json{{"allocation", "pci-passthrough"},
                                         {"san", "none"},
                                         {"hba", "not-needed"},
                                         {"orchestration", "kubernetes"},
                                         {"capacity_model", "n+k"}}));
  const nlohmann::json& c = j["capacity"];
  EXPECT_EQ(c["nodes"], 3);
  EXPECT_EQ(c["gpus_per_node"], 1);
  EXPECT_EQ(c["streams_per_gpu"], 10);
  EXPECT_EQ(c["total_streams"], 30);
  EXPECT_EQ(c["redundancy"], 1);
  EXPECT_EQ(c["max_production_streams"], 20);
  EXPECT_EQ(c["failover_reserve_streams"], 10);
  EXPECT_EQ(c["target_streams"], 20);
  EXPECT_EQ(c["headroom_streams"], 0);
  EXPECT_EQ(c["survives_node_loss"], true);
  EXPECT_DOUBLE_EQ(j["facilities"]["it_load_watts"].get<double>(), 1330.8);
  EXPECT_DOUBLE_EQ(j["facilities"]["ups_va"].get<double>(), 1848.3);
  EXPECT_DOUBLE_EQ(j["facilities"]["cooling_btu_per_hour"].get<double>(), 4540.7);
  EXPECT_TRUE(j["warnings"].is_array());
  ASSERT_TRUE(j["matrix"].is_array());
  EXPECT_EQ(j["matrix"][0],
            (nlohmann::json{{"requirement", "Lowest cost"}, {"best_choice", "PCI Passthrough"}}));
}

TEST(ReportTest, JsonSanTypeAnswerIsAString) {
  Plan p = ExamplePlan();
  p.input.policy.vm_ha_mandatory = true;
  p.input.san = SanType::kFc;
  nlohmann::json j = RenderJson(MakePlan(p.input));
  EXPECT_EQ(j["path"].back(), (nlohmann::json{{"question", "san_type"}, {"answer", "fc"}}));
  EXPECT_EQ(j["design"]["hba"], "required");
  EXPECT_EQ(j["warnings"][0]["code"], "manual-gpu-rebind");
}

TEST(ReportTest, MarkdownHasEverySection) {
  std::string md = RenderMarkdown(ExamplePlan(), "examples/iiot-edge.yaml");
  EXPECT_THAT(md, HasSubstr("# gpuha plan: `examples/iiot-edge.yaml`"));
  EXPECT_THAT(md, HasSubstr("**Outcome:** `passthrough-k8s-n+1`"));
  for (const char* section :
       {"## Decision path", "## Design", "## Capacity (N+1)", "## Facilities (L4, 72 W TDP)",
        "## Decision matrix", "## Warnings"}) {
    EXPECT_THAT(md, HasSubstr(section));
  }
  EXPECT_THAT(md, HasSubstr("| max production load | 20 streams |"));
}

TEST(ReportTest, TextShowsWarningsWhenOverCapacity) {
  Plan p = ExamplePlan();
  p.input.cluster.target_streams = 25;
  std::string text = RenderText(MakePlan(p.input), "x");
  EXPECT_THAT(text, HasSubstr("[no-ha-capacity] target of 25 streams exceeds the N+1 limit of 20"));
  EXPECT_THAT(text, HasSubstr("survives loss of 1 node(s)     NO"));
}

}  // namespace
}  // namespace gpuha::plan
