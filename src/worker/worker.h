// Worker: the reference stateless inference server (`gpuha worker`). It speaks
// the subset of the KServe v2 / Open Inference HTTP protocol that Triton
// speaks, for the built-in "cv" model (worker/model.h):
//
//   GET  /v2                              server metadata
//   GET  /v2/health/live, /v2/health/ready
//   GET  /v2/models/cv[/versions/1]       model metadata
//   GET  /v2/models/cv[/versions/1]/ready
//   POST /v2/models/cv[/versions/1]/infer JSON tensors, or binary tensor data
//   GET  /metrics                         Triton's nv_inference_* counters
//                                         and vLLM's vllm:* families (or
//                                         vLLM's alone: engine_metrics), and
//                                         http_requests_total as vLLM's API
//                                         server counts its answers
//
// and the OpenAI completions protocol, as vLLM serves it, for the built-in
// language model "gpuha-tiny" (worker/llm.h):
//
//   POST /v1/completions, /v1/chat/completions   streaming (SSE) or not
//   GET  /v1/models
//
// A streamed answer sends its status line and head at once, its first token
// `ttft` later and each next one `token_latency` after that, one token per
// SSE chunk, then the usage chunk (stream_options.include_usage) and
// "data: [DONE]".
//
// `latency` models GPU time: an answer leaves that long after its request
// was checked (a test may ask for more with ?delay_ms=N, as the benchmarks'
// legitimately slow requests do). `capacity` bounds the requests in service;
// one more gets 503 with Retry-After. Bad tensors get 400 with the reason and
// unknown models 404, as JSON {"error": "..."}, as Triton answers. Every
// answer carries X-Gpuha-Node, so a client can tell which node served it.
//
// Faults, to reproduce what users of Triton and vLLM see in the field
// (POST /v1/fault?mode=..., GET /v1/fault; or --fault at start):
//   stuck   inference no longer moves while health and metrics answer: each
//           inference waits until the fault is cleared; pending requests
//           grow, nv_inference_exec_count stops (Triton server#3627, a
//           deadlocked vLLM engine core)
//   errors  readiness says 200 and every inference answers 500 (a CUDA
//           context broken by a device-side assert)
//   slow    every inference takes `factor` times as long
//   cut     every answer in progress, and every one begun, stops where it
//           is: the connection closes with no end to the body (what the
//           network sees of an engine that crashed mid-answer)
//   none    clears the fault; stuck inferences then complete
//
// Async (Asio coroutines), one event loop per thread, keep-alive.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/listen.h"

namespace gpuha::worker {

enum class FaultMode { kNone = 0, kStuck, kErrors, kSlow, kCut };
struct WorkerFault {
  FaultMode mode = FaultMode::kNone;
  double factor = 1;  // kSlow
};
// "none", "stuck", "errors", "slow" (factor 1..1000, default 10), "cut"; errors name
// the value.
absl::StatusOr<WorkerFault> ParseWorkerFault(const std::string& mode,
                                             const std::string& factor = "");
const char* FaultModeName(FaultMode m);

// Which engine's families /metrics exports: both Triton's and vLLM's (the
// default), or vLLM's alone, as a vLLM server exports them (no nv_*
// request outcomes: its failures are told only by http_requests_total).
enum class EngineMetrics { kBoth, kVllm };

struct WorkerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 8000;  // Triton's HTTP port; 0 picks a free one
  // KServe v2 gRPC (worker/worker_grpc.h) on `address`, as Triton's 8001:
  // -1 serves none; 0 picks a free port.
  int grpc_port = -1;
  int threads = 1;
  std::string node;  // sent back in X-Gpuha-Node
  std::chrono::milliseconds latency{5};
  std::chrono::milliseconds ttft{50};           // the language model's time to first token
  std::chrono::milliseconds token_latency{20};  // and between tokens
  int capacity = 64;
  size_t max_body_bytes = 64 << 20;
  WorkerFault fault;  // in force from the start
  EngineMetrics engine_metrics = EngineMetrics::kBoth;
  // The LLM endpoints refuse fields that are not OpenAI's (400), as OpenAI's
  // own API and servers whose schema forbids extra fields do.
  bool strict_fields = false;
};

// The worker's counters, declared once: field, /metrics family, whether it
// carries Triton's model labels, and help. Families named nv_* have Triton's
// names and meaning, so a scraper written for Triton reads the worker as is.
#define GPUHA_WORKER_COUNTERS(X)                                                                 \
  X(success, "nv_inference_request_success", true, "Successful inference requests.")             \
  X(inferences, "nv_inference_count", true, "Inferences performed (batch size 1 each).")         \
  X(executions, "nv_inference_exec_count", true, "Model executions run.")                        \
  X(duration_us, "nv_inference_request_duration_us", true,                                       \
    "Cumulative inference request duration, microseconds.")                                      \
  X(at_capacity, "gpuha_worker_rejected_at_capacity_total", false,                               \
    "Requests answered 503 because the worker was at --capacity.")                               \
  X(llm_success, "vllm:request_success_total", false, "Completions answered in full.")           \
  X(prompt_tokens, "vllm:prompt_tokens_total", false, "Prompt tokens processed (prefill done).") \
  X(generation_tokens, "vllm:generation_tokens_total", false, "Tokens generated.")

struct WorkerCounters {
#define GPUHA_FIELD(name, family, model_labels, help) std::atomic<uint64_t> name{0};
  GPUHA_WORKER_COUNTERS(GPUHA_FIELD)
#undef GPUHA_FIELD
  // Triton's nv_inference_request_failure, by its `reason` label: REJECTED
  // (503 at capacity), CANCELED, BACKEND (the engine failed: a CUDA error,
  // an answer cut), OTHER (bad input). A request for a model not served is
  // counted nowhere, as in Triton: there is no model to count it on.
  std::atomic<uint64_t> failure_rejected{0};
  std::atomic<uint64_t> failure_canceled{0};
  std::atomic<uint64_t> failure_backend{0};
  std::atomic<uint64_t> failure_other{0};
  // Inferences accepted and not answered (a gauge: Triton's
  // nv_inference_pending_request_count, and gpuha_worker_in_service).
  std::atomic<int64_t> in_service{0};
  // Completions in service (vLLM's vllm:num_requests_running).
  std::atomic<int64_t> llm_running{0};
  // Inference answers by endpoint and status class, as vLLM's API server
  // (prometheus-fastapi-instrumentator) counts them in
  // http_requests_total{handler, method, status="2xx"|"4xx"|"5xx"}.
  static constexpr const char* kHttpHandlers[] = {"/v1/completions", "/v1/chat/completions",
                                                  "/v2/models/cv/infer"};
  static constexpr const char* kHttpClasses[] = {"2xx", "4xx", "5xx"};
  std::atomic<uint64_t> http_answers[3][3] = {};
  void CountHttpAnswer(size_t handler, int status) {
    if (status >= 200 && status < 600 && status / 100 != 3) {
      http_answers[handler][status < 300 ? 0 : status < 500 ? 1 : 2]++;
    }
  }
};

class GrpcWorker;

class Worker {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> Start(WorkerOptions o);
  ~Worker();
  void Stop();
  uint16_t port() const { return server_->port(); }
  // 0 when no gRPC is served.
  uint16_t grpc_port() const;
  const WorkerCounters& counters() const;

  struct Impl;

 private:
  Worker() = default;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<common::LoopServer> server_;  // stopped before impl_ goes
  std::unique_ptr<GrpcWorker> grpc_;            // likewise
};

}  // namespace gpuha::worker
