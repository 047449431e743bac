// The worker's KServe v2 gRPC side (inference.GRPCInferenceService, Triton's
// port 8001 beside HTTP's 8000): ServerLive, ServerReady, ServerMetadata,
// ModelReady, ModelMetadata, ModelInfer and ModelStreamInfer for the "cv"
// model, with the HTTP side's counters, capacity and faults:
//   stuck   an inference waits (pending) until the fault clears or the
//           call is cancelled; health and metadata answer
//   errors  inferences fail INTERNAL (a broken CUDA context)
//   slow    inferences take `factor` times as long
//   cut     inferences fail UNAVAILABLE: grpc++ gives a handler no way to
//           drop its connection, so the crash mid-answer is a status here
// Answers carry x-gpuha-node in their initial metadata. Errors name the
// input or field, as INVALID_ARGUMENT; unknown models are NOT_FOUND, and a
// worker at capacity answers UNAVAILABLE (HTTP's 503, which may be retried).
//
// Thread-safety: grpc++'s synchronous server, a handler per thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/worker.h"

namespace gpuha::worker {

// What the gRPC side shares with the HTTP side (owned by the Worker).
struct WorkerShared {
  const WorkerOptions& o;
  WorkerCounters& counters;
  std::atomic<FaultMode>& fault_mode;
  std::atomic<double>& slow_factor;
};

class GrpcWorker {
 public:
  // Listens on o.address:port (0: any free port).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GrpcWorker>> Start(WorkerShared shared,
                                                                         uint16_t port);
  ~GrpcWorker();
  uint16_t port() const { return port_; }
  void Stop();

  struct Impl;

 private:
  GrpcWorker() = default;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace gpuha::worker
