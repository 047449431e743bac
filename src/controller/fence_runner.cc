#include "controller/fence_runner.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"

namespace gpuha::controller {

absl::Status ShellFenceRunner::Run(const std::string& command, common::Duration timeout) {
  // Not tied to the controller's life: a power-off under way must finish.
  absl::StatusOr<pid_t> pid =
      common::SpawnProcess({"/bin/sh", "-c", command}, "", /*die_with_parent=*/false);
  if (!pid.ok()) {
    return absl::Status(pid.status().code(),
                        absl::StrCat("fence hook '", command, "': ", pid.status().message()));
  }
  // The hook is a session leader (SpawnProcess calls setsid), so -pid is its
  // whole process group: a timeout kills what it started too.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(*pid, &status, WNOHANG);
    if (r == *pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
      return absl::InternalError(absl::StrCat(
          "fence hook '", command, "' failed (", WIFEXITED(status) ? "exit " : "signal ",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), ")"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-*pid, SIGKILL);
      ::waitpid(*pid, nullptr, 0);
      return absl::DeadlineExceededError(absl::StrCat("fence hook '", command, "' timed out after ",
                                                      common::ToMillis(timeout), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace gpuha::controller
