#include "agent/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpuha::agent {

absl::StatusOr<pid_t> RealProcessRunner::Spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("server.command is empty");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Report exec failure through a close-on-exec pipe: EOF means exec worked.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execvp(args[0], args.data());
    int err = errno;
    (void)!::write(fds[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::close(fds[1]);
  int err = 0;
  ssize_t n = ::read(fds[0], &err, sizeof(err));
  ::close(fds[0]);
  if (n == sizeof(err)) {
    ::waitpid(pid, nullptr, 0);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run '", argv[0], "': ", std::strerror(err)));
  }
  return pid;
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
