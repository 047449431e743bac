// The GPU models the planner knows: board power (TDP) and memory, from
// NVIDIA's product datasheets. The facilities math sizes UPS and cooling from
// the TDP; a model not listed here needs `cluster.tdp_watts` in the input.
#pragma once

#include <span>

#include "absl/strings/string_view.h"

namespace gpuha::gpu {

struct GpuModel {
  absl::string_view name;  // as operators write it: "L4", "H100-PCIE"
  double tdp_watts;        // maximum board power
  double memory_gb;        // frame buffer
  absl::string_view form_factor;
};

// All known models, in table order.
std::span<const GpuModel> KnownGpuModels();

// Case-insensitive lookup; "nvidia l4" and "L4" both find L4. nullptr if unknown.
const GpuModel* FindGpuModel(absl::string_view name);

}  // namespace gpuha::gpu
