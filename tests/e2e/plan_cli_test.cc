// Runs the real `gpuha plan` and `gpuha sim` binaries on the shipped examples
// and on bad input.
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

// --- gpuha sim ------------------------------------------------------------------

TEST(SimCliTest, TheExampleComparesEveryStrategyInJson) {
  CommandResult r = RunCommand(kGpuha + " sim --format json " + Example("sim/fleet.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["strategies"].size(), 5u);
  for (const char* s : {"no-ha", "scenario-a", "scenario-b", "scenario-c", "gpuha"}) {
    const nlohmann::json& x = j["strategies"][s];
    EXPECT_GT(x["availability"].get<double>(), 0.99) << s;
    EXPECT_LE(x["availability"].get<double>(), 1.0) << s;
    EXPECT_EQ(x["availability_ci95"].size(), 2u) << s;
    EXPECT_GE(x["stream_hours_lost"].get<double>(), 0) << s;
    EXPECT_TRUE(x["overflow_events"].is_number()) << s;
    EXPECT_TRUE(x["idle_gpus"].is_number_integer()) << s;
  }
  EXPECT_EQ(j["strategies"]["no-ha"]["idle_gpus"], 0);
  EXPECT_EQ(j["runs"], 10);
  // The example the README points at ranks gpuha as shipped (a server per
  // GPU) ahead of every other row, as the README says.
  const nlohmann::json& gpuha = j["strategies"]["gpuha"];
  for (const char* s : {"no-ha", "scenario-a", "scenario-b", "scenario-c"}) {
    const nlohmann::json& x = j["strategies"][s];
    EXPECT_GT(gpuha["availability"].get<double>(), x["availability"].get<double>()) << s;
    EXPECT_LT(gpuha["stream_hours_lost"].get<double>(), x["stream_hours_lost"].get<double>()) << s;
  }
}

TEST(SimCliTest, TextTableSvgAndSeed) {
  std::string in = TempFile("small.yaml");
  std::ofstream(in) << "fleet: { nodes: 16, gpus_per_node: 2, streams_per_gpu: 2 }\n"
                       "failures: { preset: llama3, gpu: { mtbf_hours: 2000, repair_hours: 30 } }\n"
                       "runs: 3\nstrategies: [no-ha, gpuha]\n";
  std::string svg = TempFile("chart.svg");
  CommandResult r = RunCommand(kGpuha + " sim " + in + " --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("availability (95% interval)"));
  EXPECT_THAT(r.out, HasSubstr("gpuha "));
  EXPECT_THAT(r.out, HasSubstr("Llama 3 report"));  // each default cites its source
  std::string chart = Slurp(svg);
  EXPECT_THAT(chart, ::testing::StartsWith("<svg"));
  EXPECT_THAT(chart, HasSubstr("no-ha 16:"));
  EXPECT_THAT(chart, HasSubstr("gpuha 2:"));  // the sweep: 16, 8, 4, 2 nodes

  auto lost = [&](const std::string& flags) {
    CommandResult j = RunCommand(kGpuha + " sim -f json " + flags + " " + in);
    EXPECT_EQ(j.exit_code, 0) << j.err;
    return nlohmann::json::parse(j.out)["strategies"]["no-ha"]["stream_hours_lost"];
  };
  EXPECT_EQ(lost("--seed 7"), lost("--seed 7 -j 1"));
  EXPECT_NE(lost("--seed 7"), lost("--seed 8"));

  // The progress bar goes to stderr (asked for here: stderr is no terminal).
  CommandResult p = RunCommand(kGpuha + " sim --progress " + in);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.err, HasSubstr("6/6 runs"));
  EXPECT_THAT(p.out, HasSubstr("availability (95% interval)"));
}

TEST(SimCliTest, BadInputExitsTwoNamingFieldAndLine) {
  std::string bad = TempFile("bad-sim.yaml");
  std::ofstream(bad) << "fleet: { nodes: 4, gpus_per_node: 1, streams_per_gpu: 1 }\n"
                        "failures:\n  node: { mtbf_hours: 0, repair_hours: 2 }\n";
  CommandResult r = RunCommand(kGpuha + " sim " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad-sim.yaml:3:23: failures.node.mtbf_hours: must be above 0"));
  EXPECT_TRUE(r.out.empty());

  std::ofstream(bad) << "fleet: { nodes: 4, gpus_per_node: 1, streams_per_gpu: 1 }\n"
                        "failures: {}\nstrategies: [gpuha, k8s]\n";
  r = RunCommand(kGpuha + " sim " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("strategies: unknown strategy 'k8s'"));

  EXPECT_EQ(RunCommand(kGpuha + " sim " + TempFile("missing.yaml")).exit_code, 2);
  EXPECT_EQ(RunCommand(kGpuha + " sim --format xml " + Example("sim/fleet.yaml")).exit_code, 2);
  EXPECT_EQ(RunCommand(kGpuha + " sim").exit_code, 2);
}

}  // namespace
}  // namespace gpuha::e2e
