#include "worker/worker_grpc.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "worker/model_grpc.h"
#include "worker/worker.h"

namespace gpuha::worker {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> Image(int64_t h, int64_t w, uint8_t seed) {
  std::vector<uint8_t> v(static_cast<size_t>(h * w * 3));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
  return v;
}

class WorkerGrpcTest : public ::testing::Test {
 protected:
  void Start(WorkerFault fault = {}, int capacity = 64) {
    WorkerOptions o;
    o.port = 0;
    o.grpc_port = 0;
    o.latency = milliseconds(1);
    o.capacity = capacity;
    o.node = "n1";
    o.fault = fault;
    auto w = Worker::Start(o);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
    ASSERT_NE(worker_->grpc_port(), 0);
    stub_ = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(worker_->grpc_port()), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> Context(milliseconds deadline = milliseconds(5000)) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + deadline);
    return c;
  }
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(WorkerGrpcTest, InfersTheCvModelAsHttpDoesAndTagsTheNode) {
  Start();
  auto img = Image(8, 6, 1);
  auto prev = Image(8, 6, 9);
  inference::ModelInferRequest req = MakeGrpcInferRequest("r1", img, &prev, 8, 6);
  inference::ModelInferResponse resp;
  auto ctx = Context();
  grpc::Status st = stub_->ModelInfer(ctx.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.id(), "r1");
  EXPECT_EQ(resp.model_name(), "cv");
  absl::StatusOr<CvResult> got = FromGrpc(resp);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, ComputeCv(img.data(), prev.data(), 8, 6, 3));
  auto node = ctx->GetServerInitialMetadata().find("x-gpuha-node");
  ASSERT_NE(node, ctx->GetServerInitialMetadata().end());
  EXPECT_EQ(std::string(node->second.data(), node->second.size()), "n1");
  EXPECT_EQ(worker_->counters().success.load(), 1u);

  // The same tensors as contents.uint_contents.
  inference::ModelInferRequest slow = req;
  slow.clear_raw_input_contents();
  for (int i = 0; i < 2; ++i) {
    for (uint8_t b : i == 0 ? img : prev) {
      slow.mutable_inputs(i)->mutable_contents()->add_uint_contents(b);
    }
  }
  inference::ModelInferResponse resp2;
  ctx = Context();
  ASSERT_TRUE(stub_->ModelInfer(ctx.get(), slow, &resp2).ok());
  EXPECT_EQ(*FromGrpc(resp2), *got);
}

TEST_F(WorkerGrpcTest, HealthAndMetadataAnswer) {
  Start();
  inference::ServerLiveResponse live;
  auto ctx = Context();
  ASSERT_TRUE(stub_->ServerLive(ctx.get(), {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ModelReadyRequest mr;
  mr.set_name("cv");
  inference::ModelReadyResponse ready;
  ctx = Context();
  ASSERT_TRUE(stub_->ModelReady(ctx.get(), mr, &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ModelMetadataRequest mm;
  mm.set_name("cv");
  inference::ModelMetadataResponse meta;
  ctx = Context();
  ASSERT_TRUE(stub_->ModelMetadata(ctx.get(), mm, &meta).ok());
  ASSERT_EQ(meta.inputs_size(), 2);
  EXPECT_EQ(meta.inputs(0).name(), "IMAGE");
  EXPECT_EQ(meta.outputs_size(), 3);
  mm.set_name("resnet");
  ctx = Context();
  grpc::Status st = stub_->ModelMetadata(ctx.get(), mm, &meta);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("model_name: 'resnet'"), std::string::npos)
      << st.error_message();
}

TEST_F(WorkerGrpcTest, BadTensorsAreInvalidArgumentNamingTheInput) {
  Start();
  auto img = Image(4, 4, 1);
  struct Case {
    std::function<void(inference::ModelInferRequest&)> spoil;
    std::string says;
  };
  std::vector<Case> cases = {
      {[](auto& r) { r.mutable_raw_input_contents(0)->pop_back(); },
       "input 'IMAGE': unexpected byte size 47"},
      {[](auto& r) { r.mutable_inputs(0)->set_datatype("FP32"); },
       "input 'IMAGE': datatype FP32 is not supported"},
      {[](auto& r) { r.mutable_inputs(0)->set_shape(0, -3); },
       "input 'IMAGE': shape dimension -3 is not valid"},
      {[](auto& r) { r.add_raw_input_contents("x"); },
       "raw_input_contents: 2 entries for 1 inputs"},
      {[](auto& r) {
         r.clear_inputs();
         r.clear_raw_input_contents();
       },
       "inputs: at least one is required"},
      {[](auto& r) {
         r.clear_raw_input_contents();
         r.mutable_inputs(0)->clear_shape();
         r.mutable_inputs(0)->add_shape(1);
         r.mutable_inputs(0)->mutable_contents()->add_uint_contents(300);
       },
       "input 'IMAGE': element 300 is not a UINT8"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest req = MakeGrpcInferRequest("r", img, nullptr, 4, 4);
    c.spoil(req);
    inference::ModelInferResponse resp;
    auto ctx = Context();
    grpc::Status st = stub_->ModelInfer(ctx.get(), req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.says;
    EXPECT_NE(st.error_message().find(c.says), std::string::npos) << st.error_message();
  }
  EXPECT_EQ(worker_->counters().failure_other.load(), cases.size());
  EXPECT_EQ(worker_->counters().failure_backend.load(), 0u);
}

TEST_F(WorkerGrpcTest, StuckHoldsInferencesWhileHealthAnswers) {
  Start({FaultMode::kStuck, 1}, /*capacity=*/1);
  inference::ServerReadyResponse ready;
  auto ctx = Context();
  ASSERT_TRUE(stub_->ServerReady(ctx.get(), {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  auto img = Image(4, 4, 1);
  std::thread held([&] {
    inference::ModelInferResponse resp;
    auto c = Context(milliseconds(400));
    grpc::Status st =
        stub_->ModelInfer(c.get(), MakeGrpcInferRequest("r", img, nullptr, 4, 4), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  });
  // The stuck call holds the worker's one place: the next is refused as
  // HTTP's 503 would be, UNAVAILABLE.
  while (worker_->counters().in_service.load() == 0) std::this_thread::sleep_for(milliseconds(5));
  inference::ModelInferResponse resp;
  ctx = Context();
  grpc::Status st =
      stub_->ModelInfer(ctx.get(), MakeGrpcInferRequest("r2", img, nullptr, 4, 4), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("worker at capacity (1 requests in service)"),
            std::string::npos)
      << st.error_message();
  held.join();
  EXPECT_EQ(worker_->counters().executions.load(), 0u);
}

TEST_F(WorkerGrpcTest, ErrorsFaultIsInternal) {
  Start({FaultMode::kErrors, 1});
  auto img = Image(4, 4, 1);
  inference::ModelInferResponse resp;
  auto ctx = Context();
  grpc::Status st =
      stub_->ModelInfer(ctx.get(), MakeGrpcInferRequest("r", img, nullptr, 4, 4), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(st.error_message().find("worker fault 'errors'"), std::string::npos);
}

TEST_F(WorkerGrpcTest, StreamAnswersEveryRequestInOrder) {
  Start();
  auto ctx = Context();
  auto stream = stub_->ModelStreamInfer(ctx.get());
  std::vector<std::vector<uint8_t>> images;
  for (int i = 0; i < 5; ++i) {
    images.push_back(Image(4, 5, static_cast<uint8_t>(i)));
    auto req = MakeGrpcInferRequest("s" + std::to_string(i), images.back(), nullptr, 4, 5);
    if (i == 2) req.mutable_inputs(0)->set_datatype("INT8");  // one bad frame
    ASSERT_TRUE(stream->Write(req));
  }
  stream->WritesDone();
  inference::ModelStreamInferResponse r;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(stream->Read(&r)) << i;
    if (i == 2) {
      EXPECT_NE(r.error_message().find("datatype INT8"), std::string::npos) << r.error_message();
      continue;
    }
    EXPECT_EQ(r.error_message(), "");
    EXPECT_EQ(r.infer_response().id(), "s" + std::to_string(i));
    EXPECT_EQ(*FromGrpc(r.infer_response()), ComputeCv(images[i].data(), nullptr, 4, 5, 3));
  }
  EXPECT_FALSE(stream->Read(&r));
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace gpuha::worker
