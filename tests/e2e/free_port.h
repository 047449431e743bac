// FreePort: a loopback TCP port that was free a moment ago, for processes
// whose listen address must be known before they start.
#pragma once

#include <cstdint>

#include "common/net_util.h"

namespace gpuha::e2e {

inline uint16_t FreePort() { return common::FreeLoopbackPort(); }

}  // namespace gpuha::e2e
