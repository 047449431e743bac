// PlanInput: what an infra team tells the planner about its workload, policy,
// storage, cluster and facilities (the questions of seed 002's decision flow).
//
//   absl::StatusOr<PlanInput> in = LoadPlanInputFile("examples/iiot-edge.yaml");
//   if (!in.ok()) { std::cerr << in.status().message(); return 2; }
//
// Parsing is strict: unknown keys, wrong types and impossible numbers give one
// error naming the field and its line. Optional fields that were left out are
// listed in `defaults_applied`, so no default is silent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::plan {

enum class SanType { kNone, kFc, kIscsi };
enum class BufferNode { kNone, kCpu, kGpu };

absl::string_view SanTypeName(SanType t);        // "none" | "fc" | "iscsi"
absl::string_view BufferNodeName(BufferNode b);  // "none" | "cpu" | "gpu"

struct PlanInput {
  struct Workload {
    bool stateless = true;
    bool zero_downtime = false;
    // How long the application may be down while it restarts elsewhere.
    double restart_tolerance_minutes = 5;
    // How long a restart on another node takes; seed 002 puts it at 2-5
    // minutes, and the planner assumes the slow end unless told.
    double expected_restart_minutes = 5;
  } workload;
  struct Policy {
    bool vm_ha_mandatory = false;
    bool gpu_sharing = false;
    bool sharing_cost_justified = false;
    bool budget_constrained = false;
  } policy;
  SanType san = SanType::kNone;
  struct Cluster {
    std::string gpu;
    std::optional<double> tdp_watts;  // overrides the table; required for unknown models
    int64_t nodes = 0;
    int64_t gpus_per_node = 1;
    int64_t streams_per_gpu = 0;
    // MIG instances or vGPU profiles per GPU (issue 16), each carrying
    // streams_per_gpu / slices_per_gpu streams; 1: whole GPUs.
    int64_t slices_per_gpu = 1;
    std::string slice_profile;  // "1g.10gb", "L4-4Q": named in the report only
    int64_t redundancy = 1;     // the k of N+k
    int64_t target_streams = 0;
    BufferNode buffer_node = BufferNode::kNone;
  } cluster;
  struct Facilities {
    double host_watts = 350;
    double surge_factor = 1.3;
    double ups_power_factor = 0.9;
    double ups_headroom = 0.25;
  } facilities;

  // "cluster.redundancy=1" for each optional field the input left out.
  std::vector<std::string> defaults_applied;
};

// `source` names the input in errors (a path, or "<interactive>").
[[nodiscard]] absl::StatusOr<PlanInput> ParsePlanInput(absl::string_view yaml, std::string source);
[[nodiscard]] absl::StatusOr<PlanInput> LoadPlanInputFile(const std::string& path);

// The input as YAML that ParsePlanInput reads back to an equal PlanInput.
std::string PlanInputToYaml(const PlanInput& in);

}  // namespace gpuha::plan
