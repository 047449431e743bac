// WatchedProbe: every call into a GpuProbe runs under a deadline, so a driver
// that stops answering fails its GPU instead of stopping the agent. An NVML
// call can block in the kernel for good (nvidia-smi stuck in "D" state, a
// monitor whose metrics simply stop); behind it the agent would sample
// nothing and report the last healthy values for ever.
//
//   auto probe = WatchedProbe::Wrap(std::move(nvml), std::chrono::seconds(2));
//   auto s = probe->Sample(0);  // a call still running at 2 s: lost, with why
//
// Each GPU has its own caller thread, and Devices() another. A call that
// misses its deadline is left to finish on its thread; until it does, every
// call for that GPU answers "lost" at once, so no threads pile up behind a
// stuck driver. Once the stuck call returns, the GPU is sampled again (and
// the health rules decide when it is trusted again).
// WaitForXids() passes straight through: it blocks by design, on its own
// thread.
//
// Thread-safety: as GpuProbe. A thread stuck in the driver when the probe is
// destroyed is detached; it keeps the wrapped probe alive until it returns.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "gpu/gpu_probe.h"

namespace gpuha::gpu {

class WatchedProbe : public GpuProbe {
 public:
  static std::unique_ptr<WatchedProbe> Wrap(std::unique_ptr<GpuProbe> inner,
                                            common::Duration deadline);
  ~WatchedProbe() override;

  std::string Backend() const override { return backend_; }
  absl::StatusOr<std::vector<DeviceInfo>> Devices() override;
  absl::StatusOr<GpuSample> Sample(uint32_t index) override;
  absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds timeout) override;

  // Calls that missed their deadline so far (a counter for /metrics).
  uint64_t hung_calls() const;

  class Caller;  // one thread that runs one call at a time (watchdog.cc)

 private:
  WatchedProbe(std::shared_ptr<GpuProbe> inner, common::Duration deadline);
  Caller* CallerFor(uint32_t index);

  const std::shared_ptr<GpuProbe> inner_;
  const common::Duration deadline_;
  const std::string backend_;
  std::unique_ptr<Caller> devices_caller_;
  std::atomic<uint64_t> hung_calls_{0};
  std::mutex mu_;
  std::vector<std::unique_ptr<Caller>> callers_;  // by GPU index; guarded by mu_
};

}  // namespace gpuha::gpu
