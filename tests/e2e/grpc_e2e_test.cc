// gRPC through `gpuha router` as a real process, in front of two real
// `gpuha worker` processes' KServe v2 gRPC ports, called by grpc++'s client
// over h2c: kill -9, SIGSTOP (a hang) and a half-hang (health answers,
// inference stuck) of the primary under load lose no call, every answer
// checked against the model. Gaps are printed for bench/RESULTS.md, not
// asserted.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/config_builders.h"
#include "common/testing/raw_http.h"
#include "common/testing/temp_dir.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/e2e/child_process.h"
#include "worker/model_grpc.h"

namespace gpuha::e2e {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::string kGpuha = GPUHA_BINARY;

struct LoadResult {
  int ok = 0;
  int failed = 0;
  double max_gap_ms = 0;
  std::map<std::string, int> by_node;
  std::string first_failure;
};

class GrpcE2eTest : public ::testing::Test {
 protected:
  struct Worker {
    std::unique_ptr<ChildProcess> p;
    std::string http, grpc;
  };
  void SetUp() override {
    dir_ = gpuha::testing::TestTempDir();
    for (const char* name : {"a", "b"}) {
      Worker& w = workers_[name];
      w.p = std::make_unique<ChildProcess>(
          std::vector<std::string>{kGpuha, "worker", "--listen", "127.0.0.1:0", "--grpc-listen",
                                   "127.0.0.1:0", "--node", name, "--latency", "2"});
      auto http = w.p->WaitForLine("listening on 127.0.0.1:", milliseconds(10000));
      auto grpc = w.p->WaitForLine("serving gRPC on 127.0.0.1:", milliseconds(10000));
      ASSERT_TRUE(http && grpc) << w.p->err();
      w.http = "127.0.0.1:" + *http;
      w.grpc = "127.0.0.1:" + *grpc;
    }
    cluster::RouterYaml r;
    r.tenants = {{.name = "acme", .api_keys = {"k1"}}};
    r.probe_interval_ms = 20;
    r.hang_after_ms = 100;
    r.routes = {{.stream = "s1",
                 .tenant = "acme",
                 .primary = workers_["a"].http,
                 .standby = workers_["b"].http,
                 .primary_grpc = workers_["a"].grpc,
                 .standby_grpc = workers_["b"].grpc}};
    // The backstop for a call no verdict moves: well inside the clients' 10 s.
    std::ofstream(dir_ / "router.yaml") << r.Yaml() << "limits: {response_timeout_ms: 2000}\n";
    router_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--listen", "127.0.0.1:0",
        "--admin", "127.0.0.1:0", "--threads", "2"});
    auto rest = router_->WaitForLine("gpuha router listening on 127.0.0.1:", milliseconds(10000));
    ASSERT_TRUE(rest.has_value()) << router_->err();
    port_ = static_cast<uint16_t>(std::stoi(*rest));
  }

  // `clients` channels (one HTTP/2 connection each) sending back-to-back
  // ModelInfer calls on s1 until `stop`; a status other than OK, or a
  // wrong answer, is a failure.
  LoadResult RunLoad(int clients, const std::atomic<bool>& stop, bool streaming) {
    std::mutex mu;
    LoadResult total;
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        grpc::ChannelArguments args;
        args.SetInt("gpuha.client", c);  // a channel (and connection) of its own
        auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
            "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials(), args));
        LoadResult mine;
        auto last = Clock::now();
        if (streaming) {
          mine = StreamLoad(*stub, c, stop);
        }
        for (int i = 0; !streaming && !stop; ++i) {
          std::vector<uint8_t> img(8 * 8 * 3);
          for (size_t k = 0; k < img.size(); ++k) img[k] = static_cast<uint8_t>(k * 7 + i + c);
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
          ctx.AddMetadata("x-api-key", "k1");
          ctx.AddMetadata("x-gpuha-stream", "s1");
          inference::ModelInferResponse resp;
          grpc::Status st = stub->ModelInfer(
              &ctx, worker::MakeGrpcInferRequest(std::to_string(i), img, nullptr, 8, 8), &resp);
          absl::StatusOr<worker::CvResult> got =
              st.ok() ? worker::FromGrpc(resp) : absl::UnknownError(st.error_message());
          if (got.ok() && *got == worker::ComputeCv(img.data(), nullptr, 8, 8, 3)) {
            mine.ok++;
            auto node = ctx.GetServerInitialMetadata().find("x-gpuha-node");
            if (node != ctx.GetServerInitialMetadata().end()) {
              mine.by_node[std::string(node->second.data(), node->second.size())]++;
            }
            auto now = Clock::now();
            mine.max_gap_ms = std::max(
                mine.max_gap_ms, std::chrono::duration<double, std::milli>(now - last).count());
            last = now;
          } else {
            mine.failed++;
            if (mine.first_failure.empty()) {
              mine.first_failure = got.ok() ? "wrong answer" : std::string(got.status().message());
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        total.ok += mine.ok;
        total.failed += mine.failed;
        total.max_gap_ms = std::max(total.max_gap_ms, mine.max_gap_ms);
        for (auto& [n, k] : mine.by_node) total.by_node[n] += k;
        if (total.first_failure.empty()) total.first_failure = mine.first_failure;
      });
    }
    for (auto& t : threads) t.join();
    return total;
  }
  // One ModelStreamInfer stream until `stop`: a frame written, its answer
  // read and checked (it must be that frame's, in order), and so on; the
  // stream must then end OK with nothing more.
  static LoadResult StreamLoad(inference::GRPCInferenceService::Stub& stub, int c,
                               const std::atomic<bool>& stop) {
    LoadResult mine;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ctx.AddMetadata("x-api-key", "k1");
    ctx.AddMetadata("x-gpuha-stream", "s1");
    auto stream = stub.ModelStreamInfer(&ctx);
    auto last = Clock::now();
    auto fail = [&](std::string why) {
      mine.failed++;
      if (mine.first_failure.empty()) mine.first_failure = std::move(why);
    };
    for (int i = 0; !stop; ++i) {
      std::vector<uint8_t> img(8 * 8 * 3);
      for (size_t k = 0; k < img.size(); ++k) img[k] = static_cast<uint8_t>(k * 5 + i + c);
      if (!stream->Write(worker::MakeGrpcInferRequest(std::to_string(i), img, nullptr, 8, 8))) {
        fail("write failed");
        break;
      }
      inference::ModelStreamInferResponse r;
      if (!stream->Read(&r)) {
        fail("the stream ended early");
        break;
      }
      absl::StatusOr<worker::CvResult> got = worker::FromGrpc(r.infer_response());
      if (!r.error_message().empty() || r.infer_response().id() != std::to_string(i) || !got.ok() ||
          *got != worker::ComputeCv(img.data(), nullptr, 8, 8, 3)) {
        fail("wrong answer: " + r.error_message());
        continue;
      }
      mine.ok++;
      auto now = Clock::now();
      mine.max_gap_ms =
          std::max(mine.max_gap_ms, std::chrono::duration<double, std::milli>(now - last).count());
      last = now;
    }
    stream->WritesDone();
    inference::ModelStreamInferResponse extra;
    if (stream->Read(&extra)) fail("an answer too many");
    grpc::Status st = stream->Finish();
    if (!st.ok()) fail("stream status: " + st.error_message());
    return mine;
  }

  // Load while `fault` runs after 300 ms; 1.5 s in all.
  LoadResult LoadAround(const std::function<void()>& fault, bool streaming = false) {
    std::atomic<bool> stop{false};
    LoadResult r;
    std::thread load([&] { r = RunLoad(4, stop, streaming); });
    std::this_thread::sleep_for(milliseconds(300));
    fault();
    std::this_thread::sleep_for(milliseconds(1200));
    stop = true;
    load.join();
    return r;
  }
  void Report(const char* what, LoadResult& r) {
    // A stream's answers come from wherever it is: nodes are counted for calls only.
    std::string by = r.by_node.empty()
                         ? std::string()
                         : absl::StrCat(", a=", r.by_node["a"], " b=", r.by_node["b"]);
    std::printf("gRPC %s: %d ok, %d failed, longest gap %.1f ms%s\n", what, r.ok, r.failed,
                r.max_gap_ms, by.c_str());
  }

  std::filesystem::path dir_;
  std::map<std::string, Worker> workers_;
  std::unique_ptr<ChildProcess> router_;
  uint16_t port_ = 0;
};

TEST_F(GrpcE2eTest, KillDashNineOfThePrimaryLosesNoCall) {
  LoadResult r = LoadAround([&] { workers_["a"].p->Signal(SIGKILL); });
  Report("kill -9 primary", r);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.by_node["a"], 0);
  EXPECT_GT(r.by_node["b"], 0);
}

TEST_F(GrpcE2eTest, SigstopOfThePrimaryLosesNoCall) {
  LoadResult r = LoadAround([&] { workers_["a"].p->Signal(SIGSTOP); });
  workers_["a"].p->Signal(SIGCONT);
  Report("SIGSTOP primary", r);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.by_node["b"], 0);
}

TEST_F(GrpcE2eTest, AHalfHungPrimaryLosesNoCall) {
  // Health answers, inference makes no progress. These clients are closed
  // loop: the calls left waiting mostly began before the primary's last
  // answer, which the stall verdict takes for "outpaced, not stalled"
  // (router/progress.h), so the response timeout (2 s here) moves them.
  // Open-loop load, where fresh calls keep coming, gets the stall verdict
  // (bench/RESULTS.md, and RouterGrpcTest.AStuckPrimaryIsJudgedByProgress).
  const std::string port = workers_["a"].http.substr(workers_["a"].http.rfind(':') + 1);
  LoadResult r = LoadAround([&] {
    auto reply = gpuha::testing::Send(
        static_cast<uint16_t>(std::stoi(port)),
        "POST /v1/fault?mode=stuck HTTP/1.1\r\nHost: w\r\nContent-Length: 0\r\n\r\n");
    EXPECT_EQ(reply.status, 200);
  });
  Report("half-hang (stuck) primary", r);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.by_node["b"], 0);
}

// Streaming calls: every frame answered once, in order, across the failover.
TEST_F(GrpcE2eTest, StreamsGoOnThroughAKillDashNine) {
  LoadResult r = LoadAround([&] { workers_["a"].p->Signal(SIGKILL); }, /*streaming=*/true);
  Report("streaming, kill -9 primary", r);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.ok, 100);
}

TEST_F(GrpcE2eTest, StreamsGoOnThroughASigstop) {
  LoadResult r = LoadAround([&] { workers_["a"].p->Signal(SIGSTOP); }, /*streaming=*/true);
  workers_["a"].p->Signal(SIGCONT);
  Report("streaming, SIGSTOP primary", r);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.ok, 100);
}

}  // namespace
}  // namespace gpuha::e2e
