#include "gpu/xid_catalog.h"

#include <array>

namespace gpuha::gpu {
namespace {

using C = XidConsequence;

// Meanings and buckets follow NVIDIA's XID catalog ("Resolution Bucket
// (Immediate Action)", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
// Buckets become consequences so:
//   IGNORE, WORKFLOW_XID_45 (follow the other XID)   ignore
//   RESTART_APP, CONTACT_SUPPORT                     alert: the GPU serves on
//   WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR        drain: the GPU serves while
//     its work moves, and a human reads the link decode (144-150: NVSentinel
//     decodes each sub-error, some to IGNORE; without that decode a drain
//     loses no request either way)
//   RESET_GPU, WORKFLOW_XID_48, RESTART_BM           fail-and-fence: the GPU is not
//     to be trusted before a reset (or the node before a reboot)
// Where this table departs from the catalog, the entry says why.
constexpr std::array kCatalog = {
    XidInfo{8, "GPU stopped processing (idle timeout)", C::kAlert, "RESTART_APP"},
    XidInfo{13, "Graphics engine exception (usually an application error)", C::kAlert,
            "RESTART_APP"},
    XidInfo{31, "GPU memory page fault (usually an application error)", C::kAlert, "RESTART_APP"},
    XidInfo{32, "Invalid or corrupted push buffer stream", C::kAlert, "RESTART_APP"},
    XidInfo{38, "Driver firmware (FECS) watchdog timeout", C::kIgnore, "IGNORE"},
    XidInfo{43, "GPU stopped processing (user application fault)", C::kIgnore, "IGNORE"},
    XidInfo{45, "Preemptive cleanup after a previous error", C::kIgnore, "WORKFLOW_XID_45"},
    XidInfo{46, "GPU timeout error", C::kFailAndFence, "RESET_GPU"},
    XidInfo{48, "Double-bit ECC error (DBE); the GPU needs a reset", C::kFailAndFence,
            "WORKFLOW_XID_48"},
    XidInfo{61, "Internal micro-controller breakpoint (unused since Ampere)", C::kAlert,
            "CONTACT_SUPPORT"},
    XidInfo{62, "Internal micro-controller halt; the GPU needs a reset", C::kFailAndFence,
            "RESET_GPU"},
    XidInfo{63, "ECC row remapping or page retirement recorded (common on healthy fleets)",
            C::kIgnore, "IGNORE"},
    XidInfo{64, "ECC row remapping or page retirement failed", C::kFailAndFence, "RESET_GPU"},
    XidInfo{68, "Video processor (NVDEC) exception", C::kAlert, "RESTART_APP"},
    XidInfo{69, "Graphics engine class error", C::kAlert, "RESTART_APP"},
    XidInfo{74, "NVLink error", C::kDrain, "WORKFLOW_NVLINK_ERR"},
    XidInfo{79, "GPU has fallen off the bus", C::kFailAndFence, "RESTART_BM"},
    XidInfo{92, "High single-bit ECC error rate", C::kIgnore, "IGNORE"},
    XidInfo{94, "Contained ECC error; affected applications restart, reset when convenient",
            C::kAlert, "RESTART_APP"},
    XidInfo{95, "Uncontained ECC error; every application on the GPU is affected", C::kFailAndFence,
            "RESET_GPU"},
    // NVIDIA's older guide had it as an application error; the catalog and
    // NVSentinel reset the GPU. The catalog wins: a context-switch timeout
    // is a GPU that stopped scheduling work until it is reset.
    XidInfo{109, "Context switch timeout", C::kFailAndFence, "RESET_GPU"},
    XidInfo{110, "Security fault", C::kFailAndFence, "RESET_GPU"},
    XidInfo{119, "GSP RPC timeout; the GPU needs a reset", C::kFailAndFence, "RESET_GPU"},
    XidInfo{120, "GSP error; the GPU needs a reset", C::kFailAndFence, "RESET_GPU"},
    XidInfo{121, "C2C link corrected error", C::kIgnore, "IGNORE"},
    XidInfo{136, "Link training failed", C::kFailAndFence, "RESET_GPU"},
    XidInfo{140, "Unrecovered ECC error", C::kFailAndFence, "RESET_GPU"},
    XidInfo{143, "GPU initialisation error", C::kFailAndFence, "RESET_GPU"},
    XidInfo{144, "NVLink5 SAW error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{145, "NVLink5 RLW error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{146, "NVLink5 TLW error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{147, "NVLink5 TREX error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{148, "NVLink5 NVLPW_CTRL error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{149, "NVLink5 NETIR error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    XidInfo{150, "NVLink5 MSE error", C::kDrain, "WORKFLOW_NVLINK5_ERR"},
    // Its action is in its message ("GPU Reset Required", "Node Reboot
    // Required", "Drain P2P"), which the NVML event does not carry: a drain
    // moves the work without losing a request whichever it says.
    XidInfo{154, "GPU recovery action changed (reset or reboot required)", C::kDrain, "XID_154"},
    XidInfo{155, "NVLink software-defined error (link taken down)", C::kFailAndFence, "RESET_GPU"},
    XidInfo{156, "Resource retirement event", C::kFailAndFence, "RESET_GPU"},
    XidInfo{158, "GPU fatal timeout", C::kFailAndFence, "RESET_GPU"},
    // The catalog says IGNORE; NVSentinel's older DCGM mapping reboots the
    // node. An alert: an operator sees it, nothing moves on a disputed entry.
    XidInfo{160, "Channel retirement event", C::kAlert, "IGNORE"},
    // No bucket in the catalog (NVSentinel's older mapping: RESET_GPU). A
    // power-smoothing state change, not a GPU fault: an alert.
    XidInfo{162, "Power-smoothing circuitry re-engaged (PSHC_REENGAGED)", C::kAlert, ""},
};

}  // namespace

absl::string_view XidConsequenceName(XidConsequence c) {
  switch (c) {
    case C::kIgnore:
      return "ignore";
    case C::kAlert:
      return "alert";
    case C::kDrain:
      return "drain";
    case C::kFailAndFence:
      return "fail-and-fence";
  }
  return "alert";
}

std::span<const XidInfo> XidCatalog() { return kCatalog; }

const XidInfo* FindXid(uint32_t xid) {
  for (const XidInfo& info : kCatalog) {
    if (info.xid == xid) return &info;
  }
  return nullptr;
}

XidConsequence ConsequenceOf(uint32_t xid) {
  const XidInfo* info = FindXid(xid);
  // An XID this table does not know (a newer driver's) drains: the work
  // moves without a request lost, and the reason names it for an operator.
  return info != nullptr ? info->consequence : C::kDrain;
}

bool IsApplicationXid(uint32_t xid) {
  const XidInfo* info = FindXid(xid);
  return info != nullptr && info->nvidia_action == "RESTART_APP";
}

}  // namespace gpuha::gpu
