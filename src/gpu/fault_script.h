// Fault scripts for the simulated GPU backend: what goes wrong, on which GPU,
// and when (milliseconds after the agent starts). Written as YAML
//
//   faults:
//     - { at_ms: 2000, gpu: 0, kind: xid, xid: 79 }
//     - { at_ms: 0, gpu: 1, kind: temp_ramp, to_c: 95, over_ms: 5000 }
//     - { at_ms: 3000, gpu: 0, kind: mig_lost, slice: 2 }
//
// or one per --fault flag: "at_ms=2000,gpu=0,kind=xid,xid=79".
// Every bad item gets an error naming it; an XID must be in the catalog.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::gpu {

enum class FaultKind {
  kTempRamp,        // to_c over over_ms, then held
  kXid,             // one XID event, with its side effects (79 loses the GPU)
  kEccBurst,        // corrected / uncorrected counts jump
  kPowerExcursion,  // power draw at `watts` for for_ms
  kLost,            // the GPU stops answering (NVML_ERROR_GPU_IS_LOST)
  kAgentHang,       // the agent stops heartbeating for for_ms, connection kept open
  kDriverHang,      // sampling the GPU blocks, as an NVML call stuck in the
                    // kernel, for for_ms (0: until a clear)
  kClear,           // the GPU is reset: every fault on it ends, counters return to zero
  kMigLost,         // MIG instance `slice` of the GPU disappears (a GPU with MIG on)
};

absl::string_view FaultKindName(FaultKind k);

struct Fault {
  int64_t at_ms = 0;
  uint32_t gpu = 0;
  FaultKind kind = FaultKind::kXid;
  double to_c = 0;
  int64_t over_ms = 0;
  uint32_t xid = 0;
  uint64_t corrected = 0;
  uint64_t uncorrected = 0;
  double watts = 0;
  int64_t for_ms = 0;
  uint32_t slice = 0;  // mig_lost: the MIG instance's slot
};

// `source` names the script in errors.
[[nodiscard]] absl::StatusOr<std::vector<Fault>> ParseFaultScript(absl::string_view yaml,
                                                                  std::string source);
[[nodiscard]] absl::StatusOr<std::vector<Fault>> LoadFaultScriptFile(const std::string& path);
// One fault in the flag form "key=value,key=value".
[[nodiscard]] absl::StatusOr<Fault> ParseFaultSpec(absl::string_view spec);

}  // namespace gpuha::gpu
