#include "worker/worker.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "worker/llm.h"
#include "worker/model.h"

namespace gpuha::worker {
namespace {

using gpuha::testing::Reply;
using gpuha::testing::Send;
using std::chrono::milliseconds;

std::string Post(const std::string& target, const std::string& body,
                 const std::string& extra = "") {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: w\r\nContent-Length: ", body.size(),
                      "\r\n", extra, "\r\n", body);
}
WorkerOptions Options(int latency_ms, int capacity = 64, size_t max_body = 1 << 20) {
  WorkerOptions o;
  o.port = 0;
  o.latency = milliseconds(latency_ms);
  o.capacity = capacity;
  o.max_body_bytes = max_body;
  return o;
}
std::string GetReq(const std::string& target) {
  return "GET " + target + " HTTP/1.1\r\nHost: w\r\n\r\n";
}

class WorkerTest : public ::testing::Test {
 protected:
  void StartWorker(WorkerOptions o) {
    o.port = 0;
    auto w = Worker::Start(o);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
  }
  uint16_t port() const { return worker_->port(); }
  std::unique_ptr<Worker> worker_;
};

TEST_F(WorkerTest, HealthMetadataAndReadiness) {
  WorkerOptions o = Options(0);
  o.node = "gpu-7";
  StartWorker(o);
  for (const char* path : {"/v2/health/live", "/v2/health/ready", "/v2/models/cv/ready",
                           "/v2/models/cv/versions/1/ready"}) {
    Reply r = Send(port(), GetReq(path));
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.headers["X-Gpuha-Node"], "gpu-7") << path;
  }
  Reply meta = Send(port(), GetReq("/v2/models/cv"));
  EXPECT_EQ(meta.status, 200);
  EXPECT_NE(meta.body.find("\"IMAGE\""), std::string::npos);
  Reply server = Send(port(), GetReq("/v2"));
  EXPECT_NE(server.body.find("binary_tensor_data"), std::string::npos);
  Reply unknown = Send(port(), GetReq("/v2/models/resnet/ready"));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("unknown model: 'resnet'"), std::string::npos);
  EXPECT_EQ(Send(port(), GetReq("/v2/models/cv/versions/9")).status, 404);
  EXPECT_EQ(Send(port(), GetReq("/nothing")).status, 404);
  EXPECT_EQ(Send(port(), GetReq("/v2/models/cv/infer")).status, 405);
}

TEST_F(WorkerTest, InferJsonAndBinaryGiveTheModelsAnswer) {
  StartWorker(Options(0));
  std::vector<uint8_t> img(8 * 8 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i * 13);
  Reply r =
      Send(port(), Post("/v2/models/cv/infer", MakeInferRequestJson("q1", img, nullptr, 8, 8)));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("\"id\":\"q1\""), std::string::npos);
  auto got = ParseInferResponse(r.body);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, ComputeCv(img.data(), nullptr, 8, 8, 3));

  std::string head =
      R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[8,8,3],"parameters":{"binary_data_size":192}}]})";
  Reply b = Send(port(),
                 Post("/v2/models/cv/versions/1/infer", head + std::string(img.begin(), img.end()),
                      absl::StrCat("Inference-Header-Content-Length: ", head.size(), "\r\n")));
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(*ParseInferResponse(b.body), *got);
  EXPECT_EQ(worker_->counters().success.load(), 2u);
}

TEST_F(WorkerTest, BadTensorsAndBadHttpGetReasons) {
  StartWorker(Options(0, 64, 4096));
  Reply shape = Send(
      port(), Post("/v2/models/cv/infer",
                   R"({"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[2,2],"data":[1]}]})"));
  EXPECT_EQ(shape.status, 400);
  EXPECT_NE(shape.body.find("{\"error\":\"input 'IMAGE': unexpected number of elements 1"),
            std::string::npos)
      << shape.body;
  Reply dtype = Send(
      port(), Post("/v2/models/cv/infer",
                   R"({"inputs":[{"name":"IMAGE","datatype":"INT64","shape":[1,1],"data":[1]}]})"));
  EXPECT_EQ(dtype.status, 400);
  EXPECT_NE(dtype.body.find("datatype INT64"), std::string::npos);
  Reply hdr =
      Send(port(), Post("/v2/models/cv/infer", "{}", "Inference-Header-Content-Length: x\r\n"));
  EXPECT_EQ(hdr.status, 400);
  EXPECT_NE(hdr.body.find("Inference-Header-Content-Length"), std::string::npos);
  Reply big = Send(port(), Post("/v2/models/cv/infer", std::string(5000, ' ')));
  EXPECT_EQ(big.status, 413);
  Reply garbage = Send(port(), "NOT HTTP\r\n\r\n");
  EXPECT_EQ(garbage.status, 400);
  // Bad input is Triton's OTHER reason, never the engine's (BACKEND).
  EXPECT_EQ(worker_->counters().failure_other.load(), 3u);
  EXPECT_EQ(worker_->counters().failure_backend.load(), 0u);
  // A model not served is counted nowhere (adversarial finding: a client
  // naming a wrong model made its requests the engine's failures, and the
  // agent's "only errors" rule then fenced every node they reached).
  EXPECT_EQ(Send(port(), Post("/v2/models/m/infer", "{}")).status, 404);
  EXPECT_EQ(worker_->counters().failure_other.load(), 3u);
  Reply metrics = Send(port(), GetReq("/metrics"));
  EXPECT_NE(metrics.body.find(
                "nv_inference_request_failure{model=\"cv\",version=\"1\",reason=\"OTHER\"} 3"),
            std::string::npos)
      << metrics.body;
  // Still serving.
  EXPECT_EQ(Send(port(), GetReq("/v2/health/ready")).status, 200);
}

TEST_F(WorkerTest, LatencyModelsGpuTimeAndCapacityBoundsWork) {
  StartWorker(Options(300, 1));
  std::vector<uint8_t> img(3, 9);
  std::string req = Post("/v2/models/cv/infer", MakeInferRequestJson("", img, nullptr, 1, 1));
  auto started = std::chrono::steady_clock::now();
  auto first = std::async(std::launch::async, [&] { return Send(port(), req); });
  // Wait until the first request is in service, then a second is refused.
  while (worker_->counters().in_service.load() == 0) std::this_thread::sleep_for(milliseconds(1));
  Reply second = Send(port(), req);
  EXPECT_EQ(second.status, 503);
  EXPECT_EQ(second.headers["Retry-After"], "1");
  EXPECT_NE(second.body.find("at capacity (1"), std::string::npos);
  Reply r = first.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(300));
  Reply metrics = Send(port(), GetReq("/metrics"));
  EXPECT_NE(metrics.body.find("nv_inference_request_success{model=\"cv\",version=\"1\"} 1"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("gpuha_worker_rejected_at_capacity_total 1"), std::string::npos);
  // Triton's failure count includes the refusal; one execution ran.
  EXPECT_NE(metrics.body.find("nv_inference_request_failure{model=\"cv\",version=\"1\","
                              "reason=\"REJECTED\"} 1"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("nv_inference_exec_count{model=\"cv\",version=\"1\"} 1"),
            std::string::npos);
#define GPUHA_SHOWN(name, family, model_labels, help) \
  EXPECT_NE(metrics.body.find("# TYPE " family " counter"), std::string::npos) << family;
  GPUHA_WORKER_COUNTERS(GPUHA_SHOWN)
#undef GPUHA_SHOWN
}

double Metric(const std::string& text, const std::string& prefix) {
  size_t at = text.find("\n" + prefix);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(text.find(' ', at + prefix.size()) + 1));
}

// The field's failures on demand: inference stuck while health and metrics
// answer, as Triton's metrics show it (pending grows, executions stop).
TEST_F(WorkerTest, StuckFaultHoldsInferenceWhileHealthAndMetricsAnswer) {
  StartWorker(Options(1));
  std::string infer = Post("/v2/models/cv/infer",
                           MakeInferRequestJson("", std::vector<uint8_t>(3, 9), nullptr, 1, 1));
  ASSERT_EQ(Send(port(), infer).status, 200);
  Reply set = Send(port(), Post("/v1/fault?mode=stuck", ""));
  ASSERT_EQ(set.status, 200) << set.body;
  EXPECT_NE(set.body.find(R"("mode":"stuck")"), std::string::npos);
  std::vector<std::future<Reply>> stuck;
  for (int i = 0; i < 3; ++i) {
    stuck.push_back(std::async(std::launch::async, [&] { return Send(port(), infer); }));
  }
  ASSERT_TRUE(gpuha::testing::Eventually([&] { return worker_->counters().in_service.load() == 3; },
                                         milliseconds(5000)));
  EXPECT_EQ(Send(port(), GetReq("/v2/health/ready")).status, 200);  // the lie
  std::string m = Send(port(), GetReq("/metrics")).body;
  EXPECT_EQ(Metric(m, "nv_inference_pending_request_count{"), 3) << m;
  EXPECT_EQ(Metric(m, "nv_inference_exec_count{"), 1) << m;
  for (auto& f : stuck) EXPECT_EQ(f.wait_for(milliseconds(200)), std::future_status::timeout);
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=none", "")).status, 200);
  for (auto& f : stuck) EXPECT_EQ(f.get().status, 200);  // cleared: they complete
  EXPECT_EQ(worker_->counters().executions.load(), 4u);
}

TEST_F(WorkerTest, ErrorsAndSlowFaultsAndBadFaultRequests) {
  StartWorker(Options(20));
  std::string infer = Post("/v2/models/cv/infer",
                           MakeInferRequestJson("", std::vector<uint8_t>(3, 9), nullptr, 1, 1));
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=errors", "")).status, 200);
  Reply r = Send(port(), infer);
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("CUDA error"), std::string::npos);
  EXPECT_EQ(Send(port(), GetReq("/v2/health/ready")).status, 200);
  EXPECT_EQ(worker_->counters().failure_backend.load(), 1u);
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=slow&factor=10", "")).status, 200);
  auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(Send(port(), infer).status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(200));  // 20 ms x 10
  Reply bad = Send(port(), Post("/v1/fault?mode=melt", ""));
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("mode: 'melt' is not one of"), std::string::npos);
  EXPECT_EQ(Send(port(), Post("/v1/fault?mode=slow&factor=0", "")).status, 400);
  EXPECT_EQ(Send(port(), Post("/v1/fault?mode=stuck&factor=2", "")).status, 400);
  EXPECT_NE(Send(port(), GetReq("/v1/fault")).body.find(R"("mode":"slow")"), std::string::npos);
  EXPECT_FALSE(ParseWorkerFault("slow", "1e9").ok());
  EXPECT_EQ(ParseWorkerFault("slow")->factor, 10);
}

// As a vLLM server exports them (issue 51): no Triton family, and every
// inference answer counted in http_requests_total by handler and status
// class, the only place its failures show.
TEST_F(WorkerTest, VllmStyleMetricsCountAnswersByStatusClassAndNoTritonFamily) {
  WorkerOptions o = Options(0);
  o.ttft = milliseconds(0);
  o.token_latency = milliseconds(0);
  o.engine_metrics = EngineMetrics::kVllm;
  StartWorker(o);
  const std::string completion =
      Post("/v1/completions", R"({"model":"gpuha-tiny","prompt":"x","max_tokens":2})");
  EXPECT_EQ(Send(port(), completion).status, 200);
  EXPECT_EQ(Send(port(), Post("/v1/chat/completions", R"({"model":"gpuha-tiny"})")).status, 400);
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=errors", "")).status, 200);
  EXPECT_EQ(Send(port(), completion).status, 500);
  EXPECT_EQ(Send(port(), completion).status, 500);
  EXPECT_EQ(Send(port(), Post("/v2/models/cv/infer",
                              MakeInferRequestJson("", std::vector<uint8_t>(3, 9), nullptr, 1, 1)))
                .status,
            500);
  const std::string metrics = Send(port(), GetReq("/metrics")).body;
  EXPECT_EQ(metrics.find("nv_inference"), std::string::npos) << metrics;
  for (const char* line :
       {R"(http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 1)",
        R"(http_requests_total{handler="/v1/completions",method="POST",status="5xx"} 2)",
        R"(http_requests_total{handler="/v1/chat/completions",method="POST",status="4xx"} 1)",
        R"(http_requests_total{handler="/v2/models/cv/infer",method="POST",status="5xx"} 1)",
        "vllm:request_success_total 1", "vllm:num_requests_running 0"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
  }
}

WorkerOptions LlmOptions(int ttft_ms, int token_ms) {
  WorkerOptions o = Options(0);
  o.ttft = milliseconds(ttft_ms);
  o.token_latency = milliseconds(token_ms);
  return o;
}

TEST_F(WorkerTest, StreamsTheModelsAnswerAsSseAndWholeWithoutStream) {
  WorkerOptions o = LlmOptions(0, 0);
  o.node = "gpu-3";
  StartWorker(o);
  LlmRequest ref;
  ref.prompt = "tell me about failover";
  ref.max_tokens = 30;
  const LlmAnswer want = Complete(ref);
  Reply r = Send(port(), Post("/v1/completions",
                              R"({"model":"gpuha-tiny","prompt":"tell me about failover",
                                  "max_tokens":30,"stream":true,
                                  "stream_options":{"include_usage":true}})"));
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.headers["Content-Type"], "text/event-stream");
  EXPECT_EQ(r.headers["X-Gpuha-Node"], "gpu-3");
  auto got = ParseStreamedAnswer(LlmApi::kCompletions, r.body);
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << r.body;
  EXPECT_EQ(got->text, want.text);
  EXPECT_EQ(got->finish_reason, want.finish_reason);
  EXPECT_EQ(got->completion_tokens, want.completion_tokens);
  EXPECT_EQ(got->prompt_tokens, want.prompt_tokens);
  EXPECT_EQ(got->chunks, want.completion_tokens);  // one token per chunk
  // Chat: a role chunk first, then the same kind of stream.
  Reply chat = Send(port(), Post("/v1/chat/completions",
                                 R"({"model":"gpuha-tiny","stream":true,"max_tokens":8,
                                     "messages":[{"role":"user","content":"hi"}]})"));
  ASSERT_EQ(chat.status, 200);
  EXPECT_NE(chat.body.find(R"("role":"assistant")"), std::string::npos);
  auto chat_got = ParseStreamedAnswer(LlmApi::kChat, chat.body);
  ASSERT_TRUE(chat_got.ok()) << chat_got.status();
  ref.prompt = "<|user|>\nhi\n<|assistant|>\n";
  ref.max_tokens = 8;
  EXPECT_EQ(chat_got->text, Complete(ref).text);
  // Not streamed: one JSON answer with usage.
  Reply whole = Send(port(), Post("/v1/completions",
                                  R"({"model":"gpuha-tiny","prompt":"tell me about failover",
                                      "max_tokens":30})"));
  ASSERT_EQ(whole.status, 200);
  EXPECT_NE(whole.body.find(absl::StrCat("\"completion_tokens\":", want.completion_tokens)),
            std::string::npos)
      << whole.body;
  Reply models = Send(port(), GetReq("/v1/models"));
  EXPECT_NE(models.body.find("\"gpuha-tiny\""), std::string::npos);
  Reply metrics = Send(port(), GetReq("/metrics"));
  // The streamed and the whole completion, and the chat answer.
  EXPECT_NE(metrics.body.find(absl::StrCat("vllm:generation_tokens_total ",
                                           2 * want.completion_tokens + chat_got->chunks, "\n")),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("vllm:num_requests_running 0"), std::string::npos);
}

TEST_F(WorkerTest, CompletionErrorsAreOpenAiShaped) {
  StartWorker(LlmOptions(0, 0));
  Reply bad = Send(port(), Post("/v1/completions", R"({"model":"gpuha-tiny","max_tokens":-1,
                                                        "prompt":"x"})"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find(R"("param":"max_tokens")"), std::string::npos) << bad.body;
  Reply unknown = Send(port(), Post("/v1/completions", R"({"model":"llama","prompt":"x"})"));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("The model `llama` does not exist."), std::string::npos);
  EXPECT_EQ(Send(port(), GetReq("/v1/completions")).status, 405);
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=errors", "")).status, 200);
  EXPECT_EQ(Send(port(), Post("/v1/completions", R"({"model":"gpuha-tiny","prompt":"x"})")).status,
            500);
}

TEST_F(WorkerTest, CutStopsAStreamMidAnswerWithNoEnd) {
  StartWorker(LlmOptions(0, 20));
  std::future<Reply> f = std::async(std::launch::async, [this] {
    return Send(port(), Post("/v1/completions",
                             R"({"model":"gpuha-tiny","prompt":"long","max_tokens":4000,
                                 "stream":true})"));
  });
  ASSERT_TRUE(gpuha::testing::Eventually(
      [&] { return worker_->counters().generation_tokens.load() >= 3; }));
  ASSERT_EQ(Send(port(), Post("/v1/fault?mode=cut", "")).status, 200);
  Reply r = f.get();
  EXPECT_FALSE(r.error.empty()) << "the cut stream ended cleanly: " << r.body.size();
  EXPECT_EQ(worker_->counters().llm_success.load(), 0u);
  EXPECT_EQ(worker_->counters().llm_running.load(), 0);
}

TEST_F(WorkerTest, BadOptionsAreRefused) {
  EXPECT_NE(Worker::Start(Options(0, 0)).status().message().find("--capacity"), std::string::npos);
  WorkerOptions o = Options(0);
  o.address = "nowhere";
  EXPECT_NE(Worker::Start(o).status().message().find("nowhere"), std::string::npos);
}

}  // namespace
}  // namespace gpuha::worker
