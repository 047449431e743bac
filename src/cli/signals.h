// Daemon shutdown for the long-running subcommands: block SIGINT and SIGTERM
// before any thread starts (threads inherit the mask), then wait for one on
// the main thread.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace gpuha::cli {

class StopSignals {
 public:
  // `reload`: SIGHUP is also caught, and Wait() returns it.
  explicit StopSignals(bool reload = false) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    if (reload) sigaddset(&set_, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // Blocks until a caught signal arrives; returns which.
  int Wait() {
    int signo = 0;
    sigwait(&set_, &signo);
    return signo;
  }
  // As Wait, for at most `ms` milliseconds; 0 when none came.
  int WaitFor(long ms) {
    timespec t{ms / 1000, (ms % 1000) * 1000 * 1000};
    int signo = sigtimedwait(&set_, nullptr, &t);
    return signo > 0 ? signo : 0;
  }

 private:
  sigset_t set_;
};

}  // namespace gpuha::cli
