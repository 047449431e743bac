// FenceRunner: runs the operator's fence hook ("kubectl cordon {node}",
// "ipmitool ... power off") when a node's agent cannot be told to fence
// itself, and says whether the fence is confirmed. Pacemaker's rule: no
// confirmed fence, no work for the node.
//
//   ShellFenceRunner runner;
//   absl::Status s = runner.Run("ipmitool -H bmc-7 chassis power off", 10s);
//   // OK: exit 0. Internal: non-zero exit or a signal. DeadlineExceeded:
//   // the hook and everything it started were killed at the timeout.
//
// The hook runs under /bin/sh in its own session and process group, through
// common::SpawnProcess: no signal stays blocked in it (the controller blocks
// SIGINT and SIGTERM for its signal thread), so it and its children can be
// stopped, and it is not killed if the controller dies mid-fence. Thread-safety: Run may be called
// from several threads at once; each call blocks its caller until the hook ends.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/clock.h"

namespace gpuha::controller {

class FenceRunner {
 public:
  virtual ~FenceRunner() = default;
  [[nodiscard]] virtual absl::Status Run(const std::string& command, common::Duration timeout) = 0;
};

class ShellFenceRunner : public FenceRunner {
 public:
  [[nodiscard]] absl::Status Run(const std::string& command, common::Duration timeout) override;
};

}  // namespace gpuha::controller
