// Which NVIDIA GPUs the PCI bus still has, read from sysfs. A GPU that is
// hot-unplugged or removed after a failed reset leaves /sys/bus/pci/devices;
// one that fell off the bus usually keeps its entry, but its config space
// then reads all ones (vendor 0xffff). NVML may go on answering from its
// cache, or hang, meanwhile. A GPU bound to the nvidia driver that the
// driver does not list is capacity the node lost.
//
//   auto at_start = ScanNvidiaGpus("/sys/bus/pci/devices");  // once
//   ...
//   auto now = ScanNvidiaGpus("/sys/bus/pci/devices");       // each sample
//   PciCheck c = ComparePci(devices, *at_start, *now);
//
// A function counts when its `vendor` file says 0x10de and its `class` a
// display controller (0x03xxxx), and it is not an SR-IOV virtual function
// (no `physfn` link); the NVIDIA audio and USB functions of the same card do
// not. Only a GPU whose slot was on the bus at start can vanish (some VMs
// and sandboxes show no PCI tree for their GPUs); only a function bound to
// the nvidia driver can be "unseen" (one given to vfio-pci for a guest is
// not this host's). Pure functions over the tree given, so tests use a fake
// one.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu_probe.h"

namespace gpuha::gpu {

// NVIDIA GPU functions on the bus: PCI slot ("dddd:bb:dd", see PciSlot) ->
// whether the nvidia driver is bound to it.
using PciScan = std::map<std::string, bool>;
[[nodiscard]] absl::StatusOr<PciScan> ScanNvidiaGpus(const std::string& devices_dir);

struct PciCheck {
  std::vector<uint32_t> vanished;   // GPU indexes whose slot left the bus since start
  std::vector<std::string> unseen;  // slots bound to nvidia that no listed GPU has
};
PciCheck ComparePci(const std::vector<DeviceInfo>& devices, const PciScan& at_start,
                    const PciScan& now);

}  // namespace gpuha::gpu
