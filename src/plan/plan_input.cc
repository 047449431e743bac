#include "plan/plan_input.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"
#include "gpu/gpu_models.h"

namespace gpuha::plan {
namespace {

using common::YamlDocument;
using common::YamlMap;

// Reads optional fields into a PlanInput, recording each default it keeps.
class FieldReader {
 public:
  FieldReader(YamlMap map, std::vector<std::string>* defaults)
      : map_(std::move(map)), defaults_(defaults) {}

  void Bool(absl::string_view key, bool* out) {
    if (std::optional<bool> v = map_.Bool(key)) {
      *out = *v;
    } else if (!map_.Has(key)) {
      Defaulted(key, *out ? "true" : "false");
    }
  }
  // Integers must lie in [min, max].
  void Int(absl::string_view key, int64_t* out, int64_t min, int64_t max, bool required) {
    if (required && !map_.Require(key)) return;
    if (std::optional<int64_t> v = map_.Int(key)) {
      if (*v < min || *v > max) {
        map_.Fail(key, *v < min ? absl::StrCat("must be at least ", min, ", got ", *v)
                                : absl::StrCat("must be at most ", max, ", got ", *v));
        return;
      }
      *out = *v;
    } else if (!map_.Has(key)) {
      Defaulted(key, absl::StrCat(*out));
    }
  }
  // Numbers must lie in [min, max]; `min_exclusive` makes the lower bound open.
  void Number(absl::string_view key, double* out, double min, double max,
              bool min_exclusive = false) {
    if (std::optional<double> v = map_.Number(key)) {
      bool low = min_exclusive ? *v <= min : *v < min;
      if (low || *v > max) {
        map_.Fail(key, absl::StrCat("must be ", min_exclusive ? "above " : "at least ", min,
                                    " and at most ", max, ", got ", *v));
        return;
      }
      *out = *v;
    } else if (!map_.Has(key)) {
      Defaulted(key, absl::StrCat(*out));
    }
  }
  YamlMap& map() { return map_; }

 private:
  void Defaulted(absl::string_view key, absl::string_view value) {
    if (map_.ok()) defaults_->push_back(absl::StrCat(map_.FieldPath(key), "=", value));
  }
  YamlMap map_;
  std::vector<std::string>* defaults_;
};

std::string KnownModelList() {
  std::vector<absl::string_view> names;
  for (const gpu::GpuModel& m : gpu::KnownGpuModels()) names.push_back(m.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::string_view SanTypeName(SanType t) {
  switch (t) {
    case SanType::kNone:
      return "none";
    case SanType::kFc:
      return "fc";
    case SanType::kIscsi:
      return "iscsi";
  }
  return "none";
}

absl::string_view BufferNodeName(BufferNode b) {
  switch (b) {
    case BufferNode::kNone:
      return "none";
    case BufferNode::kCpu:
      return "cpu";
    case BufferNode::kGpu:
      return "gpu";
  }
  return "none";
}

absl::StatusOr<PlanInput> ParsePlanInput(absl::string_view yaml, std::string source) {
  absl::StatusOr<YamlDocument> doc = YamlDocument::LoadString(yaml, std::move(source));
  if (!doc.ok()) return doc.status();
  YamlMap root = doc->Root();
  PlanInput in;
  std::vector<std::string>* defaults = &in.defaults_applied;

  FieldReader workload(root.Map("workload"), defaults);
  if (workload.map().Require("stateless")) workload.Bool("stateless", &in.workload.stateless);
  workload.Bool("zero_downtime", &in.workload.zero_downtime);
  workload.Number("restart_tolerance_minutes", &in.workload.restart_tolerance_minutes, 0, 10080);
  workload.Number("expected_restart_minutes", &in.workload.expected_restart_minutes, 0, 10080,
                  /*min_exclusive=*/true);

  FieldReader policy(root.Map("policy"), defaults);
  policy.Bool("vm_ha_mandatory", &in.policy.vm_ha_mandatory);
  policy.Bool("gpu_sharing", &in.policy.gpu_sharing);
  policy.Bool("sharing_cost_justified", &in.policy.sharing_cost_justified);
  policy.Bool("budget_constrained", &in.policy.budget_constrained);

  YamlMap storage = root.Map("storage");
  if (std::optional<std::string> san = storage.Enum("san", {"none", "fc", "iscsi"})) {
    in.san = *san == "fc" ? SanType::kFc : *san == "iscsi" ? SanType::kIscsi : SanType::kNone;
  } else if (!storage.Has("san") && root.ok()) {
    defaults->push_back("storage.san=none");
  }

  FieldReader cluster(root.Map("cluster"), defaults);
  YamlMap& cm = cluster.map();
  if (cm.Require("gpu")) {
    if (std::optional<std::string> gpu = cm.String("gpu")) in.cluster.gpu = *gpu;
  }
  if (cm.Has("tdp_watts")) {
    double tdp = 0;
    cluster.Number("tdp_watts", &tdp, 0, 2000, /*min_exclusive=*/true);
    if (cm.ok()) in.cluster.tdp_watts = tdp;
  }
  if (cm.ok() && !in.cluster.gpu.empty() && gpu::FindGpuModel(in.cluster.gpu) == nullptr &&
      !in.cluster.tdp_watts) {
    cm.Fail("gpu", absl::StrCat("'", in.cluster.gpu,
                                "' is not a known GPU model; set cluster.tdp_watts for it "
                                "(known models: ",
                                KnownModelList(), ")"));
  }
  constexpr int64_t kMaxCount = 1'000'000;
  cluster.Int("nodes", &in.cluster.nodes, 1, 100'000, /*required=*/true);
  cluster.Int("gpus_per_node", &in.cluster.gpus_per_node, 1, 64, false);
  cluster.Int("streams_per_gpu", &in.cluster.streams_per_gpu, 1, kMaxCount, true);
  // Slices are for those who have them: left out, they are not a default
  // worth listing.
  if (cm.Has("slices_per_gpu")) {
    cluster.Int("slices_per_gpu", &in.cluster.slices_per_gpu, 1, 64, false);
  }
  if (std::optional<std::string> p = cm.String("slice_profile")) in.cluster.slice_profile = *p;
  if (cm.ok() && in.cluster.streams_per_gpu % in.cluster.slices_per_gpu != 0) {
    cm.Fail("slices_per_gpu",
            absl::StrCat("streams_per_gpu (", in.cluster.streams_per_gpu,
                         ") must split evenly over ", in.cluster.slices_per_gpu, " slices"));
  }
  cluster.Int("redundancy", &in.cluster.redundancy, 0, 100'000, false);
  cluster.Int("target_streams", &in.cluster.target_streams, 0, kMaxCount * 100, true);
  if (cm.ok() && in.cluster.nodes <= in.cluster.redundancy) {
    cm.Fail(cm.Has("redundancy") ? "redundancy" : "nodes",
            absl::StrCat("nodes (", in.cluster.nodes, ") must exceed redundancy (",
                         in.cluster.redundancy, "): a cluster that loses ", in.cluster.redundancy,
                         " of ", in.cluster.nodes, " nodes has nothing left to serve"));
  }
  if (std::optional<std::string> b = cm.Enum("buffer_node", {"none", "cpu", "gpu"})) {
    in.cluster.buffer_node = *b == "cpu"   ? BufferNode::kCpu
                             : *b == "gpu" ? BufferNode::kGpu
                                           : BufferNode::kNone;
  } else if (!cm.Has("buffer_node") && cm.ok()) {
    defaults->push_back("cluster.buffer_node=none");
  }

  FieldReader facilities(root.Map("facilities"), defaults);
  facilities.Number("host_watts", &in.facilities.host_watts, 0, 20000);
  facilities.Number("surge_factor", &in.facilities.surge_factor, 1, 3);
  facilities.Number("ups_power_factor", &in.facilities.ups_power_factor, 0, 1,
                    /*min_exclusive=*/true);
  facilities.Number("ups_headroom", &in.facilities.ups_headroom, 0, 2);

  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return in;
}

absl::StatusOr<PlanInput> LoadPlanInputFile(const std::string& path) {
  absl::StatusOr<std::string> text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParsePlanInput(*text, path);
}

std::string PlanInputToYaml(const PlanInput& in) {
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::ostringstream y;
  y << "# gpuha plan input (see examples/ and `gpuha plan --help`)\n";
  y << "workload: { stateless: " << b(in.workload.stateless)
    << ", zero_downtime: " << b(in.workload.zero_downtime)
    << ", restart_tolerance_minutes: " << in.workload.restart_tolerance_minutes
    << ", expected_restart_minutes: " << in.workload.expected_restart_minutes << " }\n";
  y << "policy: { vm_ha_mandatory: " << b(in.policy.vm_ha_mandatory)
    << ", gpu_sharing: " << b(in.policy.gpu_sharing)
    << ", sharing_cost_justified: " << b(in.policy.sharing_cost_justified)
    << ", budget_constrained: " << b(in.policy.budget_constrained) << " }\n";
  y << "storage: { san: " << SanTypeName(in.san) << " }          # none | fc | iscsi\n";
  y << "cluster:\n";
  y << "  gpu: " << YAML::Dump(YAML::Node(in.cluster.gpu)) << "\n";
  if (in.cluster.tdp_watts) y << "  tdp_watts: " << *in.cluster.tdp_watts << "\n";
  y << "  nodes: " << in.cluster.nodes << "\n";
  y << "  gpus_per_node: " << in.cluster.gpus_per_node << "\n";
  y << "  streams_per_gpu: " << in.cluster.streams_per_gpu << "\n";
  y << "  slices_per_gpu: " << in.cluster.slices_per_gpu << "\n";
  if (!in.cluster.slice_profile.empty()) {
    y << "  slice_profile: " << YAML::Dump(YAML::Node(in.cluster.slice_profile)) << "\n";
  }
  y << "  redundancy: " << in.cluster.redundancy << "                 # the k of N+k\n";
  y << "  target_streams: " << in.cluster.target_streams << "\n";
  y << "  buffer_node: " << BufferNodeName(in.cluster.buffer_node)
    << "             # none | cpu | gpu\n";
  y << "facilities: { host_watts: " << in.facilities.host_watts
    << ", surge_factor: " << in.facilities.surge_factor
    << ", ups_power_factor: " << in.facilities.ups_power_factor
    << ", ups_headroom: " << in.facilities.ups_headroom << " }\n";
  return y.str();
}

}  // namespace gpuha::plan
