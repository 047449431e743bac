#include "cli/worker_command.h"

#include <cstdio>

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
  app_->add_option("--max-body-bytes", o_.max_body_bytes, "Largest request body")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 32));
}

int WorkerCommand::Run() {
  StopSignals signals;
  auto hp = common::ParseHostPort(listen_, "--listen");
  if (!hp.ok()) {
    spdlog::error("worker: {}", hp.status().message());
    return kExitBadInput;
  }
  o_.address = hp->host;
  o_.port = hp->port;
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
  std::fflush(stdout);
  int signo = signals.Wait();
  spdlog::info("worker: signal {}, stopping", signo);
  (*w)->Stop();
  return kExitOk;
}

}  // namespace gpuha::cli
