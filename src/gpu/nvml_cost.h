// What each NVML call cost on a real driver, and which of the agent's
// cadences makes it: the figures the fake NVML library (tests/fake_nvml)
// and the sim backend (gpu.sim.cost_model) spend, so that agent_bench and
// the tests see what sampling a driver costs.
//
// Measured on an NVIDIA H200, driver 580.159.04, through NVIDIA's Python
// binding (issue 38): most calls answer in 1-12 us; the energy counter
// takes 3 ms of CPU; nvmlDeviceGetPcieThroughput blocks 20.8 ms (a 20 ms
// sampling window); the PCIe replay counter, MIG mode and the vGPU license
// 0.13-0.15 ms each.
#pragma once

#include <time.h>

#include <chrono>
#include <string_view>
#include <thread>

namespace gpuha::gpu {

struct NvmlCallCost {
  std::string_view call;
  int cpu_us;   // CPU spent in the call
  int wall_us;  // its whole time; the rest it sleeps in the kernel
};

inline constexpr NvmlCallCost kNvmlCallCosts[] = {
    {"nvmlDeviceGetPcieThroughput", 30, 20800},
    {"nvmlDeviceGetTotalEnergyConsumption", 3000, 3000},
    {"nvmlDeviceGetPcieReplayCounter", 140, 140},
    {"nvmlDeviceGetMigMode", 130, 130},
    {"nvmlDeviceGetMaxMigDeviceCount", 130, 130},
    {"nvmlDeviceGetGridLicensableFeatures_v4", 150, 150},
    {"nvmlDeviceGetFieldValues", 12, 12},
};

// Any other call: 5 us, all of it CPU.
constexpr NvmlCallCost NvmlCallCostOf(std::string_view call) {
  for (const NvmlCallCost& c : kNvmlCallCosts) {
    if (c.call == call) return c;
  }
  return {call, 5, 5};
}

// The calls NvmlProbe::Sample makes on a driver with NVML's PCIe byte
// counters, without MIG: every sample, and every gpu.slow_sample_ms.
// nvml_probe_test checks them against NvmlProbe's own list.
struct NvmlPlannedCall {
  std::string_view call;
  int times;  // calls a reading: two ECC totals, two clocks
};
inline constexpr NvmlPlannedCall kNvmlEverySample[] = {
    {"nvmlDeviceGetTemperature", 1},        {"nvmlDeviceGetPowerUsage", 1},
    {"nvmlDeviceGetEnforcedPowerLimit", 1}, {"nvmlDeviceGetMemoryInfo", 1},
    {"nvmlDeviceGetUtilizationRates", 1},   {"nvmlDeviceGetCurrentClocksThrottleReasons", 1},
    {"nvmlDeviceGetTotalEccErrors", 2},     {"nvmlDeviceGetRetiredPagesPendingStatus", 1},
    {"nvmlDeviceGetRemappedRows", 1},       {"nvmlDeviceGetFieldValues", 1},
};
inline constexpr NvmlPlannedCall kNvmlSlowSample[] = {
    {"nvmlDeviceGetClockInfo", 2},          {"nvmlDeviceGetEncoderUtilization", 1},
    {"nvmlDeviceGetDecoderUtilization", 1}, {"nvmlDeviceGetTotalEnergyConsumption", 1},
    {"nvmlDeviceGetPcieReplayCounter", 1},  {"nvmlDeviceGetGridLicensableFeatures_v4", 1},
};

// Spends `cost` on the calling thread as the driver did, then sleeps the
// rest of its wall time. A cheap call spins on the monotonic clock alone
// (vDSO; reading the thread's CPU clock is a system call that costs as
// much as a 5 us call, and a 5 us spin is rarely preempted); a costly one
// goes on until the thread's CPU clock agrees, preempted or not.
inline void SpendNvmlCost(const NvmlCallCost& cost) {
  const auto start = std::chrono::steady_clock::now();
  auto spin = [](long us) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  auto thread_cpu_us = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
  };
  if (cost.cpu_us < 100) {
    spin(cost.cpu_us);
  } else {
    const long cpu0 = thread_cpu_us();
    for (long used = 0; used < cost.cpu_us; used = thread_cpu_us() - cpu0) spin(cost.cpu_us - used);
  }
  if (cost.wall_us > cost.cpu_us) {
    std::this_thread::sleep_until(start + std::chrono::microseconds(cost.wall_us));
  }
}

// The cost of a planned set of calls, summed.
template <size_t N>
constexpr NvmlCallCost NvmlPlanCost(const NvmlPlannedCall (&plan)[N]) {
  NvmlCallCost sum{"", 0, 0};
  for (const NvmlPlannedCall& p : plan) {
    const NvmlCallCost c = NvmlCallCostOf(p.call);
    sum.cpu_us += c.cpu_us * p.times;
    sum.wall_us += c.wall_us * p.times;
  }
  return sum;
}

}  // namespace gpuha::gpu
