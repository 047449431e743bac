// `gpuha worker`: the reference KServe v2 inference server (worker/worker.h),
// or with --train the deterministic training job (worker/trainer.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "worker/trainer.h"
#include "worker/worker.h"

namespace gpuha::cli {

class WorkerCommand {
 public:
  explicit WorkerCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  int RunTrainer();

  CLI::App* app_;
  worker::WorkerOptions o_;
  std::string listen_ = "127.0.0.1:8000";
  std::string grpc_listen_;  // empty: no gRPC
  std::string fault_;
  int latency_ms_ = 5;
  int ttft_ms_ = 50;
  int token_latency_ms_ = 20;
  bool train_ = false;
  worker::TrainOptions train_options_;
  int step_ms_ = 10;
  std::string progress_file_;              // the step reached, rewritten after each step
  std::vector<CLI::Option*> train_flags_;  // valid with --train only
};

}  // namespace gpuha::cli
