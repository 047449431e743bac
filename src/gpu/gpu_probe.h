// GpuProbe: what the agent reads from a node's GPUs. Two backends implement
// it: NVML loaded at run time (nvml_probe.h) and simulated GPUs driven by a
// fault script (sim_probe.h). The agent only sees this interface.
//
//   std::unique_ptr<GpuProbe> probe = ...;
//   auto devices = probe->Devices();          // once, at start
//   auto sample = probe->Sample(0);           // every sampling tick
//   auto xids = probe->WaitForXids(100ms);    // on the event thread
//
// Thread-safety: Sample() and Devices() are called from the sampling thread,
// WaitForXids() from the event thread, concurrently; implementations must
// allow that.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuha::gpu {

// A MIG instance of a GPU (issue 16): what NVML's MIG device handle says.
struct SliceInfo {
  uint32_t index = 0;  // its slot in nvmlDeviceGetMigDeviceHandleByIndex
  std::string uuid;    // "MIG-...": CUDA_VISIBLE_DEVICES names it so
  std::string name;    // "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
  uint64_t memory_total_bytes = 0;
};

struct DeviceInfo {
  uint32_t index = 0;
  std::string uuid;
  std::string name;
  std::string pci_bus_id;
  uint64_t memory_total_bytes = 0;
  std::optional<uint32_t> minor_number;  // /dev/nvidiaN: dcgm-exporter's `device` label
  std::string driver_version;            // the same on every GPU of a node
  std::vector<SliceInfo> slices;         // MIG instances, when MIG is on
};

// Bits of NVML's clocks_event_reasons (nvml.h, nvmlClocksThrottleReasons*);
// the sim backend uses the same bits so health rules read one format.
namespace throttle {
inline constexpr uint64_t kGpuIdle = 0x1;
inline constexpr uint64_t kSwPowerCap = 0x4;
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
// The reasons that mean the GPU is protecting itself, not merely idle or capped.
inline constexpr uint64_t kSevere = kHwSlowdown | kHwThermalSlowdown | kHwPowerBrakeSlowdown;
}  // namespace throttle

struct GpuSample {
  uint32_t index = 0;
  // A device that stopped answering (NVML_ERROR_GPU_IS_LOST, XID 79): a health
  // event. The other fields are then not meaningful.
  bool lost = false;
  std::string lost_detail;  // why, when known ("the nvml driver has not answered for ...")
  // Lost because the call missed the watchdog's deadline (watchdog.h), not
  // by the driver's word: one such reading may be this host's load (a new
  // agent's first call on a busy CPU), so the health rules wait for the
  // next sample to confirm it.
  bool stuck = false;
  double temperature_c = 0;
  double power_w = 0;
  double power_limit_w = 0;
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
  uint32_t utilization_pct = 0;
  uint64_t throttle_reasons = 0;
  uint64_t ecc_corrected = 0;  // volatile count since driver load
  uint64_t ecc_uncorrected = 0;
  uint32_t pages_pending = 0;  // retired or remapped pages waiting for a reset (for health)
  // Each source of pages_pending, where the GPU reports it: page retirement
  // (boards before Ampere) and row remapping (Ampere and later). A reading
  // the GPU does not support stays empty, never 0: an H200 answers Not
  // Supported for retired pages, and exporting 0 claimed a reading it has not.
  std::optional<bool> retired_pages_pending, row_remap_pending;
  // dcgm-exporter's other default counters. Empty where the device or the
  // driver does not report them (older drivers lack some entry points).
  std::optional<uint32_t> sm_clock_mhz, memory_clock_mhz;
  std::optional<uint64_t> energy_mj;  // since the driver loaded
  std::optional<uint32_t> pcie_replays;
  std::optional<uint32_t> memory_copy_util_pct, encoder_util_pct, decoder_util_pct;
  std::optional<uint32_t> remapped_rows_correctable, remapped_rows_uncorrectable;
  std::optional<uint64_t> retired_pages_sbe, retired_pages_dbe;  // boards before Ampere
  std::optional<bool> row_remap_failed;
  std::optional<double> memory_temperature_c;
  std::optional<double> pcie_tx_bytes_per_s, pcie_rx_bytes_per_s;
  std::optional<uint64_t> nvlink_kib_total;  // sent and received over all links
  // A vGPU seen from its guest: whether its software license is held (an
  // unlicensed vGPU runs degraded). Empty on bare metal and passthrough.
  std::optional<bool> vgpu_licensed;
  // MIG instances that Devices() listed and the GPU no longer has (their
  // slots): each is a slice lost, while the GPU and its other slices serve.
  std::vector<uint32_t> slices_lost;
  // A field the device did not support this time (e.g. ECC on a consumer GPU).
  std::vector<std::string> unsupported;
};

struct XidEvent {
  uint32_t gpu_index = 0;
  uint32_t xid = 0;
  int64_t unix_nanos = 0;
  // The GPU's recovery action (xid_catalog.h's Xid154Action): XID 154's,
  // as its kernel log line names it or as NVML's field
  // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION read at the event; for XIDs
  // 144-150, the field's, which decides when their line's registers are
  // not known. -1: unknown (a driver before R565, another XID). And the
  // driver's words for it ("GPU Reset Required", "Drain and Reset"), from
  // the line only.
  int recovery_value = -1;
  std::string recovery_action{};
  // Not an XID: NVML's recovery-action event, or the action read again
  // (after a Drain P2P). Judged as an XID 154 naming the action; never
  // counted or reported as an XID occurrence.
  bool recovery_only = false;
  // XID 45: the XID whose cleanup it is, as the line says; 0: not said.
  uint32_t caused_by = 0;
  // XIDs 144-150: the line's IntrInfo and Error Status (xid_nvlink5.h),
  // and the driver's branch (580; 0 unknown), which says how to read them.
  std::optional<uint32_t> intr_info{}, error_status{};
  // XID 13: where on the GPU the exception was, as the line says ("(GPC 3,
  // TPC 1, SM 0)"): repeats in one place are the GPU's, elsewhere the
  // application's (NVIDIA's XID 13 workflow).
  std::optional<uint32_t> gpc{}, tpc{};
  // XID 74: the NVLink link and its error registers REG0-REG6, as the line
  // says ("NVLink: fatal error detected on link 6(0x10000, 0x0, ...)");
  // NVSentinel's rules read their bits.
  std::optional<uint32_t> link{};
  std::vector<uint32_t> nvlink_regs{};
  uint32_t driver_major = 0;
  // XID 45 alone: whether NVIDIA Fabric Manager runs on the node (the
  // agent looked), whose restart the catalog then asks for.
  bool fabric_manager = false;
  // XID 159 (CHECK_UVM): whether UVM or vGPU is in use (nvidia_uvm or
  // nvidia_vgpu_vfio loaded, as the agent looked); empty: not known.
  std::optional<bool> uvm{};
  // The process the kernel log names for it (an application's XID: the
  // one whose work faulted); 0 and empty when unknown (NVML's event).
  int64_t pid = 0;
  std::string process{};
  // Whose work the process was, as the agent found it (an application's
  // XID only): its own inference server's process tree, another process,
  // or not known (no process named).
  enum class Owner { kUnknown, kServer, kForeign };
  Owner owner = Owner::kUnknown;
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  // "nvml" or "sim".
  virtual std::string Backend() const = 0;
  virtual absl::StatusOr<std::vector<DeviceInfo>> Devices() = 0;
  // A failing device reports lost = true rather than an error; an error means
  // the probe itself cannot work (library gone, bad index).
  virtual absl::StatusOr<GpuSample> Sample(uint32_t index) = 0;
  // Blocks up to `timeout` for XID events and returns those seen (possibly
  // none); a recovery-action change comes as one with recovery_only.
  virtual absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds timeout) = 0;
  // The GPU's recovery action now (NVML's field; the values of XID 154's
  // line); nullopt where the backend or the driver cannot say.
  virtual std::optional<int> RecoveryAction(uint32_t /*index*/) { return std::nullopt; }
};

}  // namespace gpuha::gpu
