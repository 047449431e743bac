// A ProcessRunner whose processes live until the test ends them, for the
// supervisor, job and remediation tests.
#pragma once

#include <signal.h>

#include <map>
#include <string>
#include <vector>

#include "agent/process.h"

namespace gpuha::agent::testing {

// Processes that live until the test ends them.
class FakeProcessRunner : public ProcessRunner {
 public:
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv) override {
    if (fail_spawn) return absl::FailedPreconditionError("cannot run '" + argv[0] + "'");
    ++spawns;
    last_argv = argv;
    alive[++last_pid] = true;
    return last_pid;
  }
  std::optional<std::string> Poll(pid_t pid) override {
    if (alive[pid]) return std::nullopt;
    return exit_text;
  }
  void Signal(pid_t pid, int signo) override {
    signals.push_back(signo);
    if (signo == SIGKILL || (signo == SIGTERM && dies_on_term)) alive[pid] = false;
  }
  void Crash(pid_t pid) { alive[pid] = false; }

  std::map<pid_t, bool> alive;
  pid_t last_pid = 100;
  int spawns = 0;
  bool fail_spawn = false;
  bool dies_on_term = true;
  std::string exit_text = "exit 1";
  std::vector<int> signals;
  std::vector<std::string> last_argv;
};

}  // namespace gpuha::agent::testing
