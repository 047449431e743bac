#include "gpu/nvml_probe.h"

#include <dlfcn.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"

namespace gpuha::gpu {

namespace {

// A field value as a number, whatever type NVML gave it.
double FieldValue(const nvmlFieldValue_t& f) {
  switch (f.valueType) {
    case NVML_VALUE_TYPE_DOUBLE:
      return f.value.dVal;
    case NVML_VALUE_TYPE_UNSIGNED_INT:
      return f.value.uiVal;
    case NVML_VALUE_TYPE_UNSIGNED_LONG:
      return static_cast<double>(f.value.ulVal);
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG:
      return static_cast<double>(f.value.sllVal);
    case NVML_VALUE_TYPE_SIGNED_INT:
      return f.value.siVal;
    default:
      return static_cast<double>(f.value.ullVal);
  }
}

// Licensed when the feature the vGPU uses (the enabled one; any, if the
// driver marks none) holds its license, as the guest's nvidia-smi -q shows it.
bool VgpuLicensed(const nvmlGridLicensableFeatures_t& lic) {
  const unsigned int n = std::min(lic.licensableFeaturesCount, NVML_GRID_LICENSE_FEATURE_MAX_COUNT);
  bool any_enabled = false;
  for (unsigned int i = 0; i < n; ++i)
    any_enabled |= lic.gridLicensableFeatures[i].featureEnabled != 0;
  for (unsigned int i = 0; i < n; ++i) {
    const nvmlGridLicensableFeature_t& f = lic.gridLicensableFeatures[i];
    if ((f.featureEnabled != 0 || !any_enabled) && f.featureState != 0) return true;
  }
  return false;
}

// An optional reading's answer: success fills it, a lost GPU marks the
// sample lost, anything else leaves the reading out and notes it.
bool ReadingOk(const char* what, nvmlReturn_t rc, bool* lost,
               std::vector<std::string>* unsupported) {
  if (rc == NVML_SUCCESS) return true;
  if (rc == NVML_ERROR_GPU_IS_LOST) {
    *lost = true;
  } else {
    unsupported->push_back(what);
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlProbe>> NvmlProbe::Open(const std::string& lib_path,
                                                           NvmlOptions options) {
  void* handle = ::dlopen(lib_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(absl::StrCat("cannot load NVML (", lib_path,
                                                      "): ", why ? why : "unknown error",
                                                      ". Is the NVIDIA driver installed?"));
  }
  std::unique_ptr<NvmlProbe> probe(new NvmlProbe(handle, lib_path, options));
  Api& api = probe->api_;
  auto resolve = [&](const char* name, auto** slot) -> absl::Status {
    void* sym = ::dlsym(handle, name);
    if (sym == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          lib_path, " has no symbol ", name, "; the NVIDIA driver is too old for gpuha"));
    }
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(sym);
    return absl::OkStatus();
  };
#define GPUHA_NVML_RESOLVE(name, params) \
  if (absl::Status s = resolve(#name, &api.name); !s.ok()) return s;
  GPUHA_NVML_FUNCTIONS(GPUHA_NVML_RESOLVE)
#undef GPUHA_NVML_RESOLVE
  if (absl::Status s = resolve("nvmlErrorString", &api.nvmlErrorString); !s.ok()) return s;
#define GPUHA_NVML_OPTIONAL(name, params) \
  api.name = reinterpret_cast<decltype(api.name)>(::dlsym(handle, #name));
  GPUHA_NVML_OPTIONAL_FUNCTIONS(GPUHA_NVML_OPTIONAL)
#undef GPUHA_NVML_OPTIONAL

  if (nvmlReturn_t rc = api.nvmlInit_v2(); rc != NVML_SUCCESS) {
    return absl::FailedPreconditionError(probe->Error("nvmlInit_v2", rc));
  }
  probe->initialized_ = true;
  unsigned int count = 0;
  if (nvmlReturn_t rc = api.nvmlDeviceGetCount_v2(&count); rc != NVML_SUCCESS) {
    return absl::FailedPreconditionError(probe->Error("nvmlDeviceGetCount_v2", rc));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVML (", lib_path, ") found no GPU on this node"));
  }
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = api.nvmlDeviceGetHandleByIndex_v2(i, &dev); rc != NVML_SUCCESS) {
      return absl::FailedPreconditionError(
          probe->Error(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", i, ")").c_str(), rc));
    }
    probe->devices_.push_back(dev);
    probe->cadence_.push_back(std::make_unique<Cadence>());
  }
  if (nvmlReturn_t rc = api.nvmlEventSetCreate(&probe->events_); rc != NVML_SUCCESS) {
    return absl::FailedPreconditionError(probe->Error("nvmlEventSetCreate", rc));
  }
  for (nvmlDevice_t dev : probe->devices_) {
    // XIDs and, where the driver has it (R565 and later), the recovery
    // action's changes; a driver that refuses the pair (an older one says
    // Not Supported) is asked for XIDs alone, as before.
    nvmlReturn_t rc = api.nvmlDeviceRegisterEvents(
        dev, nvmlEventTypeXidCriticalError | nvmlEventTypeGpuRecoveryAction, probe->events_);
    const bool recovery = rc == NVML_SUCCESS;
    if (rc != NVML_SUCCESS && rc != NVML_ERROR_GPU_IS_LOST) {
      rc = api.nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, probe->events_);
    }
    // Some boards (and vGPU guests) do not support XID events; sampling still works.
    if (rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_SUPPORTED && rc != NVML_ERROR_GPU_IS_LOST) {
      return absl::FailedPreconditionError(probe->Error("nvmlDeviceRegisterEvents", rc));
    }
    probe->events_registered_.push_back(rc == NVML_SUCCESS);
    probe->recovery_events_registered_.push_back(recovery);
  }
  return probe;
}

NvmlProbe::~NvmlProbe() {
  if (events_ != nullptr && api_.nvmlEventSetFree != nullptr) api_.nvmlEventSetFree(events_);
  if (initialized_) api_.nvmlShutdown();
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::string NvmlProbe::Error(const char* call, nvmlReturn_t rc) const {
  const char* text = api_.nvmlErrorString != nullptr ? api_.nvmlErrorString(rc) : nullptr;
  return absl::StrCat(call, " failed: ", text ? text : "unknown error", " (NVML error ", rc, ")");
}

std::vector<SliceInfo> NvmlProbe::MigSlices(nvmlDevice_t dev) const {
  std::vector<SliceInfo> out;
  unsigned int current = 0, pending = 0, max = 0;
  if (api_.nvmlDeviceGetMigMode == nullptr || api_.nvmlDeviceGetMaxMigDeviceCount == nullptr ||
      api_.nvmlDeviceGetMigDeviceHandleByIndex == nullptr ||
      api_.nvmlDeviceGetMigMode(dev, &current, &pending) != NVML_SUCCESS ||
      current != NVML_DEVICE_MIG_ENABLE ||
      api_.nvmlDeviceGetMaxMigDeviceCount(dev, &max) != NVML_SUCCESS) {
    return out;
  }
  for (unsigned int i = 0; i < max; ++i) {
    nvmlDevice_t mig = nullptr;
    // An empty slot answers NOT_FOUND: instances need not be contiguous.
    if (api_.nvmlDeviceGetMigDeviceHandleByIndex(dev, i, &mig) != NVML_SUCCESS) continue;
    SliceInfo s;
    s.index = i;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlMemory_t mem = {};
    if (api_.nvmlDeviceGetName(mig, name, sizeof(name)) == NVML_SUCCESS) s.name = name;
    if (api_.nvmlDeviceGetUUID(mig, uuid, sizeof(uuid)) == NVML_SUCCESS) s.uuid = uuid;
    if (api_.nvmlDeviceGetMemoryInfo(mig, &mem) == NVML_SUCCESS) s.memory_total_bytes = mem.total;
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<DeviceInfo>> NvmlProbe::Devices() {
  std::vector<DeviceInfo> out;
  std::string driver;
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (api_.nvmlSystemGetDriverVersion != nullptr &&
      api_.nvmlSystemGetDriverVersion(version, sizeof(version)) == NVML_SUCCESS) {
    driver.assign(version, strnlen(version, sizeof(version)));
  }
  for (uint32_t i = 0; i < devices_.size(); ++i) {
    nvmlDevice_t dev = devices_[i];
    DeviceInfo info;
    info.index = i;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlPciInfo_t pci = {};
    nvmlMemory_t mem = {};
    if (api_.nvmlDeviceGetName(dev, name, sizeof(name)) == NVML_SUCCESS) info.name = name;
    if (api_.nvmlDeviceGetUUID(dev, uuid, sizeof(uuid)) == NVML_SUCCESS) info.uuid = uuid;
    if (api_.nvmlDeviceGetPciInfo_v3(dev, &pci) == NVML_SUCCESS) {
      info.pci_bus_id.assign(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
    }
    if (api_.nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS)
      info.memory_total_bytes = mem.total;
    unsigned int minor = 0;
    if (api_.nvmlDeviceGetMinorNumber != nullptr &&
        api_.nvmlDeviceGetMinorNumber(dev, &minor) == NVML_SUCCESS) {
      info.minor_number = minor;
    }
    info.driver_version = driver;
    info.slices = MigSlices(dev);
    {
      std::lock_guard<std::mutex> lock(mig_mu_);
      mig_slices_[i] = info.slices;
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<GpuSample> NvmlProbe::Sample(uint32_t index) {
  if (index >= devices_.size()) {
    return absl::OutOfRangeError(absl::StrCat("GPU index ", index, " out of range"));
  }
  nvmlDevice_t dev = devices_[index];
  GpuSample s;
  s.index = index;
  absl::Status failure;
  // Each reading: success fills it, GPU_IS_LOST marks the device lost,
  // NOT_SUPPORTED is noted, anything else is an error of the probe.
  auto check = [&](const char* what, nvmlReturn_t rc) {
    if (rc == NVML_SUCCESS) return true;
    if (rc == NVML_ERROR_GPU_IS_LOST) {
      s.lost = true;
    } else if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_NO_PERMISSION) {
      s.unsupported.push_back(what);
    } else if (failure.ok()) {
      failure = absl::UnavailableError(Error(what, rc));
    }
    return false;
  };
  unsigned int temp = 0, power = 0, limit = 0;
  if (check("nvmlDeviceGetTemperature",
            api_.nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &temp))) {
    s.temperature_c = temp;
  }
  if (s.lost) return s;
  if (check("nvmlDeviceGetPowerUsage", api_.nvmlDeviceGetPowerUsage(dev, &power))) {
    s.power_w = power / 1000.0;  // NVML reports milliwatts
  }
  if (check("nvmlDeviceGetEnforcedPowerLimit", api_.nvmlDeviceGetEnforcedPowerLimit(dev, &limit))) {
    s.power_limit_w = limit / 1000.0;
  }
  nvmlMemory_t mem = {};
  if (check("nvmlDeviceGetMemoryInfo", api_.nvmlDeviceGetMemoryInfo(dev, &mem))) {
    s.memory_used_bytes = mem.used;
    s.memory_total_bytes = mem.total;
  }
  nvmlUtilization_t util = {};
  if (check("nvmlDeviceGetUtilizationRates", api_.nvmlDeviceGetUtilizationRates(dev, &util))) {
    s.utilization_pct = util.gpu;
    s.memory_copy_util_pct = util.memory;
  }
  unsigned long long reasons = 0;
  if (check("nvmlDeviceGetCurrentClocksThrottleReasons",
            api_.nvmlDeviceGetCurrentClocksThrottleReasons(dev, &reasons))) {
    s.throttle_reasons = reasons;
  }
  unsigned long long ecc = 0;
  if (check("nvmlDeviceGetTotalEccErrors(corrected)",
            api_.nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                             NVML_VOLATILE_ECC, &ecc))) {
    s.ecc_corrected = ecc;
  }
  if (check("nvmlDeviceGetTotalEccErrors(uncorrected)",
            api_.nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             NVML_VOLATILE_ECC, &ecc))) {
    s.ecc_uncorrected = ecc;
  }
  int pending = NVML_FEATURE_DISABLED;
  if (check("nvmlDeviceGetRetiredPagesPendingStatus",
            api_.nvmlDeviceGetRetiredPagesPendingStatus(dev, &pending))) {
    s.pages_pending = pending == NVML_FEATURE_ENABLED ? 1 : 0;
    s.retired_pages_pending = pending == NVML_FEATURE_ENABLED;
  }
  if (api_.nvmlDeviceGetRemappedRows != nullptr) {
    unsigned int corr = 0, unc = 0, is_pending = 0, failed = 0;
    if (check("nvmlDeviceGetRemappedRows",
              api_.nvmlDeviceGetRemappedRows(dev, &corr, &unc, &is_pending, &failed))) {
      s.pages_pending += is_pending != 0 || failed != 0 ? 1 : 0;
      s.row_remap_pending = is_pending != 0;
      s.remapped_rows_correctable = corr;
      s.remapped_rows_uncorrectable = unc;
      s.row_remap_failed = failed != 0;
    }
  }
  // dcgm-exporter's other readings, from entry points a driver may lack (a
  // null pointer: the reading stays empty). Any failure of theirs but a
  // lost GPU only leaves that reading out: the required ones above still
  // make the sample.
  auto reading = [&](const char* what, nvmlReturn_t rc) {
    return ReadingOk(what, rc, &s.lost, &s.unsupported);
  };
  bool pcie_counters = false;
  if (api_.nvmlDeviceGetFieldValues != nullptr) {
    // One call for the fields; each answer carries its own return code.
    nvmlFieldValue_t f[7] = {};
    f[0].fieldId = NVML_FI_DEV_MEMORY_TEMP;
    f[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
    f[1].scopeId = NVML_SCOPE_ALL_LINKS;
    f[2].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
    f[2].scopeId = NVML_SCOPE_ALL_LINKS;
    f[3].fieldId = NVML_FI_DEV_RETIRED_SBE;
    f[4].fieldId = NVML_FI_DEV_RETIRED_DBE;
    f[5].fieldId = NVML_FI_DEV_PCIE_COUNT_TX_BYTES;
    f[6].fieldId = NVML_FI_DEV_PCIE_COUNT_RX_BYTES;
    if (reading("nvmlDeviceGetFieldValues", api_.nvmlDeviceGetFieldValues(dev, 7, f))) {
      // Page retirement is for boards before Ampere (later ones remap rows).
      if (f[3].nvmlReturn == NVML_SUCCESS && f[4].nvmlReturn == NVML_SUCCESS) {
        s.retired_pages_sbe = static_cast<uint64_t>(FieldValue(f[3]));
        s.retired_pages_dbe = static_cast<uint64_t>(FieldValue(f[4]));
      } else {
        s.unsupported.push_back("NVML_FI_DEV_RETIRED_SBE/DBE");
      }
      if (f[0].nvmlReturn == NVML_SUCCESS) {
        s.memory_temperature_c = FieldValue(f[0]);
      } else {
        s.unsupported.push_back("NVML_FI_DEV_MEMORY_TEMP");
      }
      const double kib = f[1].nvmlReturn == NVML_SUCCESS && f[2].nvmlReturn == NVML_SUCCESS
                             ? FieldValue(f[1]) + FieldValue(f[2])
                             : -1;
      if (kib >= 0 && kib < 1.8e19) {  // in range of uint64_t, whatever types NVML gave
        s.nvlink_kib_total = static_cast<uint64_t>(kib);
      } else {
        s.unsupported.push_back("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA");  // no NVLink (PCIe boards)
      }
      if (f[5].nvmlReturn == NVML_SUCCESS && f[6].nvmlReturn == NVML_SUCCESS) {
        pcie_counters = true;
        const auto now = std::chrono::steady_clock::now();
        const double tx = FieldValue(f[5]), rx = FieldValue(f[6]);
        Cadence& c = *cadence_[index];
        std::lock_guard<std::mutex> lock(c.mu);
        PcieCount& last = c.pcie;
        const double secs = std::chrono::duration<double>(now - last.at).count();
        // The rate over the interval; none at the first sample, or across a
        // counter that went back (wrapped, or the GPU was reset).
        if (last.tx >= 0 && tx >= last.tx && rx >= last.rx && secs > 0) {
          s.pcie_tx_bytes_per_s = (tx - last.tx) / secs;
          s.pcie_rx_bytes_per_s = (rx - last.rx) / secs;
        }
        last = {now, tx, rx};
      }
    }
  }
  if (s.lost) return s;
  // The slow readings: read when due, else their last values.
  {
    Cadence& c = *cadence_[index];
    std::lock_guard<std::mutex> lock(c.mu);
    Slow& slow = c.slow;
    const auto now = std::chrono::steady_clock::now();
    if (now >= slow.due) {
      slow = Slow{};
      slow.due = now + options_.slow_every;
      ReadSlow(dev, pcie_counters, &slow, &s.lost);
    }
    s.energy_mj = slow.energy_mj;
    s.sm_clock_mhz = slow.sm_clock_mhz;
    s.memory_clock_mhz = slow.memory_clock_mhz;
    s.encoder_util_pct = slow.encoder_util_pct;
    s.decoder_util_pct = slow.decoder_util_pct;
    s.pcie_replays = slow.pcie_replays;
    s.vgpu_licensed = slow.vgpu_licensed;
    if (!pcie_counters) {
      s.pcie_tx_bytes_per_s = slow.pcie_tx_bytes_per_s;
      s.pcie_rx_bytes_per_s = slow.pcie_rx_bytes_per_s;
    }
    s.unsupported.insert(s.unsupported.end(), slow.unsupported.begin(), slow.unsupported.end());
    if (s.lost) slow.due = {};  // read again next time
  }
  if (s.lost) return s;
  if (!failure.ok()) return failure;
  s.slices_lost = SlicesLost(index, dev);  // a handle and a UUID per instance: cheap
  return s;
}

void NvmlProbe::ReadSlow(nvmlDevice_t dev, bool pcie_counters, Slow* slow, bool* lost) {
  auto reading = [&](const char* what, nvmlReturn_t rc) {
    return ReadingOk(what, rc, lost, &slow->unsupported);
  };
  unsigned long long mj = 0;
  unsigned int count = 0;
  // Telemetry that no health rule judges (clocks, video engines): exported,
  // and read as often as dcgm-exporter collects it.
  unsigned int mhz = 0, pct = 0, period_us = 0;
  if (api_.nvmlDeviceGetClockInfo != nullptr) {
    if (reading("nvmlDeviceGetClockInfo(SM)",
                api_.nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &mhz))) {
      slow->sm_clock_mhz = mhz;
    }
    if (reading("nvmlDeviceGetClockInfo(MEM)",
                api_.nvmlDeviceGetClockInfo(dev, NVML_CLOCK_MEM, &mhz))) {
      slow->memory_clock_mhz = mhz;
    }
  }
  if (api_.nvmlDeviceGetEncoderUtilization != nullptr &&
      reading("nvmlDeviceGetEncoderUtilization",
              api_.nvmlDeviceGetEncoderUtilization(dev, &pct, &period_us))) {
    slow->encoder_util_pct = pct;
  }
  if (api_.nvmlDeviceGetDecoderUtilization != nullptr &&
      reading("nvmlDeviceGetDecoderUtilization",
              api_.nvmlDeviceGetDecoderUtilization(dev, &pct, &period_us))) {
    slow->decoder_util_pct = pct;
  }
  if (api_.nvmlDeviceGetTotalEnergyConsumption != nullptr &&
      reading("nvmlDeviceGetTotalEnergyConsumption",
              api_.nvmlDeviceGetTotalEnergyConsumption(dev, &mj))) {
    slow->energy_mj = mj;
  }
  if (api_.nvmlDeviceGetPcieReplayCounter != nullptr &&
      reading("nvmlDeviceGetPcieReplayCounter", api_.nvmlDeviceGetPcieReplayCounter(dev, &count))) {
    slow->pcie_replays = count;
  }
  if (!pcie_counters && api_.nvmlDeviceGetPcieThroughput != nullptr) {
    unsigned int kbps = 0;
    if (reading("nvmlDeviceGetPcieThroughput(TX)",
                api_.nvmlDeviceGetPcieThroughput(dev, NVML_PCIE_UTIL_TX_BYTES, &kbps))) {
      slow->pcie_tx_bytes_per_s = kbps * 1024.0;
    }
    if (reading("nvmlDeviceGetPcieThroughput(RX)",
                api_.nvmlDeviceGetPcieThroughput(dev, NVML_PCIE_UTIL_RX_BYTES, &kbps))) {
      slow->pcie_rx_bytes_per_s = kbps * 1024.0;
    }
  }
  if (api_.nvmlDeviceGetGridLicensableFeatures_v4 != nullptr) {
    nvmlGridLicensableFeatures_t lic = {};
    if (reading("nvmlDeviceGetGridLicensableFeatures_v4",
                api_.nvmlDeviceGetGridLicensableFeatures_v4(dev, &lic)) &&
        lic.isGridLicenseSupported != 0) {
      slow->vgpu_licensed = VgpuLicensed(lic);
    }
  }
}

std::vector<uint32_t> NvmlProbe::SlicesLost(uint32_t index, nvmlDevice_t dev) {
  std::vector<SliceInfo> known;
  {
    std::lock_guard<std::mutex> lock(mig_mu_);
    auto it = mig_slices_.find(index);
    if (it == mig_slices_.end() || it->second.empty()) return {};
    known = it->second;
  }
  std::vector<uint32_t> lost;
  for (const SliceInfo& k : known) {
    nvmlDevice_t mig = nullptr;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    // A slot that is empty now, or holds another instance (destroyed and
    // created again), lost the one its server ran on.
    if (api_.nvmlDeviceGetMigDeviceHandleByIndex(dev, k.index, &mig) != NVML_SUCCESS ||
        api_.nvmlDeviceGetUUID(mig, uuid, sizeof(uuid)) != NVML_SUCCESS ||
        k.uuid != std::string(uuid, strnlen(uuid, sizeof(uuid)))) {
      lost.push_back(k.index);
    }
  }
  return lost;
}

absl::StatusOr<std::vector<XidEvent>> NvmlProbe::WaitForXids(std::chrono::milliseconds timeout) {
  std::vector<XidEvent> out;
  unsigned int wait_ms = static_cast<unsigned int>(std::max<int64_t>(0, timeout.count()));
  while (true) {
    nvmlEventData_t data = {};
    nvmlReturn_t rc = api_.nvmlEventSetWait_v2(events_, &data, wait_ms);
    if (rc == NVML_ERROR_TIMEOUT) break;
    // A lost GPU shows up in its next sample; the event set itself still works.
    if (rc == NVML_ERROR_GPU_IS_LOST) break;
    if (rc != NVML_SUCCESS) return absl::UnavailableError(Error("nvmlEventSetWait_v2", rc));
    uint32_t index = 0;
    for (uint32_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == data.device) index = i;
    }
    const int64_t at = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    if ((data.eventType & nvmlEventTypeXidCriticalError) != 0) {
      XidEvent x{index, static_cast<uint32_t>(data.eventData), at};
      // XID 154 names a recovery action, and XIDs 144-150 need one, which
      // only the kernel log's line says: NVML says it too, as a field.
      if (x.xid == 154 || (x.xid >= 144 && x.xid <= 150)) {
        x.recovery_value = RecoveryAction(index).value_or(-1);
      }
      out.push_back(std::move(x));
    }
    if ((data.eventType & nvmlEventTypeGpuRecoveryAction) != 0) {
      // The action changed: read as an XID 154 would say it, not an XID.
      if (std::optional<int> value = RecoveryAction(index)) {
        XidEvent x{index, 154, at};
        x.recovery_value = *value;
        x.recovery_only = true;
        out.push_back(std::move(x));
      }
    }
    wait_ms = 0;  // drain whatever else is queued, without waiting again
  }
  return out;
}

std::optional<int> NvmlProbe::RecoveryAction(uint32_t index) {
  if (index >= devices_.size() || api_.nvmlDeviceGetFieldValues == nullptr) return std::nullopt;
  nvmlFieldValue_t f = {};
  f.fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
  if (api_.nvmlDeviceGetFieldValues(devices_[index], 1, &f) != NVML_SUCCESS ||
      f.nvmlReturn != NVML_SUCCESS) {
    return std::nullopt;  // a driver before R565, or a lost GPU
  }
  const double v = FieldValue(f);
  if (v < 0 || v > 1e6) return std::nullopt;
  return static_cast<int>(v);
}

std::vector<NvmlProbe::CallTiming> NvmlProbe::TimeCalls(uint32_t index) {
  std::vector<CallTiming> out;
  if (index >= devices_.size()) return out;
  nvmlDevice_t dev = devices_[index];
  auto cpu_now = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
  };
  auto timed = [&](const char* call, bool slow, bool present,
                   const std::function<nvmlReturn_t()>& f) {
    CallTiming t{call, 0, 0, "absent", slow};
    if (present) {
      const double cpu0 = cpu_now();
      const auto wall0 = std::chrono::steady_clock::now();
      const nvmlReturn_t rc = f();
      t.wall_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0)
              .count();
      t.cpu_ms = cpu_now() - cpu0;
      const char* text = api_.nvmlErrorString != nullptr ? api_.nvmlErrorString(rc) : nullptr;
      t.result = text != nullptr ? text : absl::StrCat("NVML error ", rc);
    }
    out.push_back(std::move(t));
  };
  unsigned int u = 0, v = 0, w = 0, x = 0;
  unsigned long long ull = 0;
  int i = 0;
  nvmlMemory_t mem = {};
  nvmlUtilization_t util = {};
  const Api& a = api_;
  timed("nvmlDeviceGetTemperature", false, true,
        [&] { return a.nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &u); });
  timed("nvmlDeviceGetPowerUsage", false, true, [&] { return a.nvmlDeviceGetPowerUsage(dev, &u); });
  timed("nvmlDeviceGetEnforcedPowerLimit", false, true,
        [&] { return a.nvmlDeviceGetEnforcedPowerLimit(dev, &u); });
  timed("nvmlDeviceGetMemoryInfo", false, true,
        [&] { return a.nvmlDeviceGetMemoryInfo(dev, &mem); });
  timed("nvmlDeviceGetUtilizationRates", false, true,
        [&] { return a.nvmlDeviceGetUtilizationRates(dev, &util); });
  timed("nvmlDeviceGetCurrentClocksThrottleReasons", false, true,
        [&] { return a.nvmlDeviceGetCurrentClocksThrottleReasons(dev, &ull); });
  timed("nvmlDeviceGetTotalEccErrors", false, true, [&] {
    return a.nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                                         &ull);
  });
  timed("nvmlDeviceGetRetiredPagesPendingStatus", false, true,
        [&] { return a.nvmlDeviceGetRetiredPagesPendingStatus(dev, &i); });
  timed("nvmlDeviceGetRemappedRows", false, a.nvmlDeviceGetRemappedRows != nullptr,
        [&] { return a.nvmlDeviceGetRemappedRows(dev, &u, &v, &w, &x); });
  timed("nvmlDeviceGetClockInfo", true, a.nvmlDeviceGetClockInfo != nullptr,
        [&] { return a.nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &u); });
  timed("nvmlDeviceGetEncoderUtilization", true, a.nvmlDeviceGetEncoderUtilization != nullptr,
        [&] { return a.nvmlDeviceGetEncoderUtilization(dev, &u, &v); });
  timed("nvmlDeviceGetDecoderUtilization", true, a.nvmlDeviceGetDecoderUtilization != nullptr,
        [&] { return a.nvmlDeviceGetDecoderUtilization(dev, &u, &v); });
  nvmlFieldValue_t f[2] = {};
  f[0].fieldId = NVML_FI_DEV_PCIE_COUNT_TX_BYTES;
  f[1].fieldId = NVML_FI_DEV_PCIE_COUNT_RX_BYTES;
  timed("nvmlDeviceGetFieldValues(PCIe byte counters)", false,
        a.nvmlDeviceGetFieldValues != nullptr, [&] {
          nvmlReturn_t rc = a.nvmlDeviceGetFieldValues(dev, 2, f);
          return rc != NVML_SUCCESS ? rc : f[0].nvmlReturn;
        });
  timed("nvmlDeviceGetTotalEnergyConsumption", true,
        a.nvmlDeviceGetTotalEnergyConsumption != nullptr,
        [&] { return a.nvmlDeviceGetTotalEnergyConsumption(dev, &ull); });
  timed("nvmlDeviceGetPcieReplayCounter", true, a.nvmlDeviceGetPcieReplayCounter != nullptr,
        [&] { return a.nvmlDeviceGetPcieReplayCounter(dev, &u); });
  timed("nvmlDeviceGetPcieThroughput", true, a.nvmlDeviceGetPcieThroughput != nullptr,
        [&] { return a.nvmlDeviceGetPcieThroughput(dev, NVML_PCIE_UTIL_TX_BYTES, &u); });
  nvmlGridLicensableFeatures_t lic = {};
  timed("nvmlDeviceGetGridLicensableFeatures_v4", true,
        a.nvmlDeviceGetGridLicensableFeatures_v4 != nullptr,
        [&] { return a.nvmlDeviceGetGridLicensableFeatures_v4(dev, &lic); });
  timed("nvmlDeviceGetMigMode", true, a.nvmlDeviceGetMigMode != nullptr,
        [&] { return a.nvmlDeviceGetMigMode(dev, &u, &v); });
  return out;
}

}  // namespace gpuha::gpu
