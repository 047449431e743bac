#include "worker/worker_grpc.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "worker/model_grpc.h"

namespace gpuha::worker {
namespace {

using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;
using SteadyClock = std::chrono::steady_clock;

class Service final : public inference::GRPCInferenceService::Service {
 public:
  explicit Service(WorkerShared s) : s_(s) {}

  Status ServerLive(ServerContext* ctx, const inference::ServerLiveRequest*,
                    inference::ServerLiveResponse* out) override {
    Tag(ctx);
    out->set_live(true);
    return Status::OK;
  }
  Status ServerReady(ServerContext* ctx, const inference::ServerReadyRequest*,
                     inference::ServerReadyResponse* out) override {
    Tag(ctx);
    out->set_ready(true);
    return Status::OK;
  }
  Status ServerMetadata(ServerContext* ctx, const inference::ServerMetadataRequest*,
                        inference::ServerMetadataResponse* out) override {
    Tag(ctx);
    out->set_name("gpuha-worker");
    out->set_version("2");
    return Status::OK;
  }
  Status ModelReady(ServerContext* ctx, const inference::ModelReadyRequest* r,
                    inference::ModelReadyResponse* out) override {
    Tag(ctx);
    if (Status st = CheckModel(r->name(), r->version()); !st.ok()) return st;
    out->set_ready(true);
    return Status::OK;
  }
  Status ModelMetadata(ServerContext* ctx, const inference::ModelMetadataRequest* r,
                       inference::ModelMetadataResponse* out) override {
    Tag(ctx);
    if (Status st = CheckModel(r->name(), r->version()); !st.ok()) return st;
    ModelMetadataGrpc(out);
    return Status::OK;
  }
  Status ModelInfer(ServerContext* ctx, const inference::ModelInferRequest* r,
                    inference::ModelInferResponse* out) override {
    Tag(ctx);
    return Infer(ctx, *r, out);
  }
  Status ModelStreamInfer(ServerContext* ctx,
                          grpc::ServerReaderWriter<inference::ModelStreamInferResponse,
                                                   inference::ModelInferRequest>* stream) override {
    Tag(ctx);
    inference::ModelInferRequest r;
    while (stream->Read(&r)) {
      inference::ModelStreamInferResponse answer;
      Status st = Infer(ctx, r, answer.mutable_infer_response());
      if (st.error_code() == StatusCode::UNAVAILABLE || ctx->IsCancelled()) return st;  // cut
      if (!st.ok()) {
        answer.clear_infer_response();
        answer.set_error_message(st.error_message());
      }
      if (!stream->Write(answer)) break;
    }
    return Status::OK;
  }

 private:
  void Tag(ServerContext* ctx) const {
    if (!s_.o.node.empty()) ctx->AddInitialMetadata("x-gpuha-node", s_.o.node);
  }
  static Status CheckModel(const std::string& name, const std::string& version) {
    if (name != kModelName) {
      return Status(StatusCode::NOT_FOUND,
                    absl::StrCat("model_name: '", name, "' is not served (", kModelName, ")"));
    }
    if (!version.empty() && version != kModelVersion) {
      return Status(StatusCode::NOT_FOUND, absl::StrCat("model_version: '", version,
                                                        "' is not served (", kModelVersion, ")"));
    }
    return Status::OK;
  }

  Status Infer(ServerContext* ctx, const inference::ModelInferRequest& r,
               inference::ModelInferResponse* out) {
    const auto started = SteadyClock::now();
    WorkerCounters& c = s_.counters;
    // A model not served is counted nowhere, as in Triton.
    if (Status st = CheckModel(r.model_name(), r.model_version()); !st.ok()) return st;
    if (c.in_service.fetch_add(1) >= s_.o.capacity) {
      c.in_service.fetch_sub(1);
      c.at_capacity++;
      c.failure_rejected++;
      // gRPC's 503: UNAVAILABLE, which clients and proxies may retry.
      return Status(StatusCode::UNAVAILABLE,
                    absl::StrCat("worker at capacity (", s_.o.capacity, " requests in service)"));
    }
    struct Release {
      std::atomic<int64_t>& n;
      ~Release() { n.fetch_sub(1); }
    } release{c.in_service};
    absl::StatusOr<InferRequest> in = FromGrpc(r);
    absl::StatusOr<CvResult> result = in.ok() ? RunCv(*in) : in.status();
    if (!result.ok()) {
      c.failure_other++;
      return Status(StatusCode::INVALID_ARGUMENT, std::string(result.status().message()));
    }
    if (s_.fault_mode.load() == FaultMode::kErrors) {
      c.failure_backend++;
      return Status(StatusCode::INTERNAL,
                    "inference failed: CUDA error: an illegal memory access was encountered "
                    "(worker fault 'errors')");
    }
    // Stuck: the request waits, accepted and pending, until the fault is
    // cleared or its caller gives up; nothing executes meanwhile.
    while (s_.fault_mode.load() == FaultMode::kStuck) {
      if (ctx->IsCancelled()) {
        c.failure_canceled++;
        return Status(StatusCode::CANCELLED, "cancelled while the worker was stuck");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (s_.fault_mode.load() == FaultMode::kCut) {
      c.failure_backend++;
      return Status(StatusCode::UNAVAILABLE, "the engine died mid-answer (worker fault 'cut')");
    }
    c.executions++;
    auto gpu_time = s_.o.latency;
    if (s_.fault_mode.load() == FaultMode::kSlow) {
      gpu_time =
          std::chrono::duration_cast<std::chrono::milliseconds>(gpu_time * s_.slow_factor.load());
    }
    std::this_thread::sleep_for(gpu_time);
    ToGrpc(r.id(), *result, out);
    // The node in each answer too: a stream's initial metadata names only
    // the server it began on, and a router may move it mid-stream.
    if (!s_.o.node.empty()) {
      (*out->mutable_parameters())[std::string(kNodeParameter)].set_string_param(s_.o.node);
    }
    c.success++;
    c.inferences++;
    c.duration_us += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - started)
            .count());
    return Status::OK;
  }

  WorkerShared s_;
};

}  // namespace

struct GrpcWorker::Impl {
  explicit Impl(WorkerShared s) : service(s) {}
  Service service;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::unique_ptr<GrpcWorker>> GrpcWorker::Start(WorkerShared shared, uint16_t port) {
  std::unique_ptr<GrpcWorker> w(new GrpcWorker());
  w->impl_ = std::make_unique<Impl>(shared);
  grpc::ServerBuilder b;
  int bound = 0;
  std::string at = absl::StrCat(shared.o.address.find(':') != std::string::npos
                                    ? absl::StrCat("[", shared.o.address, "]")
                                    : shared.o.address,
                                ":", port);
  b.AddListeningPort(at, grpc::InsecureServerCredentials(), &bound);
  b.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<size_t>(shared.o.max_body_bytes, INT32_MAX)));
  // No port reuse: a second worker on the same port must fail, not share it.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.RegisterService(&w->impl_->service);
  w->impl_->server = b.BuildAndStart();
  if (!w->impl_->server || bound == 0) {
    return absl::UnavailableError(absl::StrCat("--grpc-listen: cannot listen on ", at));
  }
  w->port_ = static_cast<uint16_t>(bound);
  return w;
}

void GrpcWorker::Stop() {
  if (impl_ && impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  }
}

GrpcWorker::~GrpcWorker() {
  Stop();
  if (impl_ && impl_->server) impl_->server->Wait();
}

}  // namespace gpuha::worker
