// The planner: seed 002's decision flow, SAN/HBA sub-decision, N+k capacity
// arithmetic (§5), decision matrix (§6) and facilities sizing (§7), computed
// from a PlanInput. Pure functions of the input; safe from any thread.
//
//   Plan plan = MakePlan(input);
//   std::cout << plan.outcome;  // e.g. "passthrough-k8s-n+1"
#pragma once

#include <string>
#include <vector>

#include "plan/plan_input.h"

namespace gpuha::plan {

// One step of the decision flow. `answer` is "true"/"false" for yes/no
// questions and the chosen word for the others (san_type: "fc").
struct Decision {
  std::string question;
  std::string answer;
  bool is_bool = true;
};

struct Design {
  std::string allocation;      // pci-passthrough | vgpu | dedicated
  std::string san;             // none | required | recommended
  std::string hba;             // required | not-needed
  std::string orchestration;   // kubernetes | vmware-ha | traffic-routing | none
  std::string capacity_model;  // n+k | buffer-node | active-active | none
};

// N+k arithmetic, seed 002 §5. All figures are in streams.
struct Capacity {
  int64_t nodes = 0;
  int64_t gpus_per_node = 0;
  int64_t streams_per_gpu = 0;
  int64_t slices_per_gpu = 1;
  int64_t total_streams = 0;
  int64_t redundancy = 0;
  int64_t max_production_streams = 0;
  int64_t failover_reserve_streams = 0;
  int64_t target_streams = 0;
  int64_t headroom_streams = 0;
  bool survives_node_loss = false;
  // The fewest GPU nodes (buffer included) that carry the target under N+k.
  int64_t nodes_needed_for_target = 0;
  // GPU-level headroom: single GPUs (or slices) that may fail on top of the
  // N+k reserve with every target stream still placed (0 when short).
  int64_t gpu_failures_absorbed = 0;
  int64_t slice_failures_absorbed = 0;
};

struct FacilitiesSizing {
  double gpu_tdp_watts = 0;
  // Every node that draws power: the cluster's, and its buffer node (a GPU
  // one draws as a full node, a CPU one as a host), spare or not.
  int64_t powered_nodes = 0;
  double it_load_watts = 0;
  double ups_va = 0;
  double cooling_btu_per_hour = 0;
};

struct Warning {
  std::string code;
  std::string message;
};

struct MatrixRow {
  std::string requirement;
  std::string best_choice;
};

// The recommended design's expected yearly loss, from `gpuha sim`'s model on
// published failure rates (preset llama3) and this cluster.
struct ExpectedLoss {
  std::string strategy;  // the sim strategy modelling the design; empty: none
  std::string skipped;   // why there is no figure, when strategy is empty
  double stream_hours_lost_per_year = 0;
  double lo = 0, hi = 0;  // its 95% interval
  double availability = 0;
  double overflow_events_per_year = 0;
  int64_t runs = 0;
};

// The sim strategy that models a decision-flow outcome; empty when none does
// (stateful jobs are not streams).
std::string StrategyForOutcome(const std::string& outcome);
ExpectedLoss EstimateLoss(const PlanInput& in, const std::string& outcome);

struct Plan {
  PlanInput input;
  std::vector<Decision> path;
  std::string outcome;  // leaf id of the decision flow
  std::string summary;  // one line: what to build
  Design design;
  Capacity capacity;
  FacilitiesSizing facilities;
  std::vector<Warning> warnings;
  std::vector<MatrixRow> matrix;
  ExpectedLoss expected_loss;
};

// Every leaf id the decision flow can end at, in the order of seed 002.
const std::vector<std::string>& AllOutcomes();

Capacity ComputeCapacity(const PlanInput::Cluster& cluster);
FacilitiesSizing ComputeFacilities(const PlanInput& in);
Plan MakePlan(const PlanInput& in);

}  // namespace gpuha::plan
