// systemd's readiness protocol (sd_notify(3)), for `Type=notify` units: one
// datagram of "KEY=VALUE" lines to the unix socket named by $NOTIFY_SOCKET.
// systemd documents the protocol as stable and meant to be spoken without
// libsystemd, and speaking it ourselves keeps libsystemd (and its own
// dependencies) out of a binary that already links many libraries.
//
//   common::SdNotify("READY=1\nSTATUS=serving on 127.0.0.1:8080");
//   ...
//   common::SdNotify("STOPPING=1");
//
// Outside systemd ($NOTIFY_SOCKET unset) it does nothing and returns OK.
// A "@" at the socket name's start means the abstract namespace.
// Thread-safety: reads the environment; call from the main thread.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace gpuha::common {

[[nodiscard]] absl::Status SdNotify(const std::string& state);

// SdNotify's failure is logged, never fatal: a service that serves must not
// stop because its supervisor's socket went away.
void SdNotifyOrLog(const std::string& state);

}  // namespace gpuha::common
