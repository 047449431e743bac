// The XIDs gpuha knows: what each means and what the cluster should do about it.
//
// Facts come from NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors),
// each entry with the catalog's immediate-action bucket; the consequence is
// gpuha's policy for stateless inference, derived from that bucket
// (xid_catalog.cc says how, and where it departs): a GPU reset or node
// reboot fails the GPU over, a link workflow drains it, an application
// restart is an alert, IGNORE is ignored. An XID not in the table drains.
#pragma once

#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"

namespace gpuha::gpu {

enum class XidConsequence {
  kIgnore,        // application-level; the GPU is fine
  kAlert,         // tell an operator; keep serving
  kDrain,         // move work off while the GPU still serves, then reset
  kFailAndFence,  // the GPU is gone or untrustworthy: fail over at once
};

absl::string_view XidConsequenceName(XidConsequence c);  // "ignore" | "alert" | ...

struct XidInfo {
  uint32_t xid;
  absl::string_view meaning;
  XidConsequence consequence;
  absl::string_view nvidia_action;  // the catalog's bucket ("RESET_GPU"); "" when it has none
};

std::span<const XidInfo> XidCatalog();
// nullptr for an XID not in the catalog.
const XidInfo* FindXid(uint32_t xid);
// The consequence of an XID seen at run time; an unknown one (a newer
// driver's) drains, as NVSentinel and the device plugin treat it as a fault.
XidConsequence ConsequenceOf(uint32_t xid);
// An application's fault by the catalog (RESTART_APP): the process the
// kernel log names for it is the one to restart.
bool IsApplicationXid(uint32_t xid);

}  // namespace gpuha::gpu
