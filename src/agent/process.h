// ProcessRunner: the agent's door to child processes, so the supervisor's
// restart and fencing logic is tested without forking (FakeProcessRunner in
// supervisor_test.cc) and e2e tests confirm it with real processes.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::agent {

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  // Starts argv[0] with argv in its own process group; returns the pid.
  virtual absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv) = 0;
  // Returns "exit N" or "signal N" once the process has ended, else nullopt.
  virtual std::optional<std::string> Poll(pid_t pid) = 0;
  // Signals the process group.
  virtual void Signal(pid_t pid, int signo) = 0;
};

// fork/exec with setsid; children die with the agent (PR_SET_PDEATHSIG).
class RealProcessRunner : public ProcessRunner {
 public:
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv) override;
  std::optional<std::string> Poll(pid_t pid) override;
  void Signal(pid_t pid, int signo) override;
};

// Whether `pid` is `root` or one of its descendants, by the parent links in
// `proc` (/proc/<pid>/stat's fourth field). A process gone, or a chain that
// ends at init first, is not in the tree. An XID's process (the kernel log
// names it) in the tree of the server the agent runs is that server's work.
bool InProcessTree(pid_t root, pid_t pid, const std::string& proc = "/proc");

// Whether a process named `comm` (/proc/<pid>/comm, as the kernel keeps it:
// at most 15 characters) runs, in `proc`.
bool ProcessRuns(const std::string& comm, const std::string& proc = "/proc");

}  // namespace gpuha::agent
