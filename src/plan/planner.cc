#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gpu/gpu_models.h"
#include "sim/simulator.h"

namespace gpuha::plan {
namespace {

// Seed 002 §7: one watt of IT load is 3.412 BTU/h of heat to remove.
constexpr double kBtuPerHourPerWatt = 3.412;

struct Leaf {
  const char* id;
  const char* summary;
  Design design;  // hba is filled in by the SAN/HBA sub-decision
};

// The ends of seed 002's "high-level decision flow", in the order it lists them.
const Leaf kLeaves[] = {
    {"stateful-dedicated-san",
     "Dedicated GPUs with a SAN (vGPU optional): stateful or long-running work must restart "
     "from shared storage.",
     {"dedicated", "required", "", "none", "n+k"}},
    {"active-active-traffic-routing",
     "GPU live migration is not supported: redesign the application as active-active and route "
     "traffic around failures (gpuha router), not VMware HA.",
     {"pci-passthrough", "none", "", "traffic-routing", "active-active"}},
    {"vgpu-san",
     "vGPU + SAN + HBA/iSCSI under VMware HA: the VM restarts on another host.",
     {"vgpu", "required", "", "vmware-ha", "n+k"}},
    {"passthrough-san",
     "PCI passthrough + SAN under VMware HA: the VM restarts on another host; the GPU is rebound "
     "by hand.",
     {"pci-passthrough", "required", "", "vmware-ha", "n+k"}},
    {"vgpu-san-recommended",
     "vGPU for shared GPUs, with a SAN recommended; the license is justified.",
     {"vgpu", "recommended", "", "kubernetes", "n+k"}},
    {"re-evaluate-workload",
     "GPU sharing is wanted but its cost is not justified: re-evaluate the workload before "
     "buying vGPU licenses or a SAN.",
     {"pci-passthrough", "none", "", "none", "none"}},
    {"passthrough-k8s-n+1",
     "PCI passthrough on independent GPU nodes, Kubernetes HA, N+1 capacity, no SAN (the "
     "recommended default).",
     {"pci-passthrough", "none", "", "kubernetes", "n+k"}},
    {"buffer-node",
     "PCI passthrough plus a buffer node (CPU or spare GPU): capacity-based HA absorbs the load "
     "while a restart would take too long.",
     {"pci-passthrough", "none", "", "kubernetes", "buffer-node"}},
};

const Leaf& FindLeaf(absl::string_view id) {
  for (const Leaf& leaf : kLeaves) {
    if (leaf.id == id) return leaf;
  }
  // The flow below only names ids from kLeaves; anything else is a bug here.
  std::abort();
}

std::string BoolWord(bool b) { return b ? "true" : "false"; }

// Walks the decision flow, recording each answer; returns the leaf id.
std::string WalkDecisionFlow(const PlanInput& in, std::vector<Decision>* path) {
  auto ask = [&](const char* question, bool answer) {
    path->push_back({question, BoolWord(answer), true});
    return answer;
  };
  if (!ask("stateless", in.workload.stateless)) return "stateful-dedicated-san";
  if (ask("zero_downtime", in.workload.zero_downtime)) return "active-active-traffic-routing";
  if (ask("vm_ha_mandatory", in.policy.vm_ha_mandatory)) {
    return ask("gpu_sharing", in.policy.gpu_sharing) ? "vgpu-san" : "passthrough-san";
  }
  if (ask("gpu_sharing", in.policy.gpu_sharing)) {
    return ask("sharing_cost_justified", in.policy.sharing_cost_justified) ? "vgpu-san-recommended"
                                                                           : "re-evaluate-workload";
  }
  bool tolerable = in.workload.restart_tolerance_minutes >= in.workload.expected_restart_minutes;
  return ask("restart_tolerable", tolerable) ? "passthrough-k8s-n+1" : "buffer-node";
}

// Seed 002 §3: an HBA exists only for shared storage, and only FC needs one.
void DecideSanAndHba(const PlanInput& in, Design* design, std::vector<Decision>* path) {
  bool shared_storage = design->san != "none";
  path->push_back({"shared_storage", BoolWord(shared_storage), true});
  if (!shared_storage) {
    design->hba = "not-needed";
    return;
  }
  path->push_back({"san_type", std::string(SanTypeName(in.san)), false});
  design->hba = in.san == SanType::kFc ? "required" : "not-needed";
}

double GpuTdp(const PlanInput& in) {
  if (in.cluster.tdp_watts) return *in.cluster.tdp_watts;
  const gpu::GpuModel* model = gpu::FindGpuModel(in.cluster.gpu);
  return model != nullptr ? model->tdp_watts : 0;
}

std::string NPlusK(int64_t k) { return absl::StrCat("N+", k); }

void AddWarnings(Plan& p) {
  const PlanInput& in = p.input;
  const Capacity& c = p.capacity;
  auto warn = [&](const char* code, std::string message) {
    p.warnings.push_back({code, std::move(message)});
  };
  if (c.redundancy == 0) {
    warn("no-redundancy",
         "redundancy is 0: losing any node loses streams. The GPU HA & Sharing Strategy "
         "guide's N+1 Capacity Rule: N+1 is non-negotiable.");
  }
  if (c.headroom_streams < 0) {
    warn("no-ha-capacity",
         absl::StrCat("target of ", c.target_streams, " streams exceeds the ", NPlusK(c.redundancy),
                      " limit of ", c.max_production_streams, " (", c.total_streams, " total - ",
                      c.failover_reserve_streams,
                      " failover reserve). If you run all GPUs at "
                      "100%, no HA exists. Use ",
                      c.nodes_needed_for_target, " nodes or lower the target."));
  }
  if (in.cluster.buffer_node == BufferNode::kCpu) {
    warn("cpu-buffer-degrades",
         "the buffer node is CPU-only: a CPU gives degraded operation, not continuity, and adds "
         "no GPU capacity to the N+k figures.");
  }
  if (p.design.san == "required" && in.san == SanType::kNone) {
    warn("san-missing",
         absl::StrCat(in.policy.vm_ha_mandatory
                          ? "VM-level HA is mandated, but storage.san is none: VMware HA needs "
                            "every VM disk on shared storage. "
                          : "a stateful workload needs shared storage to restart elsewhere, but "
                            "storage.san is none. ",
                      "Choose fc (needs an HBA) or iscsi (a NIC is enough)."));
  }
  if (p.design.allocation == "vgpu") {
    warn("vgpu-license",
         "vGPU needs an NVIDIA vGPU license per GPU (and VMware licensing); budget for it.");
  }
  if (gpu::FindGpuModel(in.cluster.gpu) == nullptr) {
    warn("unknown-gpu", absl::StrCat("GPU model '", in.cluster.gpu,
                                     "' is not in the planner's table; power figures use "
                                     "cluster.tdp_watts = ",
                                     GpuTdp(in), " W."));
  }
  if (p.outcome == "buffer-node" && in.cluster.buffer_node == BufferNode::kNone) {
    warn("buffer-node-missing",
         "a restart cannot be tolerated, so this design needs a buffer node (cluster.buffer_node: "
         "gpu, or cpu for degraded service).");
  }
  if (p.outcome == "passthrough-san") {
    warn("manual-gpu-rebind",
         "PCI passthrough has no automatic GPU failover: after VMware HA restarts the VM, the GPU "
         "must be rebound by hand, and vMotion is not supported.");
  }
  if (in.policy.budget_constrained && p.design.san != "none") {
    warn("san-over-budget",
         "the budget is constrained but this design uses a SAN; the GPU HA & Sharing Strategy "
         "guide's quick table says "
         "'budget constrained: no SAN'.");
  }
  if (in.san != SanType::kNone && p.design.san == "none") {
    warn("san-not-needed",
         absl::StrCat("storage.san is ", SanTypeName(in.san),
                      " but this design needs no shared storage; keep the SAN out of the GPU "
                      "failover path."));
  }
}

void AddMatrix(Plan& p) {
  const PlanInput& in = p.input;
  const Design& d = p.design;
  auto row = [&](bool applies, const char* requirement, const char* choice) {
    if (applies) p.matrix.push_back({requirement, choice});
  };
  // Seed 002 §6, in its order; a row applies when the input asks for that
  // requirement or the design rests on its answer.
  row(in.policy.budget_constrained, "Lowest cost", "PCI Passthrough");
  row(d.allocation == "pci-passthrough", "Fastest inference", "PCI Passthrough");
  row(in.policy.gpu_sharing, "Shared GPU usage", "vGPU");
  row(in.policy.vm_ha_mandatory, "VMware-only ops", "vGPU + SAN");
  row(d.san == "none", "Edge / IIoT", "No SAN");
  row(d.orchestration == "kubernetes", "Predictable restart", "Kubernetes");
  row(d.allocation == "pci-passthrough" && d.san == "none" && d.orchestration != "vmware-ha",
      "Zero infra drama", "Independent nodes");
}

}  // namespace

const std::vector<std::string>& AllOutcomes() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> out;
    for (const Leaf& leaf : kLeaves) out.push_back(leaf.id);
    return out;
  }();
  return ids;
}

Capacity ComputeCapacity(const PlanInput::Cluster& cluster) {
  Capacity c;
  c.nodes = cluster.nodes;
  c.gpus_per_node = cluster.gpus_per_node;
  c.streams_per_gpu = cluster.streams_per_gpu;
  c.redundancy = cluster.redundancy;
  c.target_streams = cluster.target_streams;
  const int64_t per_node = cluster.gpus_per_node * cluster.streams_per_gpu;
  const int64_t gpu_buffer = cluster.buffer_node == BufferNode::kGpu ? 1 : 0;
  c.total_streams = (cluster.nodes + gpu_buffer) * per_node;
  c.failover_reserve_streams = cluster.redundancy * per_node;
  c.max_production_streams = c.total_streams - c.failover_reserve_streams;
  c.headroom_streams = c.max_production_streams - c.target_streams;
  c.survives_node_loss = c.headroom_streams >= 0 && cluster.redundancy >= 1;
  const int64_t carrying = (cluster.target_streams + per_node - 1) / per_node;
  c.nodes_needed_for_target = std::max(carrying + cluster.redundancy, cluster.redundancy + 1);
  c.slices_per_gpu = cluster.slices_per_gpu;
  const int64_t headroom = std::max<int64_t>(c.headroom_streams, 0);
  c.gpu_failures_absorbed = headroom / cluster.streams_per_gpu;
  c.slice_failures_absorbed = headroom / (cluster.streams_per_gpu / cluster.slices_per_gpu);
  return c;
}

FacilitiesSizing ComputeFacilities(const PlanInput& in) {
  FacilitiesSizing f;
  f.gpu_tdp_watts = GpuTdp(in);
  const PlanInput::Facilities& fac = in.facilities;
  const double gpu_node =
      static_cast<double>(in.cluster.gpus_per_node) * f.gpu_tdp_watts * fac.surge_factor +
      fac.host_watts;
  // A spare draws power too: sized without it, the UPS and cooling of a
  // buffer-node design came out a node short.
  const double buffer = in.cluster.buffer_node == BufferNode::kGpu   ? gpu_node
                        : in.cluster.buffer_node == BufferNode::kCpu ? fac.host_watts
                                                                     : 0;
  f.powered_nodes = in.cluster.nodes + (in.cluster.buffer_node == BufferNode::kNone ? 0 : 1);
  f.it_load_watts = static_cast<double>(in.cluster.nodes) * gpu_node + buffer;
  f.ups_va = f.it_load_watts * (1 + fac.ups_headroom) / fac.ups_power_factor;
  f.cooling_btu_per_hour = f.it_load_watts * kBtuPerHourPerWatt;
  return f;
}

std::string StrategyForOutcome(const std::string& outcome) {
  if (outcome == "active-active-traffic-routing") return "gpuha";
  if (outcome == "vgpu-san" || outcome == "passthrough-san") return "scenario-b";
  if (outcome == "buffer-node") return "scenario-c";
  if (outcome == "passthrough-k8s-n+1" || outcome == "vgpu-san-recommended") return "scenario-a";
  if (outcome == "re-evaluate-workload") return "no-ha";
  return "";  // stateful-dedicated-san: a job, not streams
}

ExpectedLoss EstimateLoss(const PlanInput& in, const std::string& outcome) {
  ExpectedLoss loss;
  std::string name = StrategyForOutcome(outcome);
  if (name.empty()) {
    loss.skipped = "stateful work is not a stream: gpuha sim does not model it";
    return loss;
  }
  sim::SimInput s;
  const PlanInput::Cluster& c = in.cluster;
  s.fleet.gpus_per_node = c.gpus_per_node;
  s.fleet.streams_per_gpu = c.streams_per_gpu;
  s.fleet.redundancy = c.redundancy;
  // A GPU buffer node is one more GPU node, held spare; a CPU one holds no GPU streams.
  bool gpu_buffer = c.buffer_node == BufferNode::kGpu;
  s.fleet.nodes = c.nodes + (gpu_buffer ? 1 : 0);
  s.fleet.passive_nodes = gpu_buffer ? 1 : 0;
  // The plan answers at once; a fleet this large is `gpuha sim`'s job.
  constexpr int64_t kMaxGpus = 4096;
  if (s.fleet.nodes * s.fleet.gpus_per_node > kMaxGpus) {
    loss.skipped =
        absl::StrCat("more than ", kMaxGpus, " GPUs: run gpuha sim on this fleet (examples/sim/)");
    return loss;
  }
  if (std::optional<sim::FleetProblem> p = sim::CheckFleet(s.fleet)) {
    loss.skipped =
        absl::StrCat("the cluster cannot be simulated: fleet.", p->field, ": ", p->message);
    return loss;
  }
  s.failures = sim::PublishedFailureRates();
  s.daily_load = sim::DefaultDailyLoad();
  s.runs = 10;
  s.strategies.push_back(*sim::FindBuiltinStrategy(name));
  sim::SimResult r = sim::Simulate(s);
  const sim::StrategyResult& sr = r.strategies.front();
  loss.strategy = name;
  loss.stream_hours_lost_per_year = sr.stream_hours_lost_per_year.mean;
  loss.lo = sr.stream_hours_lost_per_year.lo;
  loss.hi = sr.stream_hours_lost_per_year.hi;
  loss.availability = sr.availability.mean;
  loss.overflow_events_per_year = sr.overflow_events.mean / s.horizon_years;
  loss.runs = s.runs;
  return loss;
}

Plan MakePlan(const PlanInput& in) {
  Plan p;
  p.input = in;
  p.outcome = WalkDecisionFlow(in, &p.path);
  const Leaf& leaf = FindLeaf(p.outcome);
  p.summary = leaf.summary;
  p.design = leaf.design;
  DecideSanAndHba(in, &p.design, &p.path);
  p.capacity = ComputeCapacity(in.cluster);
  p.facilities = ComputeFacilities(in);
  AddWarnings(p);
  AddMatrix(p);
  p.expected_loss = EstimateLoss(in, p.outcome);
  return p;
}

}  // namespace gpuha::plan
