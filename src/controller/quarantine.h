// The quarantine breaker's arithmetic (fence.quarantine_max_share,
// NVSentinel's circuit breaker): a health verdict takes one more node, or
// one more GPU, out only while the share out stays within the limit, so
// that a flood of false alarms cannot take the fleet down. The first one
// out is always allowed: a one-node cluster still acts. Nodes and GPUs are
// counted apart (Controller::QuarantineAllowsLocked and
// GpuQuarantineAllowsLocked say which count).
#pragma once

#include <cstdint>

namespace gpuha::controller {

// Whether one more of `all` may go out while `out` are, at `max_share` (1
// or more: no breaker).
bool QuarantineAllows(double max_share, int64_t out, int64_t all);

}  // namespace gpuha::controller
