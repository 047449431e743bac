// A fake libnvidia-ml.so.1 for tests: exports the NVML functions gpuha uses
// and serves values from a state file named by $FAKE_NVML_STATE, re-read on
// every call so a test can change the "GPU" while the agent runs. Lines are
// "key value":
//
//   count 2                 number of GPUs
//   init_error 9            nvmlInit_v2 returns this (9 = driver not loaded)
//   gpu0.temp 45            also: power_mw limit_mw mem_total mem_used util
//                           throttle ecc_corr ecc_unc pending name uuid
//                           sm_clock mem_clock energy_mj pcie_replay enc_util
//                           dec_util minor remap_corr remap_unc remap_failed
//                           mem_temp pcie_tx_kbps pcie_rx_kbps nvlink_tx_kib
//                           nvlink_rx_kib (no nvlink_* line: no NVLink)
//                           retired_sbe retired_dbe (no line: a board
//                           that remaps rows instead)
//                           vgpu_license (0 or 1: a vGPU guest whose compute
//                           license is not or is held; no line: bare metal)
//   gpu0.mig 7              MIG on, with instances in slots 0..6 (each a
//                           device of its own: name, uuid and mem_total
//                           lines as gpu0.mig3.name; gpu0.mig3.gone 1 empties
//                           slot 3)
//   driver_version 550.54   nvmlSystemGetDriverVersion
//   omit_optional 1         the optional entry points answer NOT_SUPPORTED
//   gpu0.lost 1             every call on gpu0 returns NVML_ERROR_GPU_IS_LOST
//   gpu0.hang 1             every call on gpu0 blocks (as a driver stuck in
//                           the kernel) until the line says 0 again
//   xid_seq 3               when this grows, one XID event is delivered:
//   xid_gpu 0               on this GPU
//   xid 79                  with this XID
//   gpu0.pcie_tx_bytes N    NVML's cumulative PCIe byte counters (field
//   gpu0.pcie_rx_bytes N    values 197 and 198); no line: not supported
//   gpu0.recovery_action N  NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field
//                           230); no line: not supported (before R565)
//   recovery_seq 2          when this grows, one recovery-action event
//   recovery_gpu 0          (nvmlEventTypeGpuRecoveryAction) on this GPU
//   no_recovery_event 1     registering that event type is refused
//                           (a driver before R565), XIDs still register
//
// With FAKE_NVML_COST=1 in the environment each call costs what it cost on
// a real driver (src/gpu/nvml_cost.h: an H200, driver 580; issue 38):
// CPU spent in the call and the wall time it blocks, so that agent_bench
// and the tests see what sampling a driver costs. The state file is then
// read again only when it changed (its mtime, size or inode), and the
// event wait sleeps until it changes (inotify) instead of polling it, as a
// driver's wait sleeps in the kernel.
//
// Built twice: complete, and with -DFAKE_NVML_OMIT_EVENT_WAIT to test a driver
// that lacks a required symbol.
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "gpu/nvml_abi.h"
#include "gpu/nvml_cost.h"

namespace {

struct FakeDevice {
  int index;
  int mig = -1;  // a MIG instance's slot, -1 for a whole GPU
};
FakeDevice g_devices[16] = {{0}, {1}, {2},  {3},  {4},  {5},  {6},  {7},
                            {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};
constexpr int kMaxMig = 7;
FakeDevice g_migs[16][kMaxMig];
int g_event_set_token = 0;
[[maybe_unused]] std::mutex g_mu;
[[maybe_unused]] long g_delivered_xid_seq = 0;
[[maybe_unused]] long g_delivered_recovery_seq = 0;
std::atomic<bool> g_recovery_registered{false};

bool CostModel() {
  static const bool on = [] {
    const char* v = std::getenv("FAKE_NVML_COST");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

// How often each entry point was called, once a test asked
// (fake_nvml_reset_calls): not otherwise, where it would cost the calls
// being modelled a lock and a map each.
std::atomic<bool> g_counting{false};
std::mutex g_calls_mu;
std::map<std::string, int> g_calls;

void Spend(const char* call) {
  if (g_counting.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    ++g_calls[call];
  }
  if (CostModel()) gpuha::gpu::SpendNvmlCost(gpuha::gpu::NvmlCallCostOf(call));
}

std::map<std::string, std::string> ReadState(const char* path) {
  std::map<std::string, std::string> kv;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, value;
    if (ls >> key) {
      std::getline(ls >> std::ws, value);
      kv[key] = value;
    }
  }
  return kv;
}

using Kv = std::map<std::string, std::string>;

// The state as one call reads it: shared, not copied (a copy per call cost
// as much as the calls being modelled).
class StateView {
 public:
  explicit StateView(std::shared_ptr<const Kv> kv) : kv_(std::move(kv)) {}
  operator const Kv&() const { return *kv_; }  // NOLINT: reads as the map
  Kv::const_iterator find(const std::string& key) const { return kv_->find(key); }
  Kv::const_iterator end() const { return kv_->end(); }

 private:
  std::shared_ptr<const Kv> kv_;
};

StateView State() {
  const char* path = std::getenv("FAKE_NVML_STATE");
  if (path == nullptr) return StateView(std::make_shared<const Kv>());
  if (!CostModel()) return StateView(std::make_shared<const Kv>(ReadState(path)));
  // Cached while the file is unchanged: parsing it per call would cost more
  // than the calls being modelled.
  static std::mutex mu;
  // The file is looked at once a millisecond at most (a GPU's sample is a
  // burst of calls; a stat each would be a system call per modelled call).
  static std::shared_ptr<const Kv> cached;
  static struct stat seen {};
  static std::chrono::steady_clock::time_point looked;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu);
  if (cached != nullptr && now - looked < std::chrono::milliseconds(1)) return StateView(cached);
  looked = now;
  struct stat st {};
  ::stat(path, &st);
  if (cached == nullptr || st.st_mtim.tv_sec != seen.st_mtim.tv_sec ||
      st.st_mtim.tv_nsec != seen.st_mtim.tv_nsec || st.st_size != seen.st_size ||
      st.st_ino != seen.st_ino) {
    cached = std::make_shared<const Kv>(ReadState(path));
    seen = st;
  }
  return StateView(cached);
}

long Num(const Kv& kv, const std::string& key, long fallback) {
  auto it = kv.find(key);
  return it == kv.end() ? fallback : std::strtol(it->second.c_str(), nullptr, 10);
}

int IndexOf(nvmlDevice_t d) { return reinterpret_cast<FakeDevice*>(d)->index; }

std::string Key(nvmlDevice_t d, const char* field) {
  const FakeDevice* f = reinterpret_cast<FakeDevice*>(d);
  return "gpu" + std::to_string(f->index) + "." +
         (f->mig < 0 ? "" : "mig" + std::to_string(f->mig) + ".") + field;
}

bool IsMig(nvmlDevice_t d) { return reinterpret_cast<FakeDevice*>(d)->mig >= 0; }

bool Lost(const Kv& kv, nvmlDevice_t d) { return Num(kv, Key(d, "lost"), 0) != 0; }

nvmlReturn_t CopyString(const std::string& s, char* out, unsigned int len) {
  if (s.size() + 1 > len) return NVML_ERROR_INVALID_ARGUMENT;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2(void) {
  Spend("nvmlInit_v2");
  return static_cast<nvmlReturn_t>(Num(State(), "init_error", NVML_SUCCESS));
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown(void) {
  Spend("nvmlShutdown");
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    default:
      return "Unknown Error";
  }
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  Spend("nvmlDeviceGetCount_v2");
  *count = static_cast<unsigned int>(Num(State(), "count", 1));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(
    unsigned int index, nvmlDevice_t* device) {
  Spend("nvmlDeviceGetHandleByIndex_v2");
  if (index >= 16 || index >= Num(State(), "count", 1)) return NVML_ERROR_INVALID_ARGUMENT;
  *device = reinterpret_cast<nvmlDevice_t>(&g_devices[index]);
  return NVML_SUCCESS;
}

// Blocks while the state file says gpuN.hang 1, then re-reads the state.
void HangWhileAsked(StateView& kv, nvmlDevice_t d) {
  while (Num(kv, Key(d, "hang"), 0) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kv = State();
  }
}

#define FAKE_LOST_CHECK(kv, d) \
  HangWhileAsked(kv, d);       \
  if (Lost(kv, d)) return NVML_ERROR_GPU_IS_LOST;

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name,
                                                                      unsigned int len) {
  Spend("nvmlDeviceGetName");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  auto it = kv.find(Key(d, "name"));
  const char* fallback = IsMig(d) ? "NVIDIA A100-SXM4-80GB MIG 1g.10gb" : "NVIDIA L4";
  return CopyString(it == kv.end() ? fallback : it->second, name, len);
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid,
                                                                      unsigned int len) {
  Spend("nvmlDeviceGetUUID");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  auto it = kv.find(Key(d, "uuid"));
  if (it != kv.end()) return CopyString(it->second, uuid, len);
  if (IsMig(d)) {
    return CopyString("MIG-fa4e0000-0000-0000-0000-0000000000" + std::to_string(IndexOf(d)) +
                          std::to_string(reinterpret_cast<FakeDevice*>(d)->mig),
                      uuid, len);
  }
  return CopyString("GPU-fa4e0000-0000-0000-0000-00000000000" + std::to_string(IndexOf(d)), uuid,
                    len);
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d,
                                                                            nvmlPciInfo_t* pci) {
  Spend("nvmlDeviceGetPciInfo_v3");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  std::memset(pci, 0, sizeof(*pci));
  pci->bus = 0x41 + IndexOf(d);
  std::snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d,
                                                                            nvmlMemory_t* m) {
  Spend("nvmlDeviceGetMemoryInfo");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  m->total = static_cast<unsigned long long>(
      Num(kv, Key(d, "mem_total"), IsMig(d) ? 10L << 30 : 24L << 30));
  m->used = static_cast<unsigned long long>(Num(kv, Key(d, "mem_used"), 1L << 30));
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int,
                                                                             unsigned int* t) {
  Spend("nvmlDeviceGetTemperature");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *t = static_cast<unsigned int>(Num(kv, Key(d, "temp"), 40));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d,
                                                                            unsigned int* mw) {
  Spend("nvmlDeviceGetPowerUsage");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *mw = static_cast<unsigned int>(Num(kv, Key(d, "power_mw"), 30000));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(
    nvmlDevice_t d, unsigned int* mw) {
  Spend("nvmlDeviceGetEnforcedPowerLimit");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *mw = static_cast<unsigned int>(Num(kv, Key(d, "limit_mw"), 72000));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUtilizationRates(
    nvmlDevice_t d, nvmlUtilization_t* u) {
  Spend("nvmlDeviceGetUtilizationRates");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  u->gpu = static_cast<unsigned int>(Num(kv, Key(d, "util"), 50));
  u->memory = u->gpu / 2;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(
    nvmlDevice_t d, unsigned long long* r) {
  Spend("nvmlDeviceGetCurrentClocksThrottleReasons");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *r = static_cast<unsigned long long>(Num(kv, Key(d, "throttle"), 0));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTotalEccErrors(
    nvmlDevice_t d, int type, int, unsigned long long* count) {
  Spend("nvmlDeviceGetTotalEccErrors");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *count = static_cast<unsigned long long>(
      Num(kv, Key(d, type == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "ecc_corr" : "ecc_unc"), 0));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(
    nvmlDevice_t d, int* pending) {
  Spend("nvmlDeviceGetRetiredPagesPendingStatus");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  if (Num(kv, Key(d, "pending"), -1) < 0) return NVML_ERROR_NOT_SUPPORTED;
  *pending = Num(kv, Key(d, "pending"), 0) != 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}
// The optional entry points: a value from the state file, or NOT_SUPPORTED
// where the line omit_optional says so.
#define FAKE_OPTIONAL_CHECK(kv, d) \
  FAKE_LOST_CHECK(kv, d);          \
  if (Num(kv, "omit_optional", 0) != 0) return NVML_ERROR_NOT_SUPPORTED
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type,
                                                                           unsigned int* mhz) {
  Spend("nvmlDeviceGetClockInfo");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *mhz = static_cast<unsigned int>(type == NVML_CLOCK_MEM ? Num(kv, Key(d, "mem_clock"), 1215)
                                                          : Num(kv, Key(d, "sm_clock"), 1410));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(
    nvmlDevice_t d, unsigned long long* mj) {
  Spend("nvmlDeviceGetTotalEnergyConsumption");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *mj = static_cast<unsigned long long>(Num(kv, Key(d, "energy_mj"), 123456789));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPcieReplayCounter(
    nvmlDevice_t d, unsigned int* count) {
  Spend("nvmlDeviceGetPcieReplayCounter");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *count = static_cast<unsigned int>(Num(kv, Key(d, "pcie_replay"), 0));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetEncoderUtilization(
    nvmlDevice_t d, unsigned int* pct, unsigned int* period_us) {
  Spend("nvmlDeviceGetEncoderUtilization");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *pct = static_cast<unsigned int>(Num(kv, Key(d, "enc_util"), 0));
  *period_us = 167000;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetDecoderUtilization(
    nvmlDevice_t d, unsigned int* pct, unsigned int* period_us) {
  Spend("nvmlDeviceGetDecoderUtilization");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *pct = static_cast<unsigned int>(Num(kv, Key(d, "dec_util"), 0));
  *period_us = 167000;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetRemappedRows(
    nvmlDevice_t d, unsigned int* corr, unsigned int* unc, unsigned int* pending,
    unsigned int* failed) {
  Spend("nvmlDeviceGetRemappedRows");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *corr = static_cast<unsigned int>(Num(kv, Key(d, "remap_corr"), 0));
  *unc = static_cast<unsigned int>(Num(kv, Key(d, "remap_unc"), 0));
  *pending = 0;
  *failed = static_cast<unsigned int>(Num(kv, Key(d, "remap_failed"), 0));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPcieThroughput(
    nvmlDevice_t d, int counter, unsigned int* kbps) {
  Spend("nvmlDeviceGetPcieThroughput");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *kbps = static_cast<unsigned int>(
      Num(kv, Key(d, counter == NVML_PCIE_UTIL_TX_BYTES ? "pcie_tx_kbps" : "pcie_rx_kbps"), 1000));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetFieldValues(
    nvmlDevice_t d, int count, nvmlFieldValue_t* values) {
  Spend("nvmlDeviceGetFieldValues");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  for (int i = 0; i < count; ++i) {
    nvmlFieldValue_t& f = values[i];
    const char* key = f.fieldId == NVML_FI_DEV_MEMORY_TEMP                 ? "mem_temp"
                      : f.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? "nvlink_tx_kib"
                      : f.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX ? "nvlink_rx_kib"
                      : f.fieldId == NVML_FI_DEV_RETIRED_SBE               ? "retired_sbe"
                      : f.fieldId == NVML_FI_DEV_RETIRED_DBE               ? "retired_dbe"
                      : f.fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES       ? "pcie_tx_bytes"
                      : f.fieldId == NVML_FI_DEV_PCIE_COUNT_RX_BYTES       ? "pcie_rx_bytes"
                      : f.fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION   ? "recovery_action"
                                                                           : nullptr;
    long v =
        key == nullptr ? -1 : Num(kv, Key(d, key), f.fieldId == NVML_FI_DEV_MEMORY_TEMP ? 45 : -1);
    if (v < 0) {
      f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
      continue;
    }
    f.nvmlReturn = NVML_SUCCESS;
    // Temperatures and the recovery action come as unsigned int,
    // throughput counters as unsigned long long.
    if (f.fieldId == NVML_FI_DEV_MEMORY_TEMP || f.fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
      f.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
      f.value.uiVal = static_cast<unsigned int>(v);
    } else {
      f.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
      f.value.ullVal = static_cast<unsigned long long>(v);
    }
  }
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(
    nvmlDevice_t d, nvmlGridLicensableFeatures_t* lic) {
  Spend("nvmlDeviceGetGridLicensableFeatures_v4");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *lic = {};
  const long state = Num(kv, Key(d, "vgpu_license"), -1);
  if (state < 0) return NVML_SUCCESS;  // licensing not supported: bare metal
  lic->isGridLicenseSupported = 1;
  // A guest lists every licensable feature and enables the one its profile
  // uses: here vWS (not used, not licensed) and compute (a C-series profile).
  lic->licensableFeaturesCount = 2;
  lic->gridLicensableFeatures[0].featureCode = 2;
  lic->gridLicensableFeatures[1].featureCode = 4;
  lic->gridLicensableFeatures[1].featureEnabled = 1;
  lic->gridLicensableFeatures[1].featureState = state != 0 ? 1 : 0;
  std::strncpy(lic->gridLicensableFeatures[1].productName, "NVIDIA Virtual Compute Server",
               NVML_GRID_LICENSE_BUFFER_SIZE - 1);
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d,
                                                                             unsigned int* minor) {
  Spend("nvmlDeviceGetMinorNumber");
  auto kv = State();
  FAKE_OPTIONAL_CHECK(kv, d);
  *minor = static_cast<unsigned int>(Num(kv, Key(d, "minor"), IndexOf(d)));
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlSystemGetDriverVersion(char* version,
                                                                               unsigned int len) {
  Spend("nvmlSystemGetDriverVersion");
  auto kv = State();
  if (Num(kv, "omit_optional", 0) != 0) return NVML_ERROR_NOT_SUPPORTED;
  auto it = kv.find("driver_version");
  return CopyString(it == kv.end() ? "550.54.15" : it->second, version, len);
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  Spend("nvmlEventSetCreate");
  *set = reinterpret_cast<nvmlEventSet_t>(&g_event_set_token);
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceRegisterEvents(
    nvmlDevice_t, unsigned long long types, nvmlEventSet_t) {
  Spend("nvmlDeviceRegisterEvents");
  // As a driver before R565 refuses a type it does not know. (The last
  // registration says whether the event set has the type: one probe a
  // process in the tests.)
  const bool recovery = (types & nvmlEventTypeGpuRecoveryAction) != 0;
  if (recovery && Num(State(), "no_recovery_event", 0) != 0) return NVML_ERROR_NOT_SUPPORTED;
  g_recovery_registered = recovery;
  return NVML_SUCCESS;
}
#ifndef FAKE_NVML_OMIT_EVENT_WAIT
__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t,
                                                                        nvmlEventData_t* data,
                                                                        unsigned int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto kv = State();
    long seq = Num(kv, "xid_seq", 0);
    const long recovery_seq = Num(kv, "recovery_seq", 0);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (seq > g_delivered_xid_seq) {
        g_delivered_xid_seq = seq;
        int gpu = static_cast<int>(Num(kv, "xid_gpu", 0));
        data->device = reinterpret_cast<nvmlDevice_t>(&g_devices[gpu & 15]);
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = static_cast<unsigned long long>(Num(kv, "xid", 0));
        return NVML_SUCCESS;
      }
      if (recovery_seq > g_delivered_recovery_seq && g_recovery_registered) {
        g_delivered_recovery_seq = recovery_seq;
        int gpu = static_cast<int>(Num(kv, "recovery_gpu", 0));
        data->device = reinterpret_cast<nvmlDevice_t>(&g_devices[gpu & 15]);
        data->eventType = nvmlEventTypeGpuRecoveryAction;
        data->eventData = static_cast<unsigned long long>(
            Num(kv, "gpu" + std::to_string(gpu & 15) + ".recovery_action", 0));
        return NVML_SUCCESS;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return NVML_ERROR_TIMEOUT;
    if (!CostModel()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    // Sleep until the state file changes (or the wait's time is up).
    const char* path = std::getenv("FAKE_NVML_STATE");
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0 || path == nullptr ||
        inotify_add_watch(fd, path, IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF) < 0) {
      if (fd >= 0) close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    auto now_kv = State();
    if (Num(now_kv, "xid_seq", 0) == seq &&
        Num(now_kv, "recovery_seq", 0) ==
            recovery_seq) {  // nothing came between the read and the watch
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::max<long>(1, left.count())));
    }
    close(fd);
  }
}
#endif
__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t) {
  Spend("nvmlEventSetFree");
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d,
                                                                         unsigned int* current,
                                                                         unsigned int* pending) {
  Spend("nvmlDeviceGetMigMode");
  auto kv = State();
  if (Num(kv, "omit_optional", 0) != 0) return NVML_ERROR_NOT_SUPPORTED;
  FAKE_LOST_CHECK(kv, d);
  *current = *pending = Num(kv, Key(d, "mig"), 0) > 0 ? 1 : 0;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(
    nvmlDevice_t d, unsigned int* count) {
  Spend("nvmlDeviceGetMaxMigDeviceCount");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  *count = kMaxMig;
  return NVML_SUCCESS;
}
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(
    nvmlDevice_t d, unsigned int index, nvmlDevice_t* mig) {
  Spend("nvmlDeviceGetMigDeviceHandleByIndex");
  auto kv = State();
  FAKE_LOST_CHECK(kv, d);
  const int gpu = IndexOf(d);
  if (static_cast<long>(index) >= Num(kv, Key(d, "mig"), 0) || index >= kMaxMig) {
    return NVML_ERROR_NOT_FOUND;
  }
  g_migs[gpu][index] = FakeDevice{gpu, static_cast<int>(index)};
  if (Num(kv, Key(reinterpret_cast<nvmlDevice_t>(&g_migs[gpu][index]), "gone"), 0) != 0) {
    return NVML_ERROR_NOT_FOUND;
  }
  *mig = reinterpret_cast<nvmlDevice_t>(&g_migs[gpu][index]);
  return NVML_SUCCESS;
}

// For tests (not NVML's): the calls made since the last reset, by entry
// point, and in all; counting starts at the first reset.
__attribute__((visibility("default"))) int fake_nvml_calls(const char* call) {
  std::lock_guard<std::mutex> lock(g_calls_mu);
  if (call == nullptr) {
    int all = 0;
    for (const auto& [name, n] : g_calls) all += n;
    return all;
  }
  auto it = g_calls.find(call);
  return it == g_calls.end() ? 0 : it->second;
}
__attribute__((visibility("default"))) void fake_nvml_reset_calls() {
  std::lock_guard<std::mutex> lock(g_calls_mu);
  g_calls.clear();
  g_counting = true;
}

}  // extern "C"
