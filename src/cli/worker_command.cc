#include "cli/worker_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/log.h"
#include "common/net_util.h"

namespace gpuha::cli {

WorkerCommand::WorkerCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "worker",
      "Reference inference server: KServe v2 HTTP with the built-in 'cv' model, and OpenAI "
      "completions (SSE streaming) with the built-in language model 'gpuha-tiny'");
  app_->add_option("--listen", listen_, "HOST:PORT to serve on (port 0: any free port)")
      ->capture_default_str();
  app_->add_option("--grpc-listen", grpc_listen_,
                   "HOST:PORT to serve KServe v2 gRPC on, as Triton's 8001 (port 0: any free "
                   "port; empty: none)");
  app_->add_option("--node", o_.node, "Node name, returned in X-Gpuha-Node");
  app_->add_option("--latency", latency_ms_, "Modelled GPU time per inference, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  app_->add_option("--ttft", ttft_ms_, "The language model's time to first token, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  app_->add_option("--token-latency", token_latency_ms_,
                   "The language model's time between tokens, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  app_->add_option("--capacity", o_.capacity, "Concurrent inferences accepted; more get 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app_->add_option("--threads", o_.threads, "Event loops")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app_->add_option("--fault", fault_,
                   "A fault from the start: none, stuck, errors, slow[:FACTOR], cut (also POST "
                   "/v1/fault?mode=...)");
  app_->add_option("--engine-metrics", o_.engine_metrics,
                   "Which engine's families /metrics exports: both (Triton's nv_* and vLLM's "
                   "vllm:*) or vllm (vLLM's alone, as a vLLM server: its failures are told "
                   "only by http_requests_total)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, worker::EngineMetrics>{
          {"both", worker::EngineMetrics::kBoth}, {"vllm", worker::EngineMetrics::kVllm}}))
      ->default_str("both");
  app_->add_flag("--strict-fields", o_.strict_fields,
                 "The LLM endpoints refuse fields that are not OpenAI's (400), as OpenAI's own "
                 "API does");
  app_->add_option("--max-body-bytes", o_.max_body_bytes, "Largest request body")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 32));
  app_->add_flag("--train", train_,
                 "Run the deterministic training job instead of serving: resumes from the "
                 "latest complete checkpoint in --checkpoint-dir, prints its final state as JSON");
  train_flags_ = {
      app_->add_option("--checkpoint-dir", train_options_.checkpoint_dir,
                       "Shared checkpoint directory (SAN or NFS mount), fenced by epoch"),
      app_->add_option("--epoch", train_options_.epoch,
                       "This placement's epoch; a later one claiming the directory fences this one")
          ->capture_default_str()
          ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 62)),
      app_->add_option("--steps", train_options_.steps, "Steps until the job is done")
          ->capture_default_str()
          ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 62)),
      app_->add_option("--checkpoint-every", train_options_.checkpoint_every,
                       "Steps between checkpoints")
          ->capture_default_str()
          ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 62)),
      app_->add_option("--progress-file", progress_file_,
                       "A local file that holds the step reached, rewritten after each step "
                       "(the agent reads it: {progress_file} in a job's command)"),
      app_->add_option("--step-ms", step_ms_, "Modelled GPU time per step, ms")
          ->capture_default_str()
          ->check(CLI::Range(0, 600000)),
  };
  app_->footer(
      "Examples:\n"
      "  gpuha worker --listen 127.0.0.1:8101 --node gpu-1\n"
      "  gpuha worker --train --checkpoint-dir /mnt/san/job-1 --epoch 3 --steps 5000");
}

int WorkerCommand::RunTrainer() {
  if (train_options_.checkpoint_dir.empty()) {
    spdlog::error("worker: --checkpoint-dir: required with --train");
    return kExitBadInput;
  }
  train_options_.step_time = std::chrono::milliseconds(step_ms_);
  int progress_fd = -1;
  if (!progress_file_.empty()) {
    progress_fd = ::open(progress_file_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (progress_fd < 0) {
      spdlog::error("worker: --progress-file: {}: {}", progress_file_, std::strerror(errno));
      return kExitBadInput;
    }
  }
  StopSignals signals;
  std::atomic<bool> stop{false};
  absl::StatusOr<worker::TrainResult> result;
  std::atomic<bool> finished{false};
  std::thread job([&] {
    result = worker::Train(train_options_, &stop, [progress_fd](uint64_t step, bool checkpointed) {
      if (checkpointed) spdlog::info("worker: checkpoint at step {}", step);
      if (progress_fd >= 0) {
        // Fixed width, written in place: a reader never sees a shorter
        // number with an old tail.
        char line[24];
        int len =
            std::snprintf(line, sizeof line, "%20llu\n", static_cast<unsigned long long>(step));
        if (::pwrite(progress_fd, line, static_cast<size_t>(len), 0) != len) {
          spdlog::warn("worker: --progress-file: {}", std::strerror(errno));
        }
      }
    });
    finished = true;
  });
  // SIGTERM (a planned move) checkpoints the step reached, then exits.
  while (!finished) {
    if (int signo = signals.WaitFor(50); signo != 0 && !stop) {
      spdlog::info("worker: signal {}: checkpointing and stopping", signo);
      stop = true;
    }
  }
  job.join();
  if (progress_fd >= 0) ::close(progress_fd);
  if (!result.ok()) {
    spdlog::error("worker: {}", result.status().message());
    switch (result.status().code()) {
      case absl::StatusCode::kInvalidArgument:
        return kExitBadInput;
      case absl::StatusCode::kAborted:             // fenced while it ran
      case absl::StatusCode::kFailedPrecondition:  // replaced before it began
        return kExitFenced;
      default:
        return kExitFailure;
    }
  }
  std::printf(
      "{\"done\":%s,\"step\":%llu,\"resumed_from\":%llu,\"checkpoints\":%llu,\"state\":\"%s\"}\n",
      result->done ? "true" : "false", static_cast<unsigned long long>(result->step),
      static_cast<unsigned long long>(result->resumed_from),
      static_cast<unsigned long long>(result->checkpoints), result->state.c_str());
  std::fflush(stdout);
  return result->done ? kExitOk : kExitStoppedEarly;
}

int WorkerCommand::Run() {
  if (train_) return RunTrainer();
  for (CLI::Option* flag : train_flags_) {
    if (flag->count() > 0) {
      spdlog::error("worker: {}: only with --train", flag->get_name());
      return kExitBadInput;
    }
  }
  StopSignals signals;
  auto hp = common::ParseHostPort(listen_, "--listen");
  if (!hp.ok()) {
    spdlog::error("worker: {}", hp.status().message());
    return kExitBadInput;
  }
  o_.address = hp->host;
  o_.port = hp->port;
  if (!grpc_listen_.empty()) {
    auto g = common::ParseHostPort(grpc_listen_, "--grpc-listen");
    if (!g.ok()) {
      spdlog::error("worker: {}", g.status().message());
      return kExitBadInput;
    }
    if (g->host != hp->host) {
      spdlog::error("worker: --grpc-listen: host '{}' differs from --listen's '{}'", g->host,
                    hp->host);
      return kExitBadInput;
    }
    o_.grpc_port = g->port;
  }
  o_.latency = std::chrono::milliseconds(latency_ms_);
  o_.ttft = std::chrono::milliseconds(ttft_ms_);
  o_.token_latency = std::chrono::milliseconds(token_latency_ms_);
  if (!fault_.empty()) {
    size_t colon = fault_.find(':');
    auto f = worker::ParseWorkerFault(fault_.substr(0, colon),
                                      colon == std::string::npos ? "" : fault_.substr(colon + 1));
    if (!f.ok()) {
      spdlog::error("worker: --fault: {}", f.status().message());
      return kExitBadInput;
    }
    o_.fault = *f;
  }
  auto w = worker::Worker::Start(o_);
  if (!w.ok()) {
    spdlog::error("worker: {}", w.status().message());
    return w.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::printf("gpuha worker %s listening on %s:%u\n", o_.node.empty() ? "-" : o_.node.c_str(),
              o_.address.c_str(), (*w)->port());
  if ((*w)->grpc_port() != 0) {
    std::printf("gpuha worker %s serving gRPC on %s:%u\n", o_.node.empty() ? "-" : o_.node.c_str(),
                o_.address.c_str(), (*w)->grpc_port());
  }
  std::fflush(stdout);
  int signo = signals.Wait();
  spdlog::info("worker: signal {}, stopping", signo);
  (*w)->Stop();
  return kExitOk;
}

}  // namespace gpuha::cli
