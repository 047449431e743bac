// The XIDs gpuha knows: what each means and what the cluster should do about it.
//
// Every XID of NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors, its
// workbook Xid-Catalog.xlsx: XIDs 1-172), each with the catalog's
// immediate-action bucket; the consequence is gpuha's policy for stateless
// inference, derived from that bucket (xid_catalog.cc says how; an entry's
// note says where it departs, or what gpuha chose where the catalog gives
// no bucket), and the few newer XIDs known past it (XidsAfterCatalog).
// docs/xid-policy.md lists them all. Any other XID (a newer driver's)
// drains.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "absl/strings/string_view.h"

namespace gpuha::gpu {

enum class XidConsequence {
  kIgnore,        // application-level; the GPU is fine
  kAlert,         // tell an operator; keep serving
  kDrain,         // move work off while the GPU still serves
  kFailAndFence,  // the GPU is gone or untrustworthy: fail over at once
};

absl::string_view XidConsequenceName(XidConsequence c);  // "ignore" | "alert" | ...

struct XidInfo {
  uint32_t xid;
  absl::string_view meaning;
  XidConsequence consequence;
  absl::string_view nvidia_action;  // the catalog's bucket ("RESET_GPU"); "" when it has none
  // Where gpuha departs from the bucket, or what it chose without one.
  absl::string_view note = "";
};

std::span<const XidInfo> XidCatalog();
// XIDs past the catalog that newer drivers report (185), each with a note.
std::span<const XidInfo> XidsAfterCatalog();
// nullptr for an XID not in the catalog.
const XidInfo* FindXid(uint32_t xid);
// The consequence of an XID seen at run time, before what its kernel log
// line says (XID 154's action, 144-150's decode, 45's cause); an unknown
// one (a newer driver's) drains, as NVSentinel and the device plugin treat
// it as a fault.
XidConsequence ConsequenceOf(uint32_t xid);
// An application's fault by the catalog (RESTART_APP): the process the
// kernel log names for it is the one to restart.
bool IsApplicationXid(uint32_t xid);
// The node's, not one GPU's: the catalog restarts the machine (RESTART_BM,
// RESTART_VM).
bool IsNodeXid(uint32_t xid);
// XIDs whose verdict the kernel log's line decides (the process of an
// application's XID, XID 154's action, 144-150's registers, XID 45's
// cause): NVML's event, which carries none of it, waits a moment for it.
bool XidNeedsKernelLine(uint32_t xid);

// XID 154's recovery action, by the value the driver prints ("GPU recovery
// action changed from 0x0 (None) to 0x4 (Drain and Reset)"): R565 to R595
// name 0-5; NVML R615 adds 6 and 7; R610 drivers print "PF FLR" for 1 and
// "OS Reboot" for 2.
struct RecoveryAction {
  absl::string_view name;  // the driver's words for it
  XidConsequence consequence;
  bool node = false;         // the node reboots
  bool reset_after = false;  // drain, then the GPU is reset ("Drain and Reset")
};
// nullopt for a value this table does not know.
std::optional<RecoveryAction> Xid154Action(int value);
// The value a driver's words name (older lines, or a cross-check); -1 for
// words this table does not know.
int Xid154ActionValue(absl::string_view name);

}  // namespace gpuha::gpu
