// Runs the real `gpuha plan` binary on the shipped examples and on bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/testing/temp_dir.h"
#include "tests/e2e/run_command.h"

namespace gpuha::e2e {
namespace {

using ::testing::HasSubstr;

const std::string kGpuha = GPUHA_BINARY;
const std::string kSrc = GPUHA_SOURCE_DIR;

std::string Example(const char* name) { return kSrc + "/examples/" + name; }

std::string TempFile(const char* name) { return (gpuha::testing::TestTempDir() / name).string(); }

nlohmann::json PlanJson(const char* example) {
  CommandResult r = RunCommand(kGpuha + " plan --format json " + Example(example));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(PlanCliTest, ExamplesReachTheirScenarios) {
  EXPECT_EQ(PlanJson("iiot-edge.yaml")["outcome"], "passthrough-k8s-n+1");
  EXPECT_EQ(PlanJson("scenario-a-dedicated-no-san.yaml")["outcome"], "passthrough-k8s-n+1");
  nlohmann::json b = PlanJson("scenario-b-vmware-ha-san.yaml");
  EXPECT_EQ(b["outcome"], "vgpu-san");
  EXPECT_EQ(b["design"]["hba"], "required");
  nlohmann::json c = PlanJson("scenario-c-buffer-node.yaml");
  EXPECT_EQ(c["outcome"], "buffer-node");
  EXPECT_EQ(c["capacity"]["total_streams"], 40);
  EXPECT_EQ(c["capacity"]["headroom_streams"], 0);
}

TEST(PlanCliTest, TextIsTheDefaultFormat) {
  CommandResult r = RunCommand(kGpuha + " plan " + Example("iiot-edge.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Outcome: passthrough-k8s-n+1"));
}

TEST(PlanCliTest, MarkdownToFile) {
  std::string out = TempFile("plan.md");
  CommandResult r =
      RunCommand(kGpuha + " plan -f markdown -o " + out + " " + Example("iiot-edge.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_THAT(Slurp(out), HasSubstr("## Decision matrix"));
}

TEST(PlanCliTest, BadInputExitsTwoNamingFieldAndLine) {
  std::string bad = TempFile("bad.yaml");
  std::ofstream(bad) << "workload: { stateless: true }\ncluster:\n  gpu: L4\n  nodes: -3\n"
                        "  streams_per_gpu: 10\n  target_streams: 5\n";
  CommandResult r = RunCommand(kGpuha + " plan " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(bad + ":4:10: cluster.nodes: must be at least 1, got -3"));
  EXPECT_TRUE(r.out.empty());
}

TEST(PlanCliTest, NotYamlExitsTwo) {
  std::string bad = TempFile("notyaml.yaml");
  std::ofstream(bad) << "{ this is: [not, yaml\n";
  CommandResult r = RunCommand(kGpuha + " plan " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not valid YAML"));
}

TEST(PlanCliTest, MissingFileAndBadFlagsExitTwo) {
  EXPECT_EQ(RunCommand(kGpuha + " plan /nonexistent.yaml").exit_code, 2);
  CommandResult r = RunCommand(kGpuha + " plan --format pdf " + Example("iiot-edge.yaml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("pdf"));
  EXPECT_EQ(RunCommand(kGpuha + " plan").exit_code, 2);
  EXPECT_EQ(RunCommand(kGpuha + " frobnicate").exit_code, 2);
}

TEST(PlanCliTest, StrictExitsThreeOnWarnings) {
  EXPECT_EQ(RunCommand(kGpuha + " plan --strict " + Example("iiot-edge.yaml")).exit_code, 0);
  CommandResult r =
      RunCommand(kGpuha + " plan --strict " + Example("scenario-b-vmware-ha-san.yaml"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.out, HasSubstr("[vgpu-license]"));
}

TEST(PlanCliTest, InteractiveWritesYamlThatPlansTheSame) {
  std::string saved = TempFile("asked.yaml");
  std::string answers = "yes\n\n\n\n\n\nyes\n\nL4\n3\n1\n10\n1\n20\n\n\n\n\n\n";
  CommandResult r =
      RunCommand(kGpuha + " plan --interactive --write " + saved + " --format json", answers);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Is the GPU workload stateless"));
  nlohmann::json asked = nlohmann::json::parse(r.out);
  CommandResult again = RunCommand(kGpuha + " plan --format json " + saved);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  nlohmann::json from_file = nlohmann::json::parse(again.out);
  EXPECT_EQ(asked["outcome"], "passthrough-k8s-n+1");
  EXPECT_EQ(asked["capacity"], from_file["capacity"]);
  EXPECT_EQ(asked["facilities"], from_file["facilities"]);
  nlohmann::json example = PlanJson("iiot-edge.yaml");
  example["defaults_applied"] = nlohmann::json::array();  // every question was answered
  EXPECT_EQ(asked, example);
}

}  // namespace
}  // namespace gpuha::e2e
