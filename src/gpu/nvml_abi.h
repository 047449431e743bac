// The slice of NVML's C ABI that gpuha uses, declared here so the build needs
// neither CUDA nor nvml.h. Values and layouts follow NVIDIA's NVML API
// reference (docs.nvidia.com/deploy/nvml-api, "Device Structs", "Error
// reporting", "Event Handling Methods"); they have been stable since NVML 9.
// The fake library in tests/fake_nvml exports the same functions.
#pragma once

#include <cstdint>

extern "C" {

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;
typedef int nvmlReturn_t;

enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_UNKNOWN = 999,
};

// nvmlTemperatureSensors_t
enum : int { NVML_TEMPERATURE_GPU = 0 };
enum : int { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
constexpr unsigned int NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;
enum : int { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };
// Field IDs (nvmlDeviceGetFieldValues) and the scope that sums all links.
enum : unsigned int {
  NVML_FI_DEV_RETIRED_SBE = 29,  // pages retired for single-bit errors
  NVML_FI_DEV_RETIRED_DBE = 30,  // pages retired for double-bit errors
  NVML_FI_DEV_MEMORY_TEMP = 82,
  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138,  // KiB, cumulative
  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139,
  NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197,  // bytes, cumulative (R535 and later)
  NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198,
  // The driver's recovery action for the GPU (nvmlGpuRecoveryAction_t, the
  // values XID 154's line prints: 0 none, 1 GPU reset, 2 node reboot, 3
  // drain P2P, 4 drain and reset; R565 and later).
  NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230,
};
constexpr unsigned int NVML_SCOPE_ALL_LINKS = 0xFFFFFFFFu;
enum : int {
  NVML_VALUE_TYPE_DOUBLE = 0,
  NVML_VALUE_TYPE_UNSIGNED_INT = 1,
  NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
  NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
  NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
  NVML_VALUE_TYPE_SIGNED_INT = 5,
};
// nvmlMemoryErrorType_t and nvmlEccCounterType_t
enum : int { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum : int { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
// nvmlEnableState_t
enum : int { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };

constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x0000000000000008ULL;
// The GPU's recovery action changed (R565 and later; older drivers refuse
// to register it). Read NVML_FI_DEV_GET_GPU_RECOVERY_ACTION for the value.
constexpr unsigned long long nvmlEventTypeGpuRecoveryAction = 0x0000000000008000ULL;
constexpr unsigned int NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
constexpr unsigned int NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;

typedef struct {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
  int siVal;
} nvmlValue_t;

typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;  // for NVLink fields: the link, or NVML_SCOPE_ALL_LINKS
  long long timestamp;
  long long latencyUsec;
  int valueType;  // NVML_VALUE_TYPE_*
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

// vGPU software licensing, as a guest VM sees its vGPU
// (nvmlDeviceGetGridLicensableFeatures_v4; NVML_GRID_LICENSE_BUFFER_SIZE 128,
// NVML_GRID_LICENSE_FEATURE_MAX_COUNT 3). Bare metal: isGridLicenseSupported 0.
constexpr unsigned int NVML_GRID_LICENSE_BUFFER_SIZE = 128;
constexpr unsigned int NVML_GRID_LICENSE_FEATURE_MAX_COUNT = 3;
typedef struct {
  unsigned int year;
  unsigned short month, day, hour, min, sec;
  unsigned char status;
} nvmlGridLicenseExpiry_t;
typedef struct {
  int featureCode;            // nvmlGridLicenseFeatureCode_t: 1 vGPU, 2 RTX vWS, 4 compute
  unsigned int featureState;  // non-zero: licensed
  char licenseInfo[NVML_GRID_LICENSE_BUFFER_SIZE];
  char productName[NVML_GRID_LICENSE_BUFFER_SIZE];
  unsigned int featureEnabled;  // non-zero: the feature this vGPU uses
  nvmlGridLicenseExpiry_t licenseExpiry;
} nvmlGridLicensableFeature_t;
typedef struct {
  int isGridLicenseSupported;
  unsigned int licensableFeaturesCount;
  nvmlGridLicensableFeature_t gridLicensableFeatures[NVML_GRID_LICENSE_FEATURE_MAX_COUNT];
} nvmlGridLicensableFeatures_t;
static_assert(sizeof(nvmlGridLicensableFeature_t) == 284, "NVML's layout");
static_assert(sizeof(nvmlGridLicensableFeatures_t) == 860, "NVML's layout");

typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for nvmlEventTypeXidCriticalError
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

}  // extern "C"

// nvmlDeviceGetMigMode's current mode: MIG instances are enabled.
constexpr unsigned int NVML_DEVICE_MIG_ENABLE = 1;

// The signatures, one X-macro so the loader and the fake cannot drift apart:
// X(name, return, (params)).
#define GPUHA_NVML_FUNCTIONS(X)                                                                    \
  X(nvmlInit_v2, (void))                                                                           \
  X(nvmlShutdown, (void))                                                                          \
  X(nvmlDeviceGetCount_v2, (unsigned int* count))                                                  \
  X(nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t* device))                     \
  X(nvmlDeviceGetName, (nvmlDevice_t device, char* name, unsigned int length))                     \
  X(nvmlDeviceGetUUID, (nvmlDevice_t device, char* uuid, unsigned int length))                     \
  X(nvmlDeviceGetPciInfo_v3, (nvmlDevice_t device, nvmlPciInfo_t * pci))                           \
  X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t * memory))                         \
  X(nvmlDeviceGetTemperature, (nvmlDevice_t device, int sensor, unsigned int* temp))               \
  X(nvmlDeviceGetPowerUsage, (nvmlDevice_t device, unsigned int* milliwatts))                      \
  X(nvmlDeviceGetEnforcedPowerLimit, (nvmlDevice_t device, unsigned int* milliwatts))              \
  X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t device, nvmlUtilization_t * utilization))         \
  X(nvmlDeviceGetCurrentClocksThrottleReasons, (nvmlDevice_t device, unsigned long long* reasons)) \
  X(nvmlDeviceGetTotalEccErrors,                                                                   \
    (nvmlDevice_t device, int error_type, int counter_type, unsigned long long* count))            \
  X(nvmlDeviceGetRetiredPagesPendingStatus, (nvmlDevice_t device, int* is_pending))                \
  X(nvmlEventSetCreate, (nvmlEventSet_t * set))                                                    \
  X(nvmlDeviceRegisterEvents,                                                                      \
    (nvmlDevice_t device, unsigned long long event_types, nvmlEventSet_t set))                     \
  X(nvmlEventSetWait_v2, (nvmlEventSet_t set, nvmlEventData_t * data, unsigned int timeout_ms))    \
  X(nvmlEventSetFree, (nvmlEventSet_t set))

// Entry points a driver may lack (older branches, some boards): resolved if
// present; a reading they serve is then missing, not an error.
#define GPUHA_NVML_OPTIONAL_FUNCTIONS(X)                                                     \
  X(nvmlDeviceGetRemappedRows,                                                               \
    (nvmlDevice_t device, unsigned int* corrected, unsigned int* uncorrected,                \
     unsigned int* pending, unsigned int* failed))                                           \
  X(nvmlDeviceGetClockInfo, (nvmlDevice_t device, int type, unsigned int* mhz))              \
  X(nvmlDeviceGetTotalEnergyConsumption, (nvmlDevice_t device, unsigned long long* mj))      \
  X(nvmlDeviceGetPcieReplayCounter, (nvmlDevice_t device, unsigned int* count))              \
  X(nvmlDeviceGetEncoderUtilization,                                                         \
    (nvmlDevice_t device, unsigned int* pct, unsigned int* sampling_us))                     \
  X(nvmlDeviceGetDecoderUtilization,                                                         \
    (nvmlDevice_t device, unsigned int* pct, unsigned int* sampling_us))                     \
  X(nvmlDeviceGetMinorNumber, (nvmlDevice_t device, unsigned int* minor))                    \
  X(nvmlSystemGetDriverVersion, (char* version, unsigned int length))                        \
  X(nvmlDeviceGetPcieThroughput, (nvmlDevice_t device, int counter, unsigned int* kb_per_s)) \
  X(nvmlDeviceGetFieldValues, (nvmlDevice_t device, int count, nvmlFieldValue_t* values))    \
  X(nvmlDeviceGetGridLicensableFeatures_v4,                                                  \
    (nvmlDevice_t device, nvmlGridLicensableFeatures_t * features))                          \
  X(nvmlDeviceGetMigMode,                                                                    \
    (nvmlDevice_t device, unsigned int* current_mode, unsigned int* pending_mode))           \
  X(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t device, unsigned int* count))              \
  X(nvmlDeviceGetMigDeviceHandleByIndex,                                                     \
    (nvmlDevice_t device, unsigned int index, nvmlDevice_t* mig_device))
