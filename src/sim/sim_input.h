// SimInput: what `gpuha sim` reads. A fleet, its failure processes, its daily
// load, and the HA strategies to compare on it (seed 002's scenarios A, B and
// C, running at 100% with no HA, and gpuha's hot standby).
//
//   absl::StatusOr<SimInput> in = LoadSimInputFile("examples/sim/fleet.yaml");
//   if (!in.ok()) { std::cerr << in.status().message(); return 2; }
//
// Parsing is strict, as for `gpuha plan`: unknown keys, wrong types, negative
// or missing rates and times, unknown strategies and fleets too small for
// their redundancy give one error naming the field and its line.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::sim {

// What one failure takes out.
enum class Scope {
  kGpu,      // one GPU
  kNode,     // one node, all its GPUs
  kRack,     // every node of one rack at once (correlated)
  kPlanned,  // one node, drained on purpose when N+k allows
};
const char* ScopeName(Scope s);

enum class Distribution { kExponential, kWeibull };

// One failure process, run independently for every GPU, node or rack (by
// scope): time to failure, then repair, then a new time to failure.
struct FailureClass {
  std::string name;  // "gpu_hbm"
  Scope scope = Scope::kGpu;
  Distribution distribution = Distribution::kExponential;
  double shape = 1;           // Weibull shape (1 = exponential)
  double mtbf_hours = 0;      // mean time to failure of one unit; planned: mean interval
  double repair_hours = 0;    // mean repair; planned: the maintenance window
  bool fixed_repair = false;  // repair takes exactly repair_hours (default: exponential)
  std::string source;         // where the default came from
};

struct Fleet {
  int64_t nodes = 0;  // GPU nodes, every role
  int64_t gpus_per_node = 1;
  int64_t streams_per_gpu = 1;
  int64_t redundancy = 1;     // the k of N+k
  int64_t passive_nodes = 0;  // spares; what they do is the strategy's
  int64_t nodes_per_rack = 16;
};

// What a fault costs a stream before it serves again elsewhere.
struct Gap {
  double detect_s = 0;   // fault to noticed
  double restart_s = 0;  // noticed to serving again (pod or VM start, model load)
  double hours() const { return (detect_s + restart_s) / 3600.0; }
};

// How a strategy uses the fleet's spare nodes.
enum class Spares {
  kActive,   // ordinary nodes; the N+k reserve is spread over all (Kubernetes)
  kPassive,  // hot standbys holding no streams (gpuha)
  kBuffer,   // a buffer that absorbs a failed node's load (scenario C)
};
const char* SparesName(Spares s);

// What a strategy's scheduler moves: one GPU's streams, or a whole node's.
enum class Unit { kGpu, kNode };
const char* UnitName(Unit u);

struct Strategy {
  std::string name;
  bool reserve = true;  // keep N+k; false runs every GPU at 100% (no-ha)
  Spares spares = Spares::kActive;
  Unit unit = Unit::kGpu;
  Gap node;                     // a node, rack or NIC fault
  Gap gpu;                      // a GPU fault
  double planned_outage_s = 0;  // a drained stream's gap
  std::string note;             // where the timings come from
};

// The built-in strategies, in the order of seed 002 then gpuha: no-ha,
// scenario-a, scenario-b, scenario-c, gpuha. Each cites its timings.
const std::vector<Strategy>& BuiltinStrategies();
// The built-in named `name`, or null.
const Strategy* FindBuiltinStrategy(const std::string& name);

// Failure rates from Meta's Llama 3 report (preset "llama3"), per GPU or
// per node, each citing its count. Repair times are assumptions, said so.
std::vector<FailureClass> PublishedFailureRates();

struct SimInput {
  Fleet fleet;
  std::vector<FailureClass> failures;
  std::array<double, 24> daily_load;  // demand per hour of day, share of admitted streams
  double horizon_years = 1;
  int64_t runs = 10;
  uint64_t seed = 1;
  std::vector<Strategy> strategies;
  std::vector<int64_t> sweep_nodes;  // fleet sizes for the chart; empty: derived

  double horizon_hours() const { return horizon_years * 8760; }
};

// The daily curve when the input gives none: a trough of 0.5 at night and a
// plateau of 1.0 through the working day.
std::array<double, 24> DefaultDailyLoad();

// What is wrong with a fleet's numbers together (each alone is range-checked
// by the parser): the field under `fleet.` and why.
struct FleetProblem {
  std::string field;
  std::string message;
};
std::optional<FleetProblem> CheckFleet(const Fleet& f);

[[nodiscard]] absl::StatusOr<SimInput> ParseSimInput(absl::string_view yaml, std::string source);
[[nodiscard]] absl::StatusOr<SimInput> LoadSimInputFile(const std::string& path);

}  // namespace gpuha::sim
