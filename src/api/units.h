// Placement units as the operator API names them: a node ("gpu-2"), or one
// GPU's (or slice's) server on it ("gpu-2/gpu0", "gpu-2/gpu1/mig2").
#pragma once

#include <string>

namespace gpuha::api {

// The node a unit is on: the unit itself for a whole node.
inline std::string NodeOfUnit(const std::string& unit) { return unit.substr(0, unit.find('/')); }

}  // namespace gpuha::api
