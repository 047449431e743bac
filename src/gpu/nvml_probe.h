// NvmlProbe: the GpuProbe backed by NVIDIA's NVML, loaded at run time with
// dlopen so gpuha builds and runs on machines without CUDA or a driver.
//
//   auto probe = NvmlProbe::Open("libnvidia-ml.so.1");
//   if (!probe.ok()) { /* clear message: no library, no GPU, old driver */ }
//
// Uses NVML's versioned entry points (nvmlInit_v2, nvmlDeviceGetCount_v2,
// nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, nvmlEventSetWait_v2).
// A device that answers NVML_ERROR_GPU_IS_LOST is reported as lost in its
// sample, never as a probe error. Thread-safety: NVML is thread-safe, and the
// probe's own state is fixed after Open().
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/gpu_probe.h"
#include "gpu/nvml_abi.h"

namespace gpuha::gpu {

class NvmlProbe : public GpuProbe {
 public:
  // Fails, naming the cause, when the library cannot be loaded, a required
  // symbol is missing, nvmlInit fails, or there is no GPU.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NvmlProbe>> Open(const std::string& lib_path);
  ~NvmlProbe() override;

  std::string Backend() const override { return "nvml"; }
  absl::StatusOr<std::vector<DeviceInfo>> Devices() override;
  absl::StatusOr<GpuSample> Sample(uint32_t index) override;
  absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds timeout) override;

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
  NvmlProbe(void* handle, std::string lib_path) : handle_(handle), lib_path_(std::move(lib_path)) {}
  std::string Error(const char* call, nvmlReturn_t rc) const;
  // The GPU's MIG instances when MIG is on (the driver has the entry
  // points and the GPU's current mode says enabled); empty otherwise.
  std::vector<SliceInfo> MigSlices(nvmlDevice_t dev) const;
  // The slots of the MIG instances Devices() listed for GPU `index` that
  // no longer hold the same instance (its UUID).
  std::vector<uint32_t> SlicesLost(uint32_t index, nvmlDevice_t dev);

  void* handle_;
  std::string lib_path_;
  Api api_;
  bool initialized_ = false;
  std::vector<nvmlDevice_t> devices_;
  nvmlEventSet_t events_ = nullptr;
  std::mutex mig_mu_;
  std::map<uint32_t, std::vector<SliceInfo>> mig_slices_;  // guarded by mig_mu_, from Devices()
};

}  // namespace gpuha::gpu
