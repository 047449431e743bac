// ChildProcess: starts a real binary for an end-to-end test, captures its
// stdout lines and stderr, and makes sure it is gone when the test ends.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gpuha::e2e {

class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    int out[2], err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::setpgid(0, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::close(out[0]);
      ::close(err[0]);
      for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    readers_.emplace_back([this, fd = out[0]] { Pump(fd, &out_); });
    readers_.emplace_back([this, fd = err[0]] { Pump(fd, &err_); });
  }
  ~ChildProcess() {
    Signal(SIGKILL);
    Wait(std::chrono::milliseconds(5000));
    for (std::thread& t : readers_) t.join();
  }

  pid_t pid() const { return pid_; }
  void Signal(int signo) {
    if (pid_ > 0 && !exit_code_) ::kill(pid_, signo);
  }
  // The exit status (128+signal when killed), or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exit_code_) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        // What it wrote just before it ended may still be in the pipes:
        // out() and err() have it once the readers reach the end (bounded,
        // since a child it left behind may hold the pipes open).
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(2), [&] { return pipes_closed_ == 2; });
        break;
      }
      if (r < 0 || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return exit_code_;
  }
  // Waits for a stdout line containing `marker`; returns the rest of that line.
  std::optional<std::string> WaitForLine(const std::string& marker,
                                         std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    size_t seen = 0;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      size_t pos;
      while ((pos = out_.find('\n', seen)) != std::string::npos) {
        std::string line = out_.substr(seen, pos - seen);
        seen = pos + 1;
        size_t at = line.find(marker);
        if (at != std::string::npos) return line.substr(at + marker.size());
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }
  std::string err() {
    std::lock_guard<std::mutex> lock(mu_);
    return err_;
  }
  std::string out() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }

 private:
  void Pump(int fd, std::string* sink) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      sink->append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
    ::close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    ++pipes_closed_;
    cv_.notify_all();
  }

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::vector<std::thread> readers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_, err_;
  int pipes_closed_ = 0;  // readers that reached the end of their pipe
};

}  // namespace gpuha::e2e
