// XIDs 144-150 (NVLink5 errors): what the kernel log line's registers
// say to do. NVIDIA's catalog decodes each by its sub-error, from IGNORE to
// RESET_GPU ("Xid 144-150 Decode" in its workbook): the line
//   NVRM: Xid (PCI:0000:3f:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 10
//     (0x04082907 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)
// carries IntrInfo and Error Status first in the parentheses. The sub-error
// is IntrInfo bits 9:5 (and the NVLink unit 4:0) before driver R575, bits
// 6:0 from R575; bits 25:20 are XID 149's link-down reason. A row matches
// when every bit its mask fixes equals IntrInfo's and Error Status is one
// of its values (any, where it lists none).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace gpuha::gpu {

struct Nvlink5Decode {
  absl::string_view subcode;  // "RLW_SRC_TRACK"
  // The catalog's bucket: IGNORE, RESET_GPU, or XID_154_EVAL (take the
  // action of the XID 154 beside it; none: RESTART_APP).
  absl::string_view action;
};

// The first row that matches; nullopt when none does (a sub-error newer
// than the table). `driver_major`: the driver's branch (580 of 580.95.05);
// 0 when not known: the two encodings are both tried, and where both
// match the worse action counts.
std::optional<Nvlink5Decode> DecodeNvlink5(uint32_t xid, uint32_t intr_info, uint32_t error_status,
                                           uint32_t driver_major);

// The driver's branch of a version ("580.159.04": 580), which says how
// IntrInfo is laid out; 0 when it is not one.
uint32_t DriverMajor(absl::string_view version);

}  // namespace gpuha::gpu
