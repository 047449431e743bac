// Rebinds a GPU's PCI function to a driver through sysfs, the step seed 002
// says PCI passthrough failover "requires manual rebinding" for: give the
// GPU to vfio-pci for a guest, or back to nvidia for this host, or unbind
// and bind it to the same driver as a remediation step.
//
//   RETURN_IF_ERROR(RebindPci("/sys/bus/pci", "0000:3b:00.0", "vfio-pci"));
//
// It writes, as an operator would:
//   devices/ADDR/driver_override  <- DRIVER   (this device takes only DRIVER)
//   devices/ADDR/driver/unbind    <- ADDR     (when some driver holds it)
//   drivers/DRIVER/bind           <- ADDR
// and then reads devices/ADDR/driver back (a link the kernel sets). The
// root is a parameter: tests use a fake tree and never touch the real one.
// Thread-safety: none needed (no state).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuha::gpu {

// sysfs's name for an NVML PCI bus id: "00000000:3B:00.0" gives
// "0000:3b:00.0"; "" when it is not one.
std::string SysfsPciAddress(const std::string& bus_id);

// The driver bound to `address` now ("" when none); NotFound for a device
// the tree does not have.
[[nodiscard]] absl::StatusOr<std::string> BoundDriver(const std::string& sysfs_pci,
                                                      const std::string& address);

// Binds `address` ("DDDD:BB:DD.F") to `driver`. InvalidArgument for a
// malformed address or driver name, NotFound for a device or driver the
// tree does not have, Internal for a write the kernel refused (its errno),
// FailedPrecondition when the device ends up bound to another driver.
[[nodiscard]] absl::Status RebindPci(const std::string& sysfs_pci, const std::string& address,
                                     const std::string& driver);

}  // namespace gpuha::gpu
