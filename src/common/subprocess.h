// SpawnProcess: fork/exec a child in its own session (so a terminal's Ctrl-C
// reaches only its parent, which then stops it in order), killed with its
// parent (PR_SET_PDEATHSIG, tied to the calling thread: call it from a thread
// that outlives the child). Used by the agent's supervisor and `gpuha demo`.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::common {

// `log_path` non-empty: the child's stdout and stderr are appended there.
// `die_with_parent` false: the child outlives this process (a fence hook
// that powers a node off must finish even if the controller dies).
// An exec failure (no such file, not executable) is an error here, not a
// child that exits 127.
[[nodiscard]] absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                                 const std::string& log_path = "",
                                                 bool die_with_parent = true);

// The direct children of `pid` (from /proc/PID/task/*/children), in no
// particular order; empty when it has none or is gone.
std::vector<pid_t> ChildPids(pid_t pid);

}  // namespace gpuha::common
