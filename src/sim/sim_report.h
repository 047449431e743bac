// Renders `gpuha sim` results: a text table, JSON for scripts, and an SVG
// chart of availability and idle GPUs against fleet size, one line per
// strategy (drawn by hand: no plotting library is a Debian build dependency).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/simulator.h"

namespace gpuha::sim {

std::string RenderText(const SimResult& r, const std::string& source);

// {"strategies": {NAME: {"availability": F, "availability_ci95": [LO, HI],
//   "stream_hours_lost": F, ..., "idle_gpus": N}}, "runs": N, ...}
nlohmann::json RenderJson(const SimResult& r);

// The fleet sizes a chart sweeps when the input names none: the input's size
// and its halvings down to 1/16, each above what N+k and the spares need.
std::vector<int64_t> SweepSizes(const SimInput& in);

// One result per fleet size, in ascending size.
std::string RenderSvg(const std::vector<SimResult>& sweep);

}  // namespace gpuha::sim
