#include "gpu/sim_probe.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gpu/nvml_cost.h"

namespace gpuha::gpu {
namespace {

// Typical air-cooled data-centre values: a GPU idles near 32 C and settles
// near 70 C at full load; idle board power is about a fifth of TDP (an L4
// idles at roughly 16 W of 72 W).
constexpr double kIdleTempC = 32;
constexpr double kFullLoadTempC = 70;
constexpr double kIdlePowerFraction = 0.22;
// NVIDIA GPUs start hardware thermal slowdown in the high 80s to low 90s C.
constexpr double kThermalSlowdownC = 90;

using std::chrono::milliseconds;

// A fault must name a GPU (and a MIG slot) the sim has; the error names the field.
absl::Status CheckFault(const SimOptions& o, const Fault& f) {
  if (f.kind == FaultKind::kAgentHang) return absl::OkStatus();
  if (f.gpu >= o.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu: GPU ", f.gpu, " does not exist (", o.count, " simulated)"));
  }
  if (f.kind == FaultKind::kMigLost && f.slice >= o.mig) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice: MIG instance ", f.slice, " does not exist (", o.mig, " per GPU)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string SimPciBusId(uint32_t index) {
  char bus[32];
  std::snprintf(bus, sizeof(bus), "00000000:%02X:00.0", 0x41 + index);
  return bus;
}

absl::StatusOr<std::unique_ptr<SimProbe>> SimProbe::Create(SimOptions options,
                                                           common::Clock* clock) {
  const GpuModel* model = FindGpuModel(options.model);
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown GPU model '", options.model, "' for the sim backend"));
  }
  if (options.count == 0 || options.count > 64) {
    return absl::InvalidArgumentError("sim GPU count must be between 1 and 64");
  }
  for (size_t i = 0; i < options.faults.size(); ++i) {
    if (absl::Status s = CheckFault(options, options.faults[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("faults[", i, "].", s.message()));
    }
  }
  return std::unique_ptr<SimProbe>(new SimProbe(std::move(options), model, clock));
}

SimProbe::SimProbe(SimOptions options, const GpuModel* model, common::Clock* clock)
    : options_(std::move(options)),
      model_(model),
      clock_(clock),
      start_(clock->Now()),
      load_(std::clamp(options_.load, 0.0, 1.0)),
      hang_until_(start_) {
  gpus_.resize(options_.count);
  for (uint32_t i = 0; i < options_.count; ++i) gpus_[i].noise.seed(options_.seed * 1000 + i);
  std::vector<Fault> sorted = options_.faults;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Fault& a, const Fault& b) { return a.at_ms < b.at_ms; });
  pending_.assign(sorted.begin(), sorted.end());
}

absl::StatusOr<std::vector<DeviceInfo>> SimProbe::Devices() {
  std::vector<DeviceInfo> out;
  for (uint32_t i = 0; i < options_.count; ++i) {
    char uuid[64];
    std::snprintf(uuid, sizeof(uuid), "GPU-5f1a0000-0000-4000-8000-%012llx",
                  static_cast<unsigned long long>(options_.seed * 1000 + i));
    DeviceInfo d{i,
                 uuid,
                 absl::StrCat("NVIDIA ", model_->name),
                 SimPciBusId(i),
                 static_cast<uint64_t>(model_->memory_gb * (1ull << 30)),
                 i,
                 "sim",
                 {}};
    for (uint32_t m = 0; m < options_.mig; ++m) {
      char mig_uuid[64];
      std::snprintf(mig_uuid, sizeof(mig_uuid), "MIG-5f1a0000-0000-4000-8000-%010llx%02u",
                    static_cast<unsigned long long>(options_.seed * 1000 + i), m);
      const uint64_t slice = d.memory_total_bytes / options_.mig;
      d.slices.push_back(
          SliceInfo{m, mig_uuid,
                    absl::StrCat("NVIDIA ", model_->name, " MIG 1g.", slice >> 30, "gb"), slice});
    }
    out.push_back(std::move(d));
  }
  return out;
}

void SimProbe::SetLoad(double load) {
  std::lock_guard<std::mutex> lock(mu_);
  load_ = std::clamp(load, 0.0, 1.0);
}

bool SimProbe::AgentHung() {
  std::lock_guard<std::mutex> lock(mu_);
  common::TimePoint now = clock_->Now();
  AdvanceLocked(now);
  return now < hang_until_;
}

absl::Status SimProbe::Inject(Fault fault) {
  if (absl::Status s = CheckFault(options_, fault); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  common::TimePoint now = clock_->Now();
  AdvanceLocked(now);
  ApplyLocked(fault, now);
  return absl::OkStatus();
}

double SimProbe::BaseTemperatureLocked() const {
  return kIdleTempC + (kFullLoadTempC - kIdleTempC) * load_;
}

double SimProbe::TemperatureLocked(GpuState& g, common::TimePoint now) {
  if (!g.ramping) return BaseTemperatureLocked();
  if (g.ramp_over.count() <= 0 || now >= g.ramp_start + g.ramp_over) return g.ramp_to;
  double frac = std::chrono::duration<double>(now - g.ramp_start) /
                std::chrono::duration<double>(g.ramp_over);
  return g.ramp_from + (g.ramp_to - g.ramp_from) * frac;
}

void SimProbe::AdvanceLocked(common::TimePoint now) {
  while (!pending_.empty() && start_ + milliseconds(pending_.front().at_ms) <= now) {
    Fault f = pending_.front();
    pending_.pop_front();
    ApplyLocked(f, start_ + milliseconds(f.at_ms));
  }
}

void SimProbe::ApplyLocked(const Fault& f, common::TimePoint at) {
  if (f.kind == FaultKind::kAgentHang) {
    hang_until_ = std::max(hang_until_, at + milliseconds(f.for_ms));
    return;
  }
  GpuState& g = gpus_[f.gpu];
  switch (f.kind) {
    case FaultKind::kTempRamp:
      g.ramp_from = TemperatureLocked(g, at);
      g.ramping = true;
      g.ramp_to = f.to_c;
      g.ramp_start = at;
      g.ramp_over = milliseconds(f.over_ms);
      break;
    case FaultKind::kXid:
      xids_.push_back(XidEvent{f.gpu, f.xid, clock_->UnixNanos()});
      xid_ready_.notify_all();
      // The state an XID leaves behind, per NVIDIA's XID catalog.
      if (f.xid == 79) g.lost = true;
      if (f.xid == 48 || f.xid == 94 || f.xid == 95 || f.xid == 140) g.ecc_uncorrected += 1;
      if (f.xid == 63 || f.xid == 64) g.pages_pending += 1;
      if (f.xid == 92) g.ecc_corrected += 1000;
      break;
    case FaultKind::kEccBurst:
      g.ecc_corrected += f.corrected;
      g.ecc_uncorrected += f.uncorrected;
      break;
    case FaultKind::kPowerExcursion:
      g.excursion_watts = f.watts;
      g.excursion_until = at + milliseconds(f.for_ms);
      break;
    case FaultKind::kLost:
      g.lost = true;
      break;
    case FaultKind::kDriverHang:
      g.hung = true;
      g.hang_until = f.for_ms > 0 ? std::optional(at + milliseconds(f.for_ms)) : std::nullopt;
      break;
    case FaultKind::kClear: {
      std::mt19937_64 noise = std::move(g.noise);
      g = GpuState{};
      g.noise = std::move(noise);
      unhung_.notify_all();
      break;
    }
    case FaultKind::kMigLost:
      g.slices_lost.insert(f.slice);
      break;
    case FaultKind::kAgentHang:
      break;
  }
}

absl::StatusOr<GpuSample> SimProbe::Sample(uint32_t index) {
  if (index >= options_.count) {
    return absl::OutOfRangeError(absl::StrCat("GPU index ", index, " out of range"));
  }
  if (options_.cost_model) SpendModelledCost(index);
  std::unique_lock<std::mutex> lock(mu_);
  common::TimePoint now = clock_->Now();
  AdvanceLocked(now);
  GpuState& g = gpus_[index];
  // A hung driver: block (without mu_) until the hang ends or is cleared.
  while (g.hung) {
    if (g.hang_until && now >= *g.hang_until) {
      g.hung = false;
      break;
    }
    unhung_.wait_for(lock, milliseconds(10));
    now = clock_->Now();
    AdvanceLocked(now);
  }
  GpuSample s;
  s.index = index;
  s.slices_lost.assign(g.slices_lost.begin(), g.slices_lost.end());
  if (g.lost) {
    s.lost = true;
    return s;
  }
  std::uniform_real_distribution<double> jitter(-1.0, 1.0);
  const double tdp = model_->tdp_watts;
  s.temperature_c = TemperatureLocked(g, now) + jitter(g.noise) * 0.5;
  double power = tdp * (kIdlePowerFraction + (1 - kIdlePowerFraction) * load_);
  if (now < g.excursion_until) power = g.excursion_watts;
  s.power_w = std::max(0.0, power * (1 + jitter(g.noise) * 0.02));
  s.power_limit_w = tdp;
  s.memory_total_bytes = static_cast<uint64_t>(model_->memory_gb * (1ull << 30));
  s.memory_used_bytes = static_cast<uint64_t>(s.memory_total_bytes * (0.1 + 0.6 * load_));
  s.utilization_pct = static_cast<uint32_t>(load_ * 100 + 0.5);
  if (load_ < 0.05) s.throttle_reasons |= throttle::kGpuIdle;
  if (s.power_w > tdp) s.throttle_reasons |= throttle::kSwPowerCap;
  if (s.temperature_c >= kThermalSlowdownC) s.throttle_reasons |= throttle::kHwThermalSlowdown;
  s.ecc_corrected = g.ecc_corrected;
  s.ecc_uncorrected = g.ecc_uncorrected;
  s.pages_pending = g.pages_pending;
  // dcgm-exporter's other readings, shaped like a datacenter GPU's: boost
  // clock under load, cut by a thermal slowdown; memory clock fixed; energy
  // the integral of the power drawn.
  const bool slowed = (s.throttle_reasons & throttle::kHwThermalSlowdown) != 0;
  s.sm_clock_mhz = static_cast<uint32_t>((load_ < 0.05 ? 210 : 1410) * (slowed ? 0.6 : 1.0));
  s.memory_clock_mhz = 1215;
  if (g.last_sample) {
    g.energy_mj += s.power_w * std::chrono::duration<double>(now - *g.last_sample).count() * 1000;
  }
  g.last_sample = now;
  s.energy_mj = static_cast<uint64_t>(g.energy_mj);
  s.pcie_replays = 0;
  s.memory_copy_util_pct = static_cast<uint32_t>(load_ * 40 + 0.5);
  s.encoder_util_pct = 0;
  s.decoder_util_pct = 0;
  s.remapped_rows_correctable = 0;
  s.remapped_rows_uncorrectable = g.pages_pending;
  s.row_remap_pending = g.pages_pending > 0;  // a simulated GPU remaps rows (Ampere and later)
  s.row_remap_failed = false;
  s.memory_temperature_c = s.temperature_c + 4;  // HBM and GDDR run a little hotter
  s.pcie_tx_bytes_per_s = load_ * 2.0e9;
  s.pcie_rx_bytes_per_s = load_ * 3.0e9;
  // A PCIe card (the sim's models): no NVLink, so no NVLink figure.
  return s;
}

void SimProbe::SpendModelledCost(uint32_t index) {
  static constexpr NvmlCallCost kEverySample = NvmlPlanCost(kNvmlEverySample);
  static constexpr NvmlCallCost kSlow = NvmlPlanCost(kNvmlSlowSample);
  bool slow = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    GpuState& g = gpus_[index];
    if (g.lost) return;  // a lost GPU's first call fails at once
    const common::TimePoint now = clock_->Now();
    if (now >= g.slow_due) {
      slow = true;
      g.slow_due = now + options_.slow_every;
    }
  }
  SpendNvmlCost(kEverySample);
  if (slow) SpendNvmlCost(kSlow);
}

absl::StatusOr<std::vector<XidEvent>> SimProbe::WaitForXids(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    AdvanceLocked(clock_->Now());
    if (!xids_.empty()) break;
    auto wake = deadline;
    if (!pending_.empty()) {
      // Sleep no longer than until the next scripted fault is due.
      auto due = start_ + milliseconds(pending_.front().at_ms) - clock_->Now();
      wake = std::min(wake, std::chrono::steady_clock::now() +
                                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::max(due, common::Duration(0))));
    }
    if (xid_ready_.wait_until(lock, wake) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      AdvanceLocked(clock_->Now());
      break;
    }
  }
  std::vector<XidEvent> out;
  out.swap(xids_);
  return out;
}

}  // namespace gpuha::gpu
