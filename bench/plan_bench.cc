// How long `gpuha plan` spends parsing, deciding and rendering, so that the
// planner can be called per request by other tools (a capacity check in CI, a
// web form). Compared against a bare yaml-cpp parse of the same file, the
// floor any YAML-reading planner pays.
#include <benchmark/benchmark.h>
#include <yaml-cpp/yaml.h>

#include "common/file_util.h"
#include "plan/plan_input.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace {

std::string ExampleText() {
  return *gpuha::common::ReadFile(std::string(GPUHA_SOURCE_DIR) + "/examples/iiot-edge.yaml");
}

void BM_YamlCppParseOnly(benchmark::State& state) {
  std::string text = ExampleText();
  for (auto _ : state) benchmark::DoNotOptimize(YAML::Load(text));
}
BENCHMARK(BM_YamlCppParseOnly);

void BM_PlanParseValidate(benchmark::State& state) {
  std::string text = ExampleText();
  for (auto _ : state) benchmark::DoNotOptimize(gpuha::plan::ParsePlanInput(text, "bench"));
}
BENCHMARK(BM_PlanParseValidate);

void BM_PlanEndToEndJson(benchmark::State& state) {
  std::string text = ExampleText();
  for (auto _ : state) {
    auto in = gpuha::plan::ParsePlanInput(text, "bench");
    benchmark::DoNotOptimize(gpuha::plan::RenderJson(gpuha::plan::MakePlan(*in)).dump());
  }
}
BENCHMARK(BM_PlanEndToEndJson);

}  // namespace

BENCHMARK_MAIN();
