// gpuha-test-backend: TestBackend as a process, so tests and benchmarks can
// kill -9 or SIGSTOP an upstream.
//   gpuha-test-backend --name a --port 0 --threads 1
// Prints "backend NAME listening on 127.0.0.1:PORT" and serves until SIGTERM.
// SIGUSR1 half-hangs it (health answers, inference waits); SIGUSR2 ends that.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "router/testing/test_backend.h"

int main(int argc, char** argv) {
  gpuha::router::testing::TestBackend::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--name") {
      o.name = argv[i + 1];
    } else if (k == "--port") {
      o.port = static_cast<uint16_t>(std::atoi(argv[i + 1]));
    } else if (k == "--threads") {
      o.threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto b = gpuha::router::testing::TestBackend::Start(o);
  if (!b.ok()) {
    std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
    return 1;
  }
  std::printf("backend %s listening on 127.0.0.1:%u\n", o.name.c_str(), (*b)->port());
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&set, &sig) == 0 && (sig == SIGUSR1 || sig == SIGUSR2)) {
    (*b)->SetStuck(sig == SIGUSR1);
  }
  (*b)->Stop();
  return 0;
}
