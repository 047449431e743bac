#include "gpu/gpu_models.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace gpuha::gpu {
namespace {

// Maximum board power and memory from each product's NVIDIA datasheet
// (nvidia.com/en-us/data-center/<model>/). Where a model ships in SXM and PCIe
// forms, the bare name is the SXM part and "-PCIE" the card.
constexpr std::array kModels = {
    GpuModel{"L4", 72, 24, "PCIe low-profile"}, GpuModel{"T4", 70, 16, "PCIe low-profile"},
    GpuModel{"A2", 60, 16, "PCIe low-profile"}, GpuModel{"A10", 150, 24, "PCIe"},
    GpuModel{"A16", 250, 64, "PCIe"},           GpuModel{"A30", 165, 24, "PCIe"},
    GpuModel{"A40", 300, 48, "PCIe"},           GpuModel{"L40", 300, 48, "PCIe"},
    GpuModel{"L40S", 350, 48, "PCIe"},          GpuModel{"A100", 400, 80, "SXM4"},
    GpuModel{"A100-PCIE", 300, 80, "PCIe"},     GpuModel{"H100", 700, 80, "SXM5"},
    GpuModel{"H100-PCIE", 350, 80, "PCIe"},     GpuModel{"H100-NVL", 400, 94, "PCIe"},
    GpuModel{"H200", 700, 141, "SXM5"},         GpuModel{"H200-NVL", 600, 141, "PCIe"},
};

}  // namespace

std::span<const GpuModel> KnownGpuModels() { return kModels; }

const GpuModel* FindGpuModel(absl::string_view name) {
  absl::string_view n = absl::StripAsciiWhitespace(name);
  if (absl::StartsWithIgnoreCase(n, "nvidia ")) n.remove_prefix(7);
  for (const GpuModel& m : kModels) {
    if (absl::EqualsIgnoreCase(m.name, n)) return &m;
  }
  return nullptr;
}

}  // namespace gpuha::gpu
