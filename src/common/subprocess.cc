#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace gpuha::common {

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const std::string& log_path, bool die_with_parent) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command line");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
    }
  }
  // Report exec failure through a close-on-exec pipe: EOF means exec worked.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    if (log_fd >= 0) ::close(log_fd);
    return absl::InternalError("pipe2 failed");
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (log_fd >= 0) ::close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    // Signals blocked by the parent (daemons block SIGINT/SIGTERM for sigwait)
    // must not stay blocked in the child.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvp(args[0], args.data());
    int err = errno;
    (void)!::write(fds[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::close(fds[1]);
  if (log_fd >= 0) ::close(log_fd);
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

std::vector<pid_t> ChildPids(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

}  // namespace gpuha::common
