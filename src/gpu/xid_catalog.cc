#include "gpu/xid_catalog.h"

#include <array>

namespace gpuha::gpu {
namespace {

using C = XidConsequence;

// Meanings follow NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors).
constexpr std::array kCatalog = {
    XidInfo{8, "GPU stopped processing (driver timeout)", C::kDrain},
    XidInfo{13, "Graphics engine exception (usually an application error)", C::kAlert},
    XidInfo{31, "GPU memory page fault (usually an application error)", C::kAlert},
    XidInfo{32, "Invalid or corrupted push buffer stream", C::kAlert},
    XidInfo{38, "Driver firmware error", C::kDrain},
    XidInfo{43, "GPU stopped processing (user application fault)", C::kIgnore},
    XidInfo{45, "Preemptive cleanup after a previous error", C::kIgnore},
    XidInfo{48, "Double-bit ECC error (DBE); the GPU needs a reset", C::kFailAndFence},
    XidInfo{61, "Internal micro-controller breakpoint or warning", C::kAlert},
    XidInfo{62, "Internal micro-controller halt; the GPU needs a reset", C::kFailAndFence},
    XidInfo{63, "ECC page retirement or row remapping recorded; reset at the next chance",
            C::kDrain},
    XidInfo{64, "ECC page retirement or row remapping recording failure", C::kDrain},
    XidInfo{68, "Video processor (NVDEC) exception", C::kAlert},
    XidInfo{69, "Graphics engine class error", C::kAlert},
    XidInfo{74, "NVLink error", C::kDrain},
    XidInfo{79, "GPU has fallen off the bus", C::kFailAndFence},
    XidInfo{92, "High single-bit ECC error rate", C::kAlert},
    XidInfo{94, "Contained ECC error; affected applications must restart, reset soon", C::kDrain},
    XidInfo{95, "Uncontained ECC error; every application on the GPU is affected",
            C::kFailAndFence},
    XidInfo{109, "Context switch timeout", C::kAlert},
    XidInfo{119, "GSP RPC timeout; the GPU needs a reset", C::kFailAndFence},
    XidInfo{120, "GSP error; the GPU needs a reset", C::kFailAndFence},
    XidInfo{121, "C2C link corrected error", C::kAlert},
    XidInfo{140, "Unrecovered ECC error", C::kFailAndFence},
    XidInfo{154, "GPU recovery action changed (reset or reboot required)", C::kDrain},
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
  return info != nullptr ? info->consequence : C::kAlert;
}

}  // namespace gpuha::gpu
