#include "agent/process.h"

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

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

bool InProcessTree(pid_t root, pid_t pid, const std::string& proc) {
  if (root <= 0) return false;
  for (int depth = 0; pid > 1 && depth < 64; ++depth) {
    if (pid == root) return true;
    std::ifstream in(absl::StrCat(proc, "/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (!(fields >> state >> ppid)) return false;
    pid = static_cast<pid_t>(ppid);
  }
  return pid == root;
}

bool ProcessRuns(const std::string& comm, const std::string& proc) {
  std::error_code ec;
  const std::string want = comm.substr(0, 15);
  // Not the range-for: its increment throws on an error (a process gone
  // mid-scan is not one, but a /proc that cannot be read is).
  for (std::filesystem::directory_iterator it(proc, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(it->path() / "comm");
    std::string line;
    if (std::getline(in, line) && line == want) return true;
  }
  return false;
}

}  // namespace gpuha::agent
