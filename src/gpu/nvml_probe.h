// NvmlProbe: the GpuProbe backed by NVIDIA's NVML, loaded at run time with
// dlopen so gpuha builds and runs on machines without CUDA or a driver.
//
//   auto probe = NvmlProbe::Open("libnvidia-ml.so.1");
//   if (!probe.ok()) { /* clear message: no library, no GPU, old driver */ }
//
// Uses NVML's versioned entry points (nvmlInit_v2, nvmlDeviceGetCount_v2,
// nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, nvmlEventSetWait_v2).
// A device that answers NVML_ERROR_GPU_IS_LOST is reported as lost in its
// sample, never as a probe error. Thread-safety: NVML is thread-safe; the
// probe's own state is fixed after Open() but for each GPU's cadence state
// (its own lock) and the MIG layout (mig_mu_).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gpu/gpu_probe.h"
#include "gpu/nvml_abi.h"

namespace gpuha::gpu {

// Readings differ in what they cost a driver (measured on an H200, driver
// 580, issue 38): most answer in 1-12 us, but the energy counter takes 3 ms
// of CPU, nvmlDeviceGetPcieThroughput blocks 20.8 ms (a 20 ms sampling
// window, per direction), and the PCIe replay counter, MIG layout and vGPU
// license 0.13-0.15 ms each. The health readings (temperature, power,
// memory, utilisation, throttling, ECC, pending pages, lost MIG instances)
// are read every sample; the slow ones every `slow_every` (30 s, as often
// as dcgm-exporter collects), their last values standing in between: the
// costly ones (energy, PCIe replays, the vGPU license) and the telemetry
// no health rule judges (SM and memory clocks, encoder and decoder use).
// PCIe throughput comes from NVML's cumulative byte counters (one field
// values call with the other fields), as the change over the interval;
// nvmlDeviceGetPcieThroughput only where a driver lacks the counters, and
// then on the slow cadence.
struct NvmlOptions {
  common::Duration slow_every = std::chrono::seconds(30);  // 0: every sample
};

class NvmlProbe : public GpuProbe {
 public:
  // Fails, naming the cause, when the library cannot be loaded, a required
  // symbol is missing, nvmlInit fails, or there is no GPU.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NvmlProbe>> Open(const std::string& lib_path,
                                                                       NvmlOptions options = {});
  ~NvmlProbe() override;

  std::string Backend() const override { return "nvml"; }
  absl::StatusOr<std::vector<DeviceInfo>> Devices() override;
  absl::StatusOr<GpuSample> Sample(uint32_t index) override;
  absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds timeout) override;
  // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
  std::optional<int> RecoveryAction(uint32_t index) override;

  // `gpuha doctor`: each NVML call the agent makes on GPU `index`, made
  // once and timed (wall and this thread's CPU), with NVML's answer.
  struct CallTiming {
    std::string call;
    double wall_ms = 0;
    double cpu_ms = 0;
    std::string result;  // "Success", "Not Supported", ... ; "absent" without the symbol
    bool slow = false;   // read on the slow cadence, not every sample
  };
  std::vector<CallTiming> TimeCalls(uint32_t index);
  // Whether GPU `index` delivers XID events (nvmlDeviceRegisterEvents took it).
  bool EventsRegistered(uint32_t index) const {
    return index < events_registered_.size() && events_registered_[index];
  }
  // Whether it delivers the recovery action's changes too.
  bool RecoveryEventsRegistered(uint32_t index) const {
    return index < recovery_events_registered_.size() && recovery_events_registered_[index];
  }

 private:
  struct Api {
#define GPUHA_NVML_POINTER(name, params) nvmlReturn_t(*name) params = nullptr;
    GPUHA_NVML_FUNCTIONS(GPUHA_NVML_POINTER)
    // Optional (null when absent). Ampere and later report row remapping
    // through nvmlDeviceGetRemappedRows instead of retired pages.
    GPUHA_NVML_OPTIONAL_FUNCTIONS(GPUHA_NVML_POINTER)
#undef GPUHA_NVML_POINTER
    const char* (*nvmlErrorString)(nvmlReturn_t) = nullptr;
  };
  NvmlProbe(void* handle, std::string lib_path, NvmlOptions options)
      : handle_(handle), lib_path_(std::move(lib_path)), options_(options) {}
  // The slow readings of one GPU, as last read, and when they are next due.
  struct Slow {
    std::chrono::steady_clock::time_point due{};
    std::optional<uint64_t> energy_mj;
    std::optional<uint32_t> sm_clock_mhz, memory_clock_mhz, encoder_util_pct, decoder_util_pct;
    std::optional<uint32_t> pcie_replays;
    std::optional<bool> vgpu_licensed;
    std::optional<double> pcie_tx_bytes_per_s, pcie_rx_bytes_per_s;  // without the counters
    std::vector<std::string> unsupported;
  };
  // The PCIe byte counters at the last sample, for the rate over the interval.
  struct PcieCount {
    std::chrono::steady_clock::time_point at{};
    double tx = -1, rx = -1;
  };
  // Reads the slow readings of `dev` into `slow`.
  void ReadSlow(nvmlDevice_t dev, bool pcie_counters, Slow* slow, bool* lost);
  std::string Error(const char* call, nvmlReturn_t rc) const;
  // The GPU's MIG instances when MIG is on (the driver has the entry
  // points and the GPU's current mode says enabled); empty otherwise.
  std::vector<SliceInfo> MigSlices(nvmlDevice_t dev) const;
  // The slots of the MIG instances Devices() listed for GPU `index` that
  // no longer hold the same instance (its UUID).
  std::vector<uint32_t> SlicesLost(uint32_t index, nvmlDevice_t dev);

  void* handle_;
  std::string lib_path_;
  const NvmlOptions options_;
  Api api_;
  // Each GPU's cadence state, under a lock of its own: a driver call hung
  // on one GPU holds only that GPU's (the watchdog answers its later calls).
  struct Cadence {
    std::mutex mu;
    Slow slow;       // guarded by mu
    PcieCount pcie;  // guarded by mu
  };
  std::vector<std::unique_ptr<Cadence>> cadence_;  // one per GPU, fixed after Open()
  bool initialized_ = false;
  std::vector<nvmlDevice_t> devices_;
  std::vector<bool> events_registered_;  // fixed after Open()
  // Whether the driver took the recovery-action event too (R565 and later).
  std::vector<bool> recovery_events_registered_;  // fixed after Open()
  nvmlEventSet_t events_ = nullptr;
  std::mutex mig_mu_;
  std::map<uint32_t, std::vector<SliceInfo>> mig_slices_;  // guarded by mig_mu_, from Devices()
};

}  // namespace gpuha::gpu
