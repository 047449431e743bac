// Which NVIDIA GPUs the PCI bus still has, read from sysfs. A GPU that fell
// off the bus, or was removed by a hot-unplug or a failed reset, leaves
// /sys/bus/pci/devices while NVML may go on answering from its cache or hang;
// a GPU the bus has but NVML never listed is capacity the node lost.
//
//   auto slots = ListNvidiaGpus("/sys/bus/pci/devices");  // {"0000:3b:00", ...}
//   PciCheck c = ComparePci(devices, *slots);  // vanished: indexes; unseen: slots
//
// A function is an NVIDIA GPU when its `vendor` file says 0x10de and its
// `class` file a display controller (0x03xxxx); the NVIDIA audio and USB
// functions of the same card are not. Pure functions over the tree given,
// so tests use a fake one.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu_probe.h"

namespace gpuha::gpu {

// PCI slots ("dddd:bb:dd", see PciSlot) of the NVIDIA GPUs under `devices_dir`.
[[nodiscard]] absl::StatusOr<std::set<std::string>> ListNvidiaGpus(const std::string& devices_dir);

struct PciCheck {
  std::vector<uint32_t> vanished;   // GPU indexes whose slot is gone from the bus
  std::vector<std::string> unseen;  // slots on the bus that no listed GPU has
};
PciCheck ComparePci(const std::vector<DeviceInfo>& devices, const std::set<std::string>& slots);

}  // namespace gpuha::gpu
