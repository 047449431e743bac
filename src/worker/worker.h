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
//
// `latency` models GPU time: an answer leaves that long after its request
// was checked (a test may ask for more with ?delay_ms=N, as the benchmarks'
// legitimately slow requests do). `capacity` bounds the requests in service;
// one more gets 503 with Retry-After. Bad tensors get 400 with the reason and
// unknown models 404, as JSON {"error": "..."}, as Triton answers. Every
// answer carries X-Gpuha-Node, so a client can tell which node served it.
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

struct WorkerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 8000;  // Triton's HTTP port; 0 picks a free one
  int threads = 1;
  std::string node;  // sent back in X-Gpuha-Node
  std::chrono::milliseconds latency{5};
  int capacity = 64;
  size_t max_body_bytes = 64 << 20;
};

struct WorkerCounters {
  std::atomic<uint64_t> success{0};
  std::atomic<uint64_t> failure{0};      // 4xx on infer
  std::atomic<uint64_t> at_capacity{0};  // 503
  std::atomic<uint64_t> duration_us{0};  // request to answer, successes
  std::atomic<int64_t> in_service{0};
};

class Worker {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> Start(WorkerOptions o);
  ~Worker();
  void Stop();
  uint16_t port() const { return server_->port(); }
  const WorkerCounters& counters() const;

  struct Impl;

 private:
  Worker() = default;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<common::LoopServer> server_;  // stopped before impl_ goes
};

}  // namespace gpuha::worker
