// Daemon shutdown for the long-running subcommands: block SIGINT and SIGTERM
// before any thread starts (threads inherit the mask), then wait for one on
// the main thread.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace gpuha::cli {

class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // Blocks until SIGINT or SIGTERM arrives; returns which.
  int Wait() {
    int signo = 0;
    sigwait(&set_, &signo);
    return signo;
  }

 private:
  sigset_t set_;
};

}  // namespace gpuha::cli
