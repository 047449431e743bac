#include "agent/process.h"

#include <signal.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"

namespace gpuha::agent {

absl::StatusOr<pid_t> RealProcessRunner::Spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("server.command is empty");
  return common::SpawnProcess(argv);
}

std::optional<std::string> RealProcessRunner::Poll(pid_t pid) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return std::string("gone");
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return std::string("ended");
}

void RealProcessRunner::Signal(pid_t pid, int signo) {
  if (pid > 0) ::kill(-pid, signo);
}

}  // namespace gpuha::agent
