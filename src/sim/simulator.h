// The fleet simulator behind `gpuha sim`: a discrete-event simulation of GPU
// nodes failing and being repaired, with the controller's own Placement
// (src/placement/placement.h) deciding where each failed unit's streams go.
// What it predicts is what the controller would do.
//
//   absl::StatusOr<SimInput> in = LoadSimInputFile(path);
//   SimResult r = Simulate(*in, {.threads = 2});
//   for (const StrategyResult& s : r.strategies) std::cout << s.availability.mean;
//
// Streams are placed in bundles of one GPU's streams (streams_per_gpu), so a
// 10,000-node fleet of 8 GPUs is 80,000 placement streams, not 320,000; a
// bundle is never split. Streams are admitted at the start to what N+k
// allows (every GPU for a strategy without reserve); the daily load curve
// then says what share of them is sending at each hour, and so weighs every
// hour of loss.
//
// Every strategy of run r sees the same failures (each GPU, node and rack
// draws from its own random stream, seeded by seed, run and entity), so
// strategies are compared on identical histories. The same seed gives the
// same result, on any number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/sim_input.h"

namespace gpuha::sim {

// One strategy's figures from one simulated run.
struct RunFigures {
  double demand_stream_hours = 0;  // admitted streams weighed by the daily load
  double stream_hours_lost = 0;
  double failed_capacity_stream_hours = 0;  // capacity down (in streams), weighed alike
  double full_capacity_hours = 0;           // hours when every admitted stream had a place
  int64_t failures = 0;                     // unit outages that began (a rack is many)
  int64_t overflow_events = 0;              // outages that left streams with nowhere to go
  int64_t streams_moved = 0;                // streams placed on another unit by a failover
  int64_t maintenance_deferred = 0;         // windows postponed an hour: N+k had no room
  int64_t admitted_streams = 0;
  int64_t idle_gpus = 0;  // GPUs holding no streams at the start
  int64_t gpus = 0;
};

// Mean over runs with its 95% confidence interval (Student's t).
struct Figure {
  double mean = 0;
  double lo = 0;
  double hi = 0;
};

struct StrategyResult {
  Strategy strategy;
  Figure availability;  // stream-hours served / stream-hours demanded
  Figure stream_hours_lost;
  Figure stream_hours_lost_per_year;
  Figure demand_stream_hours;
  Figure capacity_availability;  // share of time every stream had a place
  Figure overflow_events;
  Figure failures;
  Figure streams_moved;
  Figure maintenance_deferred;
  int64_t admitted_streams = 0;
  int64_t idle_gpus = 0;
  int64_t gpus = 0;
};

struct SimResult {
  SimInput input;
  std::vector<StrategyResult> strategies;  // in the input's order
  double wall_seconds = 0;
};

struct SimOptions {
  int threads = 1;
  // Called after each (strategy, run) finishes, from a worker thread.
  std::function<void(int64_t done, int64_t total)> progress;
};

// One run of one strategy; `run` picks the failure history.
RunFigures SimulateRun(const SimInput& in, const Strategy& strategy, int64_t run);

// Every strategy, every run; figures aggregated per strategy.
SimResult Simulate(const SimInput& in, const SimOptions& options = {});

// The mean and 95% interval of `samples`.
Figure Summarize(const std::vector<double>& samples);

}  // namespace gpuha::sim
