// WatchedProbe: every call into a GpuProbe runs under a deadline, so a driver
// that stops answering fails its GPU instead of stopping the agent. An NVML
// call can block in the kernel for good (nvidia-smi stuck in "D" state, a
// monitor whose metrics simply stop); behind it the agent would sample
// nothing and report the last healthy values for ever.
//
//   auto probe = WatchedProbe::Wrap(std::move(nvml), std::chrono::seconds(2));
//   auto samples = probe->SampleAll({0, 1, 2, 3});  // one deadline for all
//   // a call still running at 2 s: that GPU is lost, and the sample says why
//
// Each GPU has its own caller thread, and Devices() and WaitForXids() one
// each. SampleAll() starts every GPU's call before it waits, so a driver
// that hangs on all of them costs one deadline, not one per GPU. A call that
// misses its deadline is left to finish on its thread; until it does, every
// call for that GPU answers "lost" at once, so no threads pile up behind a
// stuck driver. Once the stuck call returns, the GPU is sampled again (and
// the health rules decide when it is trusted again). WaitForXids() may take
// its timeout plus the deadline; past that it is an error, so the agent's
// event thread (and its shutdown) is not held by a hung event wait either.
//
// Thread-safety: one caller at a time per GPU (the agent samples under one
// mutex): a second call while a first is still within its deadline answers
// "lost" as if the first were stuck. A thread stuck in the driver when the
// probe is destroyed is detached; it keeps the wrapped probe alive until it
// returns, but not what that probe borrowed (its Clock must outlive it; the
// agent's is the process's RealClock).
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
  // Samples the GPUs in parallel under one deadline; one result per index.
  std::vector<absl::StatusOr<GpuSample>> SampleAll(const std::vector<uint32_t>& indexes);
  // On the GPU's caller, under the deadline: nullopt when it misses it.
  std::optional<int> RecoveryAction(uint32_t index) override;

  // Calls that missed their deadline so far (a counter for /metrics).
  uint64_t hung_calls() const { return hung_calls_.load(); }

  class Caller;  // one thread that runs one call at a time (watchdog.cc)

 private:
  WatchedProbe(std::shared_ptr<GpuProbe> inner, common::Duration deadline);
  Caller* CallerFor(uint32_t index);

  const std::shared_ptr<GpuProbe> inner_;
  const common::Duration deadline_;
  const std::string backend_;
  std::unique_ptr<Caller> devices_caller_;
  std::unique_ptr<Caller> events_caller_;
  std::atomic<uint64_t> hung_calls_{0};
  std::mutex mu_;
  std::vector<std::unique_ptr<Caller>> callers_;  // by GPU index; guarded by mu_
};

}  // namespace gpuha::gpu
