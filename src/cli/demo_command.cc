#include "cli/demo_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/file_util.h"
#include "common/log.h"

namespace gpuha::cli {

DemoCommand::DemoCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "demo", "The whole system on loopback: 4 simulated GPU nodes, load, faults, timelines");
  faults_ = absl::StrJoin(demo::kDefaultFaults, ",");
  app_->add_option("--faults", faults_,
                   absl::StrCat("Faults to inject, in order, comma-separated, from: ",
                                absl::StrJoin(demo::FaultNames(), ", ")))
      ->capture_default_str();
  app_->add_option("--streams", o_.streams, "Camera streams admitted")
      ->capture_default_str()
      ->check(CLI::Range(1, 30));
  app_->add_option("--rate", o_.rate, "Requests/s through the router")
      ->capture_default_str()
      ->check(CLI::Range(10.0, 5000.0));
  app_->add_option("--llm-streams", o_.llm_streams,
                   "LLM token streams kept open beside the KServe load (streamed completions, "
                   "every answer checked whole); 0: none")
      ->capture_default_str()
      ->check(CLI::Range(0, 200));
  app_->add_option("--llm-model", o_.llm_model,
                   "The LLM streams' model: gpuha-tiny-bpe is the tokenizer model, whose answers "
                   "are continued on their token IDs and checked token for token")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpuha-tiny", "gpuha-tiny-bpe"}));
  app_->add_flag("--llm-mixed", o_.llm_mixed,
                 "Every other LLM answer a chat, every other pair seeded (temperature 0.7)");
  app_->add_flag("--llm-structured", o_.llm_structured,
                 "Every fourth LLM answer held to a JSON schema: whole, a document of it; cut, "
                 "ended by the router's error event (counted as failed, named so)");
  app_->add_option("--grpc-streams", o_.grpc_streams,
                   "Streams that also carry KServe v2 gRPC: unary ModelInfer calls and a "
                   "ModelStreamInfer call each, at an eighth of --rate each, every answer "
                   "checked; 0: none")
      ->capture_default_str()
      ->check(CLI::Range(0, 200));
  app_->add_option("--routers", o_.routers,
                   "Routers serving the same routes; the demo's clients keep the list and go "
                   "on to the next when one refuses or dies (faults router-restart, router-kill)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4));
  app_->add_option("--latency", o_.latency_ms, "Workers' modelled GPU time, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app_->add_option("--observe-ms", o_.observe_ms, "How long each fault is watched before repair")
      ->capture_default_str()
      ->check(CLI::Range(500, 60000));
  app_->add_option("--slow-fraction", o_.slow_fraction,
                   "Share of requests with 1.5 s of GPU time: legitimately slow work that no "
                   "failover may cut")
      ->check(CLI::Range(0.0, 0.5));
  app_->add_flag("--keep", o_.keep, "Leave the cluster running after the faults (Ctrl-C stops it)");
  app_->add_option("--node", o_.target,
                   "The node every fault hits (default: the busiest each time)")
      ->check(CLI::IsMember({"gpu-1", "gpu-2", "gpu-3", "gpu-4"}));
  app_->add_option("--max-failures", o_.max_failures,
                   "Failures within 10 min before the controller holds a node out")
      ->check(CLI::Range(1, 1000));
  app_->add_flag("--ha", o_.ha,
                 absl::StrCat("Three controllers on a three-member etcd cluster (etcd-server); "
                              "the faults then default to ",
                              absl::StrJoin(demo::kHaFaults, ",")));
  app_->add_flag("--watched-servers", o_.watched_servers,
                 "Workers run beside the agents (as an inference pod beside the agent's "
                 "DaemonSet pod), which watch them and fence them by readiness, instead of "
                 "each agent supervising its worker");
  app_->add_option("--engine-metrics", o_.engine_metrics,
                   "Which engine's metrics the workers export: both (Triton's and vLLM's) or "
                   "vllm (vLLM's alone, as a vLLM server: an errors-only server is then told "
                   "by its http_requests_total)")
      ->check(CLI::IsMember({"both", "vllm"}))
      ->capture_default_str();
  app_->add_flag("--train", o_.train,
                 absl::StrCat("A training job beside the streams (gpuha worker --train, "
                              "checkpoints in the demo's folder); the faults then default to ",
                              absl::StrJoin(demo::kTrainFaults, ",")));
  app_->add_option("--gpus-per-node", o_.gpus_per_node,
                   absl::StrCat("Simulated GPUs per node (default 1); 2 or more runs a worker per "
                                "GPU, each GPU placed alone; the faults then default to ",
                                absl::StrJoin(demo::kGpuFaults, ",")))
      ->check(CLI::Range(1, 8));
  app_->add_option("--mig-per-gpu", o_.mig_per_gpu,
                   absl::StrCat("MIG instances per simulated GPU (default 0, off); 1 or more runs "
                                "a worker per instance, each placed alone; the faults then "
                                "default to ",
                                absl::StrJoin(demo::kMigFaults, ",")))
      ->check(CLI::Range(0, 7));
  app_->add_option("--json", json_path_, "Also write the report as JSON here");
  app_->add_option("--workdir", o_.workdir, "Folder for configs, logs and the store (kept)");
}

int DemoCommand::Run() {
  if (o_.ha && app_->count("--faults") == 0) faults_ = absl::StrJoin(demo::kHaFaults, ",");
  if (o_.train && !o_.ha && app_->count("--faults") == 0) {
    faults_ = absl::StrJoin(demo::kTrainFaults, ",");
  }
  if (o_.gpus_per_node > 1 && !o_.ha && !o_.train && app_->count("--faults") == 0) {
    faults_ = absl::StrJoin(demo::kGpuFaults, ",");
  }
  if (o_.mig_per_gpu > 0 && !o_.ha && !o_.train && app_->count("--faults") == 0) {
    faults_ = absl::StrJoin(demo::kMigFaults, ",");
  }
  std::vector<std::string> faults = absl::StrSplit(faults_, ',', absl::SkipWhitespace());
  o_.faults = faults;
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    spdlog::error("demo: cannot find this binary (/proc/self/exe)");
    return kExitFailure;
  }
  o_.exe.assign(exe, static_cast<size_t>(n));
  // Ctrl-C and SIGTERM stop the demo and every process it started. They are
  // blocked here (threads inherit the mask; children get a clean one) and
  // taken by one watcher thread.
  StopSignals signals;
  std::atomic<bool> stop{false}, done{false};
  std::thread watcher([&] {
    while (!done) {
      if (signals.WaitFor(100) != 0) {
        std::cerr << "\ngpuha demo: stopping every process it started...\n";
        stop = true;
      }
    }
  });
  o_.stop = &stop;
  auto report = demo::RunDemo(o_, std::cout);
  done = true;
  watcher.join();
  if (!report.ok()) {
    spdlog::error("demo: {}", report.status().message());
    return report.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                        : kExitFailure;
  }
  if (!json_path_.empty()) {
    if (absl::Status s = common::WriteFileAtomic(json_path_, report->Json() + "\n"); !s.ok()) {
      spdlog::error("demo: {}", s.message());
      return kExitFailure;
    }
  }
  if (stop) return 130;
  // A training job that did not end in the state of an uninterrupted run,
  // or whose end could not be read, fails the demo as a lost request does.
  return report->Lost() == 0 && report->train_exact.value_or(!o_.train) ? kExitOk : kExitFailure;
}

}  // namespace gpuha::cli
