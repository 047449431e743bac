// SimProbe: N simulated GPUs of one model with realistic idle and loaded
// values, driven by a fault script. Serves tests and the demo.
//
//   SimOptions o{.model = "L4", .count = 2, .faults = *ParseFaultScript(...)};
//   auto probe = SimProbe::Create(o, RealClock::Get());
//   (*probe)->Inject(Fault{.gpu = 0, .kind = FaultKind::kXid, .xid = 79});
//
// Time comes from the injected Clock; a fault at at_ms fires once the clock
// passes start + at_ms. Under a driver_hang fault Sample() blocks, as an NVML
// call stuck in the kernel does (the agent's WatchedProbe is what copes). Thread-safety: all
// methods are safe to call concurrently.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "common/clock.h"
#include "gpu/fault_script.h"
#include "gpu/gpu_models.h"
#include "gpu/gpu_probe.h"

namespace gpuha::gpu {

struct SimOptions {
  std::string model = "L4";
  uint32_t count = 1;
  // MIG instances per GPU (0: MIG off), as NVML lists them: equal slices
  // of the GPU's memory, named like A100's 1g profiles.
  uint32_t mig = 0;
  double load = 0.5;  // 0..1, drives utilization, power, temperature
  uint64_t seed = 1;  // noise is deterministic per seed
  std::vector<Fault> faults;
  // Each sample costs the CPU and time the NVML backend's calls cost on a
  // real driver (gpu/nvml_cost.h): its every-sample calls, and its slow
  // ones every `slow_every`.
  bool cost_model = false;
  common::Duration slow_every = std::chrono::seconds(30);
};

// The PCI bus id (NVML's form) of simulated GPU `index`: 00000000:41:00.0 on.
std::string SimPciBusId(uint32_t index);

class SimProbe : public GpuProbe {
 public:
  // Fails when the model is unknown or a fault names a GPU that does not exist.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SimProbe>> Create(SimOptions options,
                                                                        common::Clock* clock);

  std::string Backend() const override { return "sim"; }
  absl::StatusOr<std::vector<DeviceInfo>> Devices() override;
  absl::StatusOr<GpuSample> Sample(uint32_t index) override;
  absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds timeout) override;

  // Applies a fault now (at_ms is ignored). Fails for a GPU that does not exist.
  [[nodiscard]] absl::Status Inject(Fault fault);
  void SetLoad(double load);
  // True while an agent_hang fault is in force.
  bool AgentHung();

 private:
  struct GpuState {
    bool lost = false;
    std::set<uint32_t> slices_lost;  // MIG slots gone (mig_lost)
    uint64_t ecc_corrected = 0;
    uint64_t ecc_uncorrected = 0;
    uint32_t pages_pending = 0;
    // Temperature ramp: from `ramp_from` at `ramp_start` to `ramp_to` over `ramp_over`.
    bool ramping = false;
    double ramp_from = 0, ramp_to = 0;
    common::TimePoint ramp_start;
    common::Duration ramp_over{};
    double excursion_watts = 0;
    common::TimePoint excursion_until;
    // A driver_hang fault: Sample() blocks until hang_until (or a clear).
    bool hung = false;
    std::optional<common::TimePoint> hang_until;
    std::mt19937_64 noise;
    // Energy since "driver load", integrated from the power at each sample.
    double energy_mj = 0;
    std::optional<common::TimePoint> last_sample;
    common::TimePoint slow_due{};  // the cost model's next slow sample
  };
  SimProbe(SimOptions options, const GpuModel* model, common::Clock* clock);
  // Fires every fault due by now. Caller holds mu_.
  void AdvanceLocked(common::TimePoint now);
  void ApplyLocked(const Fault& f, common::TimePoint now);
  double BaseTemperatureLocked() const;
  double TemperatureLocked(GpuState& g, common::TimePoint now);
  // With options_.cost_model: spends what sampling GPU `index` costs on a
  // driver. Takes mu_ briefly; spends without it, as GPUs sample at once.
  void SpendModelledCost(uint32_t index);

  const SimOptions options_;
  const GpuModel* const model_;
  common::Clock* const clock_;
  const common::TimePoint start_;

  std::mutex mu_;
  std::condition_variable xid_ready_;
  std::condition_variable unhung_;  // a driver_hang ended
  double load_;                     // guarded by mu_
  std::vector<GpuState> gpus_;      // guarded by mu_
  std::deque<Fault> pending_;       // guarded by mu_, sorted by at_ms
  std::vector<XidEvent> xids_;      // guarded by mu_
  common::TimePoint hang_until_;    // guarded by mu_
};

}  // namespace gpuha::gpu
