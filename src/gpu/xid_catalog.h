// The XIDs gpuha knows: what each means and what the cluster should do about it.
//
// Facts come from NVIDIA's "XID Errors" guide (docs.nvidia.com/deploy/xid-errors,
// r555 edition and later) and its "Catalog of XIDs" table; the consequence is
// gpuha's policy for stateless inference, derived from the guide's "action"
// column: an XID whose action is a GPU reset or node reboot takes the node out
// (fail-and-fence, or drain when the GPU still serves), an application fault
// that leaves the GPU usable is an alert.
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
};

std::span<const XidInfo> XidCatalog();
// nullptr for an XID not in the catalog.
const XidInfo* FindXid(uint32_t xid);
// The consequence of an XID seen at run time; unknown XIDs are alerts, so a new
// driver's XID reaches an operator without failing anything over.
XidConsequence ConsequenceOf(uint32_t xid);

}  // namespace gpuha::gpu
