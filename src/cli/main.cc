// gpuha: one binary, one subcommand per component (like etcd or consul).
// main only parses the command line and hands over to a subcommand.
#include <spdlog/sinks/stdout_color_sinks.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "cli/agent_command.h"
#include "cli/completion_command.h"
#include "cli/controller_command.h"
#include "cli/ctl_command.h"
#include "cli/demo_command.h"
#include "cli/doctor_command.h"
#include "cli/load_command.h"
#include "cli/plan_command.h"
#include "cli/router_command.h"
#include "cli/sim_command.h"
#include "cli/worker_command.h"
#include "common/log.h"

#ifndef GPUHA_VERSION
#define GPUHA_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  CLI::App app{"gpuha keeps GPU inference serving while GPUs, nodes and links fail."};
  app.set_version_flag("--version", GPUHA_VERSION);
  app.require_subcommand(1);
  // Debian's abseil ships with mutex deadlock detection on, and gRPC takes an
  // absl::Mutex on every message: the lock-graph bookkeeping was a visible
  // share of the agent's CPU. gpuha's own locks are std::mutex and unaffected.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gpuha::cli::PlanCommand plan(app);
  gpuha::cli::SimCommand sim(app);
  gpuha::cli::AgentCommand agent(app);
  gpuha::cli::ControllerCommand controller(app);
  gpuha::cli::RouterCommand router(app);
  gpuha::cli::LoadCommand load(app);
  gpuha::cli::WorkerCommand worker(app);
  gpuha::cli::DemoCommand demo(app);
  gpuha::cli::CtlCommand ctl(app);
  gpuha::cli::DoctorCommand doctor(app);
  gpuha::cli::CompletionCommand completion(app);
  // Logs go to stderr; stdout carries reports and machine-read lines.
  spdlog::set_default_logger(spdlog::stderr_color_mt("gpuha"));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; bad flags exit 2.
    int rc = app.exit(e);
    return rc == 0 ? gpuha::cli::kExitOk : gpuha::cli::kExitBadInput;
  }
  if (plan.app()->parsed()) return plan.Run(std::cin, std::cout, std::cerr);
  if (sim.app()->parsed()) return sim.Run(std::cout, std::cerr);
  if (agent.app()->parsed()) return agent.Run();
  if (controller.app()->parsed()) return controller.Run();
  if (router.app()->parsed()) return router.Run();
  if (load.app()->parsed()) return load.Run();
  if (worker.app()->parsed()) return worker.Run();
  if (demo.app()->parsed()) return demo.Run();
  if (ctl.app()->parsed()) return ctl.Run();
  if (doctor.app()->parsed()) return doctor.Run(std::cout, std::cerr);
  if (completion.app()->parsed()) return completion.Run(app);
  return gpuha::cli::kExitBadInput;
}
