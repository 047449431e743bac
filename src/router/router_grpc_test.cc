// The router in-process in front of two real gpuha workers' KServe v2 gRPC
// ports, called by grpc++'s own client over h2c: calls routed by their
// x-gpuha-stream metadata, tenants by their key, the router's own answers
// as gRPC statuses, and unary calls that lose nothing when the primary
// crashes, hangs or answers UNAVAILABLE. Every answer is checked against
// the model run locally.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net_util.h"
#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_certs.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "router/grpc.h"
#include "router/h2_server.h"
#include "router/router.h"
#include "router/testing/h2_frames.h"
#include "router/testing/test_backend.h"
#include "worker/model_grpc.h"
#include "worker/worker.h"

namespace gpuha::router {
namespace {

using gpuha::testing::Eventually;
using gpuha::testing::Send;
using std::chrono::milliseconds;

std::vector<uint8_t> Image(int64_t h, int64_t w, int seed) {
  std::vector<uint8_t> v(static_cast<size_t>(h * w * 3));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 13 + seed);
  return v;
}

class RouterGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto [w, name] : {std::pair{&a_, "a"}, std::pair{&b_, "b"}}) {
      auto s = StartWorker(name);
      ASSERT_TRUE(s.ok()) << s.status();
      *w = std::move(*s);
    }
    config_.listen = {"127.0.0.1", 0};
    config_.admin = {"127.0.0.1", 0};
    config_.threads = 2;
    config_.probe_interval = milliseconds(10);
    config_.hang_after = milliseconds(200);
    config_.limits.response_timeout = milliseconds(1500);
    config_.tenants = {{"acme", {common::Sha256Hex("k-acme")}, 0, 0, 0},
                       {"other", {common::Sha256Hex("k-other")}, 0, 0, 0}};
    StaticRoute cam{"cam-1", "acme", Http(*a_), Http(*b_)};
    cam.primary_grpc = Grpc(*a_);
    cam.standby_grpc = Grpc(*b_);
    StaticRoute theirs{"cam-9", "other", Http(*a_), ""};
    theirs.primary_grpc = Grpc(*a_);
    StaticRoute http_only{"cam-2", "acme", Http(*a_), ""};
    config_.routes = {cam, theirs, http_only};
    router_ = std::make_unique<Router>(config_);
    ASSERT_TRUE(router_->Start().ok());
    CallRouterAt(router_->port());
  }
  void CallRouterAt(uint16_t port) {
    stub_ = inference::GRPCInferenceService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  // Another router, of the fixture's config as `change` leaves it, which
  // stub_ calls from now on.
  std::unique_ptr<Router> StartAnother(const std::function<void(RouterConfig&)>& change) {
    RouterConfig c = config_;
    change(c);
    auto r = std::make_unique<Router>(c);
    absl::Status st = r->Start();
    EXPECT_TRUE(st.ok()) << st;
    CallRouterAt(r->port());
    return r;
  }
  static absl::StatusOr<std::unique_ptr<worker::Worker>> StartWorker(const std::string& name) {
    worker::WorkerOptions o;
    o.port = 0;
    o.grpc_port = 0;
    o.node = name;
    o.latency = milliseconds(2);
    return worker::Worker::Start(o);
  }
  static std::string Http(const worker::Worker& w) { return absl::StrCat("127.0.0.1:", w.port()); }
  static std::string Grpc(const worker::Worker& w) {
    return absl::StrCat("127.0.0.1:", w.grpc_port());
  }  // The controller's new routes: cam-1 on `primary`, `standby` behind it.
  void MoveRoute(const worker::Worker& primary, const worker::Worker& standby) {
    StaticRoute moved{"cam-1", "acme", Http(primary), Http(standby)};
    moved.primary_grpc = Grpc(primary);
    moved.standby_grpc = Grpc(standby);
    ASSERT_TRUE(router_->SetRoutes(RouteTable::FromStatic({moved})).ok());
  }

  void Fault(worker::Worker& w, const std::string& mode) {
    ASSERT_EQ(Send(w.port(), absl::StrCat("POST /v1/fault?mode=", mode,
                                          " HTTP/1.1\r\nHost: w\r\nContent-Length: 0\r\n\r\n"))
                  .status,
              200);
  }
  struct Result {
    grpc::Status status;
    std::string node;
  };
  // One ModelInfer through the router, its answer checked.
  Result Infer(int seed, const std::string& key = "k-acme", const std::string& stream = "cam-1",
               milliseconds deadline = milliseconds(10000)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    if (!key.empty()) ctx.AddMetadata("x-api-key", key);
    if (!stream.empty()) ctx.AddMetadata("x-gpuha-stream", stream);
    auto img = Image(6, 5, seed);
    inference::ModelInferResponse resp;
    Result r;
    r.status = stub_->ModelInfer(
        &ctx, worker::MakeGrpcInferRequest(absl::StrCat("r", seed), img, nullptr, 6, 5), &resp);
    if (!r.status.ok()) return r;
    auto node = ctx.GetServerInitialMetadata().find("x-gpuha-node");
    if (node != ctx.GetServerInitialMetadata().end()) {
      r.node = std::string(node->second.data(), node->second.size());
    }
    absl::StatusOr<worker::CvResult> got = worker::FromGrpc(resp);
    if (!got.ok() || *got != worker::ComputeCv(img.data(), nullptr, 6, 5, 3) ||
        resp.id() != absl::StrCat("r", seed)) {
      r.status = grpc::Status(grpc::StatusCode::DATA_LOSS, "wrong answer");
    }
    return r;
  }
  // `calls` calls from `threads` threads while `fault` happens after a
  // quarter of them: every one must succeed.
  void NoCallLost(int threads, int calls, const std::function<void()>& fault) {
    std::atomic<int> next{0}, failed{0};
    std::atomic<bool> faulted{false};
    std::string first_error;
    std::mutex mu;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        for (int i; (i = next++) < calls;) {
          if (i == calls / 4 && !faulted.exchange(true)) fault();
          Result r = Infer(i);
          if (!r.status.ok()) {
            failed++;
            std::lock_guard<std::mutex> lock(mu);
            if (first_error.empty()) first_error = r.status.error_message();
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(failed.load(), 0) << first_error;
  }
  // A gRPC server of `model` written for one test, on a free port.
  static std::unique_ptr<grpc::Server> ServeModel(grpc::Service& model, int* port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
    builder.RegisterService(&model);
    return builder.BuildAndStart();
  }
  double Metric(const std::string& name, const Router* r = nullptr) {
    std::string text = (r != nullptr ? r : router_.get())->MetricsText();
    size_t at = text.find("\ngpuha_router_" + name + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 15));
  }

  std::unique_ptr<worker::Worker> a_, b_;
  RouterConfig config_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(RouterGrpcTest, CallsAreRoutedByTheirStreamMetadata) {
  for (int i = 0; i < 20; ++i) {
    Result r = Infer(i);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.node, "a");
  }
  EXPECT_EQ(a_->counters().success.load(), 20u);
  EXPECT_EQ(Metric("grpc_calls_total"), 20);
  EXPECT_GE(Metric("h2_connections_total"), 1);
}

TEST_F(RouterGrpcTest, TheRoutersOwnAnswersAreGrpcStatuses) {
  struct Case {
    std::string key, stream;
    grpc::StatusCode code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "cam-1", grpc::StatusCode::UNAUTHENTICATED, "API key"},
           {"k-wrong", "cam-1", grpc::StatusCode::UNAUTHENTICATED, "API key"},
           {"k-acme", "cam-9", grpc::StatusCode::NOT_FOUND, "no such stream"},  // other tenant's
           {"k-acme", "nope", grpc::StatusCode::NOT_FOUND, "no such stream"},
           {"k-acme", "", grpc::StatusCode::INVALID_ARGUMENT, "x-gpuha-stream"},
           {"k-acme", "bad/stream", grpc::StatusCode::INVALID_ARGUMENT, "x-gpuha-stream"},
           {"k-acme", "cam-2", grpc::StatusCode::UNAVAILABLE, "serves no gRPC"},
       }) {
    Result r = Infer(1, c.key, c.stream);
    EXPECT_EQ(r.status.error_code(), c.code)
        << c.key << " " << c.stream << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.says), std::string::npos) << r.status.error_message();
  }
  EXPECT_EQ(a_->counters().success.load() + b_->counters().success.load(), 0u);
}

TEST_F(RouterGrpcTest, ACrashedPrimaryLosesNoCall) {
  NoCallLost(4, 200, [this] { a_.reset(); });
  EXPECT_GT(b_->counters().success.load(), 100u);
}

TEST_F(RouterGrpcTest, AStuckPrimaryLosesNoCall) {
  // Health answers, inference makes no progress, under load: every call
  // waiting on it goes to the standby.
  NoCallLost(4, 120, [this] { Fault(*a_, "stuck"); });
  EXPECT_GT(b_->counters().success.load(), 60u);
  EXPECT_GT(Metric("retries_total"), 0);
}

TEST_F(RouterGrpcTest, AStuckPrimaryIsJudgedByProgressNotByTimeout) {
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Infer(i).status.ok());
  Fault(*a_, "stuck");
  auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&, t] {
      Result r = Infer(100 + t);
      ok += r.status.ok() && r.node == "b";
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 6);
  // One learned window (150 ms floor) after the calls began, well before the
  // 1.5 s response timeout: the stall verdict moved them.
  EXPECT_LT(std::chrono::steady_clock::now() - started, milliseconds(1200));
  EXPECT_GE(Metric("stalls_total"), 1);
  EXPECT_GE(Metric("stall_resends_total"), 3);
}

// A ModelStreamInfer of acme's cam-1 on `stub`, with 20 s to live.
std::unique_ptr<
    grpc::ClientReaderWriter<inference::ModelInferRequest, inference::ModelStreamInferResponse>>
Cam1Stream(inference::GRPCInferenceService::Stub& stub, grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ctx.AddMetadata("x-api-key", "k-acme");
  ctx.AddMetadata("x-gpuha-stream", "cam-1");
  return stub.ModelStreamInfer(&ctx);
}

// A ModelStreamInfer stream through the router: `before` frames, then
// `fault`, then `after` more; every frame gets exactly one answer, in
// order, checked against the model. Returns who answered each.
std::vector<std::string> StreamAround(inference::GRPCInferenceService::Stub& stub, int before,
                                      const std::function<void()>& fault, int after,
                                      const std::function<void()>& second_fault = nullptr,
                                      int after_second = 0) {
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(stub, ctx);
  std::vector<std::string> nodes;
  auto one = [&](int i) {
    auto img = Image(5, 4, i);
    EXPECT_TRUE(
        stream->Write(worker::MakeGrpcInferRequest(absl::StrCat("f", i), img, nullptr, 5, 4)));
    inference::ModelStreamInferResponse r;
    ASSERT_TRUE(stream->Read(&r)) << "frame " << i;
    EXPECT_EQ(r.error_message(), "");
    EXPECT_EQ(r.infer_response().id(), absl::StrCat("f", i));  // its own answer, in order
    absl::StatusOr<worker::CvResult> got = worker::FromGrpc(r.infer_response());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, worker::ComputeCv(img.data(), nullptr, 5, 4, 3));
  };
  for (int i = 0; i < before; ++i) one(i);
  if (fault) fault();
  for (int i = before; i < before + after; ++i) one(i);
  if (second_fault) second_fault();
  for (int i = before + after; i < before + after + after_second; ++i) one(i);
  stream->WritesDone();
  inference::ModelStreamInferResponse extra;
  EXPECT_FALSE(stream->Read(&extra));  // nothing more: no answer twice
  grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  auto node = ctx.GetServerInitialMetadata().find("x-gpuha-node");
  if (node != ctx.GetServerInitialMetadata().end()) {
    nodes.emplace_back(node->second.data(), node->second.size());
  }
  return nodes;
}

TEST_F(RouterGrpcTest, AStreamIsRelayedMessageByMessage) {
  std::vector<std::string> nodes = StreamAround(*stub_, 30, nullptr, 0);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0], "a");
  EXPECT_EQ(a_->counters().success.load(), 30u);
  EXPECT_EQ(Metric("grpc_streams_total"), 1);
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 0);  // it ended where it began
}

TEST_F(RouterGrpcTest, APipelinedStreamIsAnsweredInOrder) {
  // Forty frames written before any answer is read: each message's bytes go
  // back to the client's window as it is answered, and every one comes back.
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(*stub_, ctx);
  for (int i = 0; i < 40; ++i) {
    auto img = Image(64, 64, i);  // 12 KiB a frame
    ASSERT_TRUE(
        stream->Write(worker::MakeGrpcInferRequest(absl::StrCat("p", i), img, nullptr, 64, 64)));
  }
  stream->WritesDone();
  for (int i = 0; i < 40; ++i) {
    inference::ModelStreamInferResponse r;
    ASSERT_TRUE(stream->Read(&r)) << i;
    EXPECT_EQ(r.infer_response().id(), absl::StrCat("p", i));
  }
  inference::ModelStreamInferResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  EXPECT_TRUE(stream->Finish().ok());
}

// More messages written before the end than the router asks of its
// upstream at once (128): the rest are taken as answers make room, and the
// client's early end (END_STREAM with whole messages still held) is no
// broken message. (A read-only review of this session's window bound
// found that 200 messages then WritesDone were answered "ended inside a
// message".)
TEST_F(RouterGrpcTest, AStreamOfMoreMessagesThanAskedAtOnceIsAnsweredWhole) {
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(*stub_, ctx);
  auto img = Image(6, 5, 1);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(
        stream->Write(worker::MakeGrpcInferRequest(absl::StrCat("m", i), img, nullptr, 6, 5)));
  }
  stream->WritesDone();
  for (int i = 0; i < 300; ++i) {
    inference::ModelStreamInferResponse r;
    ASSERT_TRUE(stream->Read(&r)) << i;
    EXPECT_EQ(r.infer_response().id(), absl::StrCat("m", i));
  }
  inference::ModelStreamInferResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST_F(RouterGrpcTest, ACallWhoseStandbyMovedWhileItWaitedGoesWhereItsRouteNowPoints) {
  // A call waits on a stuck a; meanwhile b, its standby, is fenced and the
  // routes give a the standby c. Moved off a, it goes to c, not to b.
  auto c = StartWorker("c");
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Infer(i).status.ok());  // a's window learned
  Fault(*a_, "stuck");
  Result r;
  std::thread call([&] { r = Infer(100); });
  std::this_thread::sleep_for(milliseconds(30));  // admitted, waiting on a
  b_.reset();
  MoveRoute(*a_, **c);
  call.join();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.node, "c");
}

// The same for a call admitted with its primary alone: the routes give it
// a standby while it waits, the primary fails, and the call goes there
// (UNAVAILABLE before: nothing was left of the order it was admitted with).
TEST_F(RouterGrpcTest, ACallOnItsLastUpstreamGoesWhereItsRouteNowPointsWhenItFails) {
  auto r = StartAnother([&](RouterConfig& c) {
    StaticRoute alone{"cam-1", "acme", Http(*a_), ""};
    alone.primary_grpc = Grpc(*a_);
    c.routes = {alone};
    c.threads = 1;
  });
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Infer(i).status.ok());  // a's window learned
  Fault(*a_, "stuck");
  std::vector<std::future<Result>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] { return Infer(100 + i); }));
  }
  std::this_thread::sleep_for(milliseconds(30));  // admitted, waiting on a
  StaticRoute moved{"cam-1", "acme", Http(*a_), Http(*b_)};
  moved.primary_grpc = Grpc(*a_);
  moved.standby_grpc = Grpc(*b_);
  ASSERT_TRUE(r->SetRoutes(RouteTable::FromStatic({moved})).ok());
  for (auto& f : calls) {
    Result res = f.get();
    ASSERT_TRUE(res.status.ok()) << res.status.error_message();
    EXPECT_EQ(res.node, "b");
  }
  Fault(*a_, "none");
}

// The connection's read deadline leaves a call being worked on alone: the
// client says nothing while it waits, however many upstreams its answer
// takes (before, the connection was closed under it after response_timeout
// of the client's silence: "Socket closed").
TEST_F(RouterGrpcTest, ACallThatTakesTwoUpstreamsLongerThanAResponseTimeoutKeepsItsConnection) {
  auto r = StartAnother([](RouterConfig& c) {  // response_timeout 1500 ms
    c.probe_interval = milliseconds(0);
    c.stall_detection = false;  // a is left by its response_timeout alone
  });
  ASSERT_TRUE(Infer(0).status.ok());  // the connection is up
  Fault(*a_, "stuck");
  Fault(*b_, "slow&factor=300");  // 600 ms an answer
  const auto start = std::chrono::steady_clock::now();
  Result res = Infer(1);
  ASSERT_TRUE(res.status.ok()) << res.status.error_message();
  EXPECT_EQ(res.node, "b");
  EXPECT_GT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

// So does a stream whose client pauses longer than a response_timeout
// with nothing owed: a camera that sends a frame now and then.
TEST_F(RouterGrpcTest, AStreamThatPausesLongerThanAResponseTimeoutKeepsItsConnection) {
  std::vector<std::string> nodes = StreamAround(
      *stub_, 2, [] { std::this_thread::sleep_for(milliseconds(2000)); }, 2);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0], "a");
  EXPECT_EQ(a_->counters().success.load(), 4u);
}

// A stream owed nothing whose client says nothing for idle_timeout ends
// DEADLINE_EXCEEDED, naming the timeout (Envoy's stream idle timeout); the
// connection's other calls go on.
TEST_F(RouterGrpcTest, AStreamSilentForIdleTimeoutEndsNamingIt) {
  auto r = StartAnother([](RouterConfig& c) { c.limits.idle_timeout = milliseconds(400); });
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(*stub_, ctx);
  auto img = Image(5, 4, 1);
  const auto sent = std::chrono::steady_clock::now();  // before the router's last answer
  ASSERT_TRUE(stream->Write(worker::MakeGrpcInferRequest("f1", img, nullptr, 5, 4)));
  inference::ModelStreamInferResponse got;
  ASSERT_TRUE(stream->Read(&got));
  EXPECT_EQ(got.infer_response().id(), "f1");
  EXPECT_FALSE(stream->Read(&got));  // ended by the router
  EXPECT_GE(std::chrono::steady_clock::now() - sent, milliseconds(400));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_NE(st.error_message().find("idle for idle_timeout (400 ms)"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(Infer(2).status.ok());  // the channel still serves
}

// A client connection of hand-made frames: one stream (id 1) of cam-1 for
// acme, with DATA and without END_STREAM, as no well-behaved client sends.
class RawH2 {
 public:
  explicit RawH2(uint16_t port) : sock_(ioc_) {
    sock_.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  }
  // The preface, SETTINGS, and the stream's HEADERS (and DATA, if any,
  // with END_STREAM if `end`).
  void Open(const std::string& method, const std::string& data, bool end = false,
            bool preface = true) {
    std::string out;
    if (preface) out = std::string(kH2Preface) + testing::Frame(NGHTTP2_SETTINGS, 0, 0, "");
    out += testing::Frame(
        NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, 1,
        testing::LiteralBlock({{":method", "POST"},
                               {":scheme", "http"},
                               {":authority", "r"},
                               {":path", "/inference.GRPCInferenceService/" + method},
                               {"content-type", "application/grpc"},
                               {"x-api-key", "k-acme"},
                               {"x-gpuha-stream", "cam-1"}}));
    if (!data.empty()) {
      out += testing::Frame(NGHTTP2_DATA, end ? NGHTTP2_FLAG_END_STREAM : 0, 1, data);
    }
    boost::asio::write(sock_, boost::asio::buffer(out));
  }
  // Opens with these SETTINGS (each: a 16-bit id, a 32-bit value).
  void OpenWith(const std::vector<std::pair<uint16_t, uint32_t>>& settings,
                const std::string& method) {
    std::string payload;
    for (auto [id, value] : settings) {
      payload.push_back(static_cast<char>(id >> 8));
      payload.push_back(static_cast<char>(id));
      for (int shift : {24, 16, 8, 0}) payload.push_back(static_cast<char>(value >> shift));
    }
    std::string out(kH2Preface);
    out += testing::Frame(NGHTTP2_SETTINGS, 0, 0, payload);
    boost::asio::write(sock_, boost::asio::buffer(out));
    Open(method, "", false, /*preface=*/false);
  }
  // Writes `bytes`; an error (the router closed) is for the reads to see.
  void Write(const std::string& bytes) {
    boost::system::error_code ec;
    boost::asio::write(sock_, boost::asio::buffer(bytes), ec);
  }
  // Reads what the router sent within `wait` and keeps the flow-control
  // windows it gives stream 1 (send_window) as a client must; answers its
  // SETTINGS. False once the connection is closed.
  bool ReadWindows(milliseconds wait) {
    pollfd p{sock_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return true;
    char buf[65536];
    ssize_t n = ::recv(sock_.native_handle(), buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    for (;;) {
      if (in_.size() < 9) return true;
      const auto* h = reinterpret_cast<const unsigned char*>(in_.data());
      const size_t len = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
      if (in_.size() < 9 + len) return true;
      const uint8_t type = h[3], flags = h[4];
      const uint32_t stream =
          ((uint32_t{h[5]} << 24) | (uint32_t{h[6]} << 16) | (uint32_t{h[7]} << 8) | h[8]) &
          0x7fffffffu;
      const auto* b = h + 9;
      auto u32 = [](const unsigned char* q) {
        return (uint32_t{q[0]} << 24) | (uint32_t{q[1]} << 16) | (uint32_t{q[2]} << 8) | q[3];
      };
      if (type == NGHTTP2_SETTINGS && (flags & NGHTTP2_FLAG_ACK) == 0) {
        for (size_t i = 0; i + 6 <= len; i += 6) {
          if (((b[i] << 8) | b[i + 1]) == NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE) {
            stream_window_ += int64_t{u32(b + i + 2)} - 65535;
          }
        }
        Write(testing::Frame(NGHTTP2_SETTINGS, NGHTTP2_FLAG_ACK, 0, ""));
      } else if (type == NGHTTP2_GOAWAY) {
        ++goaways_;
      } else if (type == NGHTTP2_WINDOW_UPDATE && len == 4) {
        (stream == 0 ? connection_window_ : stream_window_) += u32(b) & 0x7fffffffu;
      }
      in_.erase(0, 9 + len);
    }
  }
  int goaways() const { return goaways_; }
  // What stream 1 may still send.
  int64_t send_window() const { return std::min(stream_window_, connection_window_); }
  void Sent(size_t n) {
    stream_window_ -= static_cast<int64_t>(n);
    connection_window_ -= static_cast<int64_t>(n);
  }

  // Whether the router closed the connection (EOF or reset) within `wait`;
  // what it sent is read and dropped.
  bool Closed(milliseconds wait) {
    pollfd p{sock_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return false;
    char buf[4096];
    return ::recv(sock_.native_handle(), buf, sizeof buf, 0) <= 0;
  }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket sock_;
  std::string in_;
  int goaways_ = 0;
  int64_t stream_window_ = 65535;
  int64_t connection_window_ = 65535;
};

// A call whose client sent its headers and stops short of its body holds
// no call yet: its connection is closed after body_timeout, not kept for
// a response time.
TEST_F(RouterGrpcTest, ARequestWhoseBodyStallsIsClosedAfterBodyTimeout) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.body_timeout = milliseconds(400);
    c.limits.response_timeout = milliseconds(30000);
  });
  RawH2 raw(r->port());
  raw.Open("ModelInfer", "");
  // Read until the router closes (EOF or reset), for 10 s at most.
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    closed = raw.Closed(milliseconds(100));
  }
  EXPECT_TRUE(closed) << "the connection outlived body_timeout by 10 s";
  EXPECT_EQ(a_->counters().success.load() + b_->counters().success.load(), 0u);
}

// Adversarial finding: a client that never ends its request but sends a
// PING a second re-armed body_timeout with each, and held its window of
// request bytes for ever. body_timeout counts from the request's last
// bytes; frames that carry none do not hold it open.
TEST_F(RouterGrpcTest, PingsDoNotHoldARequestThatNeverEnds) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.body_timeout = milliseconds(400);
    c.limits.idle_timeout = milliseconds(30000);
  });
  RawH2 raw(r->port());
  const auto start = std::chrono::steady_clock::now();
  raw.Open("ModelInfer", std::string("\0\0\0\0\x64", 5) + std::string(10, 'x'));
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    raw.Write(testing::Frame(NGHTTP2_PING, 0, 0, std::string(8, 'p')));
    closed = raw.Closed(milliseconds(100));
  }
  EXPECT_TRUE(closed) << "PINGs every 100 ms held a request past body_timeout for 5 s";
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(400));
}

// A stream whose client stops inside a message waits body_timeout for the
// rest, not idle_timeout, and ends stream_idle.
TEST_F(RouterGrpcTest, AStreamWhoseClientStopsInsideAMessageEndsAfterBodyTimeout) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.body_timeout = milliseconds(300);
    c.limits.idle_timeout = milliseconds(30000);
  });
  RawH2 raw(r->port());
  // A message that says it has 100 bytes, and 10 of them.
  raw.Open("ModelStreamInfer", std::string("\0\0\0\0\x64", 5) + std::string(10, 'x'));
  const std::string ended = R"(responses_total{source="router",code="408",reason="stream_idle"})";
  const auto start = std::chrono::steady_clock::now();
  while (Metric(ended, r.get()) < 1 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    raw.Closed(milliseconds(50));
  }
  EXPECT_EQ(Metric(ended, r.get()), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
}

// Between calls a connection waits idle_timeout, not body_timeout: an
// answered call's stream does not await its request, even while it is
// still open (a client that sends nothing after its answer: no
// WINDOW_UPDATE, no PING, to re-arm the deadline).
TEST_F(RouterGrpcTest, BetweenCallsAConnectionWaitsIdleTimeoutNotBodyTimeout) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.body_timeout = milliseconds(300);
    c.limits.idle_timeout = milliseconds(30000);
  });
  RawH2 raw(r->port());
  auto img = Image(5, 4, 1);
  std::string message;
  ASSERT_TRUE(worker::MakeGrpcInferRequest("u1", img, nullptr, 5, 4).SerializeToString(&message));
  const uint32_t n = static_cast<uint32_t>(message.size());
  std::string data = {'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                      static_cast<char>(n >> 8), static_cast<char>(n)};
  raw.Open("ModelInfer", data + message, /*end=*/true);
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < milliseconds(1500)) {
    closed = raw.Closed(milliseconds(100));
  }
  EXPECT_FALSE(closed) << "closed after its call, before idle_timeout";
  EXPECT_EQ(a_->counters().success.load(), 1u);  // the call was answered
}

// A stream holds a slot of its tenant's concurrent quota while it is open:
// a call beside it over the quota is RESOURCE_EXHAUSTED, naming it; once
// the stream ends the slot is free.
TEST_F(RouterGrpcTest, ACallOverTheTenantsQuotaIsResourceExhausted) {
  auto r = StartAnother([](RouterConfig& c) { c.tenants[0].max_concurrent = 1; });
  {
    grpc::ClientContext ctx;
    auto stream = Cam1Stream(*stub_, ctx);
    auto img = Image(5, 4, 1);
    ASSERT_TRUE(stream->Write(worker::MakeGrpcInferRequest("f1", img, nullptr, 5, 4)));
    inference::ModelStreamInferResponse got;
    ASSERT_TRUE(stream->Read(&got));  // admitted: it holds the slot
    Result over = Infer(2);
    EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(over.status.error_message().find("quota"), std::string::npos)
        << over.status.error_message();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  EXPECT_TRUE(Eventually([&] { return Infer(3).status.ok(); }));  // the slot is free again
}

TEST_F(RouterGrpcTest, AStreamGoesOnOnTheStandbyWhenThePrimaryCrashes) {
  StreamAround(
      *stub_, 10, [this] { a_.reset(); }, 10);
  EXPECT_EQ(b_->counters().success.load(), 10u);  // the rest, once each
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 1);
}

TEST_F(RouterGrpcTest, AStreamGoesOnOnTheStandbyWhenThePrimaryIsStuck) {
  // The unanswered frame is sent again to the standby: answered once.
  StreamAround(
      *stub_, 5, [this] { Fault(*a_, "stuck"); }, 5);
  EXPECT_EQ(a_->counters().success.load(), 5u);
  EXPECT_EQ(b_->counters().success.load(), 5u);
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 1);
}

TEST_F(RouterGrpcTest, AStreamOutlivesTheUpstreamsItBeganWith) {
  // A camera's stream stays open across faults: a fails, the stream goes on
  // on b; the controller's new routes then make b the primary and c the
  // standby, and when b fails too the stream goes on on c, where its route
  // points now, though c was no upstream of it when it began.
  auto c = StartWorker("c");
  ASSERT_TRUE(c.ok()) << c.status();
  StreamAround(
      *stub_, 5,
      [&] {
        a_.reset();
        MoveRoute(*b_, **c);
      },
      5, [&] { b_.reset(); }, 5);
  EXPECT_EQ((*c)->counters().success.load(), 5u);  // the last five, once each
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 2);
}

TEST_F(RouterGrpcTest, AStreamWhoseStandbyMovedGoesOnWhereItsRouteNowPoints) {
  // The stream begins on a, b its standby. b is fenced (an XID flood's
  // second node) and the routes give a the standby c; when a fails too, the
  // stream goes on on c, not on the b it was admitted with.
  auto c = StartWorker("c");
  ASSERT_TRUE(c.ok()) << c.status();
  StreamAround(
      *stub_, 5,
      [&] {
        b_.reset();
        MoveRoute(*a_, **c);
      },
      5, [&] { a_.reset(); }, 5);
  EXPECT_EQ((*c)->counters().success.load(), 5u);  // the last five, once each
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 1);
}

TEST_F(RouterGrpcTest, AnAnswerOverTheBodyLimitIsResourceExhaustedNotRetried) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.max_body_bytes = 64;  // a cv answer is about 150 bytes
  });
  Result res = Infer(1);
  EXPECT_EQ(res.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(res.status.error_message().find("response over 64 bytes"), std::string::npos)
      << res.status.error_message();
  EXPECT_EQ(b_->counters().success.load(), 0u);  // not re-sent to the standby
}

// Adversarial finding: a unary call's body over max_request_bytes could
// never get RESOURCE_EXHAUSTED (its stream's window equalled the limit: the
// client stalled at it, and the call ended at body_timeout).
TEST_F(RouterGrpcTest, ARequestOverTheBodyLimitIsResourceExhaustedAtOnce) {
  auto r = StartAnother([](RouterConfig& c) {
    c.limits.retry_buffer_bytes = 1 << 20;
    c.limits.body_timeout = milliseconds(30000);
  });
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata("x-api-key", "k-acme");
  ctx.AddMetadata("x-gpuha-stream", "cam-1");
  inference::ModelInferRequest req =
      worker::MakeGrpcInferRequest("big", Image(6, 5, 1), nullptr, 6, 5);
  req.add_raw_input_contents(std::string((1 << 20) + 100, 'x'));
  inference::ModelInferResponse resp;
  const auto start = std::chrono::steady_clock::now();
  grpc::Status st = stub_->ModelInfer(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("request body over 1048576 bytes"), std::string::npos)
      << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(a_->counters().success.load() + b_->counters().success.load(), 0u);
}

// A decoupled model, as Triton serves one with a decoupled transaction
// policy: two answers for each request. A request with id "last" is
// answered, and then the engine dies (UNAVAILABLE).
class DecoupledModel final : public inference::GRPCInferenceService::Service {
  grpc::Status ModelStreamInfer(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<inference::ModelStreamInferResponse, inference::ModelInferRequest>*
          stream) override {
    inference::ModelInferRequest r;
    while (stream->Read(&r)) {
      for (int k = 0; k < 2; ++k) {
        inference::ModelStreamInferResponse a;
        a.mutable_infer_response()->set_id(absl::StrCat(r.id(), "/", k));
        if (!stream->Write(a)) return grpc::Status::OK;
      }
      if (r.id() == "last") return grpc::Status(grpc::StatusCode::UNAVAILABLE, "engine died");
    }
    return grpc::Status::OK;
  }
};

TEST_F(RouterGrpcTest, ADecoupledModelsBrokenStreamEndsUnavailableAndSaysWhy) {
  DecoupledModel model;
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeModel(model, &port);
  ASSERT_GT(port, 0);
  // Its health through a's HTTP port; its calls to the decoupled model.
  StaticRoute route{"cam-1", "acme", Http(*a_), Http(*b_)};
  route.primary_grpc = absl::StrCat("127.0.0.1:", port);
  route.standby_grpc = Grpc(*b_);
  RouterConfig with = config_;
  with.routes = {route};
  Router r(with);
  ASSERT_TRUE(r.Start().ok());
  auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", r.port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(*stub, ctx);
  std::vector<std::string> ids;
  for (const char* id : {"x1", "last"}) {
    inference::ModelInferRequest req;
    req.set_id(id);
    ASSERT_TRUE(stream->Write(req));
    for (int k = 0; k < 2; ++k) {  // both answers of each, relayed as they come
      inference::ModelStreamInferResponse a;
      ASSERT_TRUE(stream->Read(&a)) << id << " " << k;
      ids.push_back(a.infer_response().id());
    }
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"x1/0", "x1/1", "last/0", "last/1"}));
  inference::ModelStreamInferResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  grpc::Status st = stream->Finish();
  // Not continued on the standby (its answers would not line up): ended,
  // retryable by the client, and saying so.
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("the model is decoupled"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(b_->counters().success.load(), 0u);
  server->Shutdown();
}

// A drain tells an HTTP/2 client in two GOAWAYs (nghttp2's shutdown
// notice, then the last stream taken) and the connection, with no stream
// open, ends; unary calls in flight are answered first.
TEST_F(RouterGrpcTest, ADrainSendsHttp2ClientsGoAwayAndEndsTheirConnections) {
  auto r = StartAnother([](RouterConfig&) {});
  RawH2 raw(r->port());
  raw.OpenWith({}, "ModelInfer");  // a stream that never sends its body: reset below
  raw.Write(testing::Frame(NGHTTP2_RST_STREAM, 0, 1, std::string("\0\0\0\x08", 4)));
  ASSERT_TRUE(raw.ReadWindows(milliseconds(200)));
  auto drained = std::async(std::launch::async, [&] { r->Drain(milliseconds(20000)); });
  const auto start = std::chrono::steady_clock::now();
  bool open = true;
  while (open && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    open = raw.ReadWindows(milliseconds(50));
  }
  EXPECT_FALSE(open) << "the connection outlived the drain's GOAWAY by 5 s";
  EXPECT_EQ(raw.goaways(), 2);
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  // A call in flight at a drain is answered (a stuck primary: it waits,
  // then goes to the standby), and a new connection is not taken.
  auto r2 = StartAnother([](RouterConfig&) {});
  Fault(*a_, "stuck");
  auto call = std::async(std::launch::async, [&] { return Infer(7); });
  std::this_thread::sleep_for(milliseconds(50));
  r2->Drain(milliseconds(20000));
  EXPECT_TRUE(call.get().status.ok());
  Fault(*a_, "none");
}

// A drain ends a ModelStreamInfer stream at its first quiet moment (no
// answer owed), UNAVAILABLE and naming the drain, so the client opens it
// again elsewhere and no message is cut by the drain's timeout.
TEST_F(RouterGrpcTest, ADrainEndsAStreamBetweenMessagesNotInOne) {
  auto r = StartAnother([](RouterConfig&) {});
  grpc::ClientContext ctx;
  auto stream = Cam1Stream(*stub_, ctx);
  auto img = Image(5, 4, 1);
  inference::ModelStreamInferResponse got;
  ASSERT_TRUE(stream->Write(worker::MakeGrpcInferRequest("f1", img, nullptr, 5, 4)));
  ASSERT_TRUE(stream->Read(&got));
  // A message owed when the drain begins is answered first.
  Fault(*a_, "slow&factor=150");  // 300 ms
  ASSERT_TRUE(stream->Write(worker::MakeGrpcInferRequest("f2", img, nullptr, 5, 4)));
  std::this_thread::sleep_for(milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  auto drained = std::async(std::launch::async, [&] { r->Drain(milliseconds(20000)); });
  ASSERT_TRUE(stream->Read(&got));
  EXPECT_EQ(got.infer_response().id(), "f2");
  EXPECT_FALSE(stream->Read(&got));  // then the stream ends
  grpc::Status st = stream->Finish();
  Fault(*a_, "none");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("draining"), std::string::npos) << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

// A model whose every answer is 64 KiB: a client's small messages ask for
// much more than they weigh.
class BigAnswerModel final : public inference::GRPCInferenceService::Service {
 public:
  std::atomic<int> asked{0};
  grpc::Status ModelStreamInfer(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<inference::ModelStreamInferResponse, inference::ModelInferRequest>*
          stream) override {
    inference::ModelInferRequest r;
    while (stream->Read(&r)) {
      ++asked;
      inference::ModelStreamInferResponse a;
      a.mutable_infer_response()->set_id(r.id());
      a.mutable_infer_response()->add_raw_output_contents(std::string(64 << 10, 'x'));
      if (!stream->Write(a)) break;
    }
    return grpc::Status::OK;
  }
};

// Adversarial finding: a stream whose client keeps its window shut
// (SETTINGS_INITIAL_WINDOW_SIZE 0) and sends small messages grew the
// router's memory without bound, every answer held for it and its
// messages' window given back at once. Now its window comes back only as
// it reads: the messages asked of the model, and the answers held, stop.
TEST_F(RouterGrpcTest, AClientThatReadsNoneOfItsAnswersIsHeldByItsWindow) {
  BigAnswerModel model;
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeModel(model, &port);
  ASSERT_GT(port, 0);
  auto r = StartAnother([&](RouterConfig& c) {
    StaticRoute route{"cam-1", "acme", Http(*a_), Http(*b_)};
    route.primary_grpc = absl::StrCat("127.0.0.1:", port);
    route.standby_grpc = Grpc(*b_);
    c.routes = {route};
    c.limits.body_timeout = milliseconds(30000);
  });
  RawH2 raw(r->port());
  raw.OpenWith({{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 0}}, "ModelStreamInfer");
  inference::ModelInferRequest req;
  req.set_id("m");
  std::string message;
  ASSERT_TRUE(req.SerializeToString(&message));
  const std::string one =
      std::string({'\0', '\0', '\0', '\0', static_cast<char>(message.size())}) + message;
  const std::string batch = [&] {
    std::string b;
    for (int i = 0; i < 256; ++i) b += one;
    return b;
  }();
  // For 3 s, as many messages as the router's windows let it send.
  size_t sent = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    ASSERT_TRUE(raw.ReadWindows(milliseconds(5))) << "the router closed the connection";
    if (raw.send_window() >= static_cast<int64_t>(batch.size())) {
      raw.Write(testing::Frame(NGHTTP2_DATA, 0, 1, batch));
      raw.Sent(batch.size());
      sent += 256;
    }
  }
  // Asked of the model: 128 at once at most, one more as each is answered
  // until 1 MiB of answers (16 of them) wait unread, and then none.
  EXPECT_LE(model.asked.load(), 128 + 16) << sent << " messages sent";
  EXPECT_GT(model.asked.load(), 0);
  server->Shutdown(std::chrono::system_clock::now() + milliseconds(100));
}

TEST_F(RouterGrpcTest, H2OverTlsIsChosenByAlpn) {
  const std::string dir = gpuha::testing::TestTempDir().string();
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir));
  RouterConfig tls = config_;
  tls.tls_cert = dir + "/server.pem";
  tls.tls_key = dir + "/server.key";
  Router r(tls);
  ASSERT_TRUE(r.Start().ok());
  std::ifstream ca_file(dir + "/ca.pem");
  std::string ca((std::istreambuf_iterator<char>(ca_file)), std::istreambuf_iterator<char>());
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = ca;
  // gRPC offers h2 by ALPN; the router chooses it on its one TLS port.
  stub_ = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", r.port()), grpc::SslCredentials(opts)));
  for (int i = 0; i < 5; ++i) {
    Result res = Infer(i);
    ASSERT_TRUE(res.status.ok()) << res.status.error_message();
    EXPECT_EQ(res.node, "a");
  }
  std::string text = r.MetricsText();
  EXPECT_NE(text.find("\ngpuha_router_grpc_calls_total 5"), std::string::npos);
}

TEST_F(RouterGrpcTest, UnavailableIsAskedOfTheStandby) {
  Fault(*a_, "cut");  // the worker answers UNAVAILABLE
  for (int i = 0; i < 10; ++i) {
    Result r = Infer(i);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.node, "b");
  }
}

TEST_F(RouterGrpcTest, AServerErrorIsAskedOfTheStandbyAndTheLastOneRelayed) {
  // INTERNAL (a CUDA error) is a server's failure, as an HTTP 500 is: the
  // standby is asked. From the last upstream it is relayed as it is.
  Fault(*a_, "errors");
  Result r = Infer(1);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.node, "b");
  Fault(*b_, "errors");
  r = Infer(2);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(r.status.error_message().find("worker fault 'errors'"), std::string::npos);
}

TEST_F(RouterGrpcTest, AStreamMessageAnsweredWithAnErrorIsAskedOfTheStandby) {
  // Triton answers a failed request of a stream with error_message and goes
  // on: the router takes that for the upstream failing, and the stream goes
  // on on the standby with that message, so every frame gets a result.
  StreamAround(
      *stub_, 5, [this] { Fault(*a_, "errors"); }, 5);
  EXPECT_EQ(a_->counters().success.load(), 5u);
  EXPECT_EQ(b_->counters().success.load(), 5u);
  EXPECT_EQ(Metric("grpc_stream_continuations_total"), 1);
}

TEST_F(RouterGrpcTest, TheClientsDeadlineIsKept) {
  Fault(*a_, "stuck");
  Fault(*b_, "stuck");
  auto start = std::chrono::steady_clock::now();
  Result r = Infer(1, "k-acme", "cam-1", milliseconds(400));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1400));
  Fault(*a_, "none");
  Fault(*b_, "none");
}

TEST(StreamAnswerTest, AnErrorAnswerIsToldFromAResultByItsErrorMessage) {
  auto framed = [](const google::protobuf::Message& m) {
    std::string body = m.SerializeAsString();
    std::string out(5, '\0');
    for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<char>(body.size() >> (24 - 8 * i));
    return out + body;
  };
  inference::ModelStreamInferResponse ok;
  auto img = Image(4, 4, 1);
  worker::ToGrpc("r1", worker::ComputeCv(img.data(), nullptr, 4, 4, 3),
                 ok.mutable_infer_response());
  EXPECT_FALSE(StreamAnswerIsError(framed(ok)));
  inference::ModelStreamInferResponse failed;
  failed.set_error_message("inference failed: CUDA error");
  EXPECT_TRUE(StreamAnswerIsError(framed(failed)));
  // Field order does not matter; an empty answer is no error.
  inference::ModelInferResponse small;
  small.set_id("r1");
  std::string both = small.SerializeAsString();
  std::string reordered =
      "\x12" + std::string(1, static_cast<char>(both.size())) + both + "\x0a\x03" + "bad";
  ASSERT_LT(both.size(), 128u);
  std::string prefix(5, '\0');
  prefix[4] = static_cast<char>(reordered.size());
  EXPECT_TRUE(StreamAnswerIsError(prefix + reordered));
  EXPECT_FALSE(StreamAnswerIsError(framed(inference::ModelStreamInferResponse())));
  // Not judged: compressed, truncated, or not protobuf.
  std::string compressed = framed(failed);
  compressed[0] = 1;
  EXPECT_FALSE(StreamAnswerIsError(compressed));
  EXPECT_FALSE(StreamAnswerIsError(framed(failed).substr(0, 8)));
  EXPECT_FALSE(StreamAnswerIsError(std::string("\0\0\0\0\x02\x0b\x01", 7)));
  EXPECT_FALSE(StreamAnswerIsError(""));
}

// A model behind TLS: each answer's model_name is the common name of the
// client certificate it was called with.
class TlsEchoModel final : public inference::GRPCInferenceService::Service {
 public:
  std::atomic<int> calls{0};  // unary
  static std::string PeerName(grpc::ServerContext* ctx) {
    std::vector<grpc::string_ref> cn = ctx->auth_context()->FindPropertyValues("x509_common_name");
    return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
  }
  grpc::Status ModelInfer(grpc::ServerContext* ctx, const inference::ModelInferRequest* req,
                          inference::ModelInferResponse* resp) override {
    ++calls;
    resp->set_id(req->id());
    resp->set_model_name(PeerName(ctx));
    return grpc::Status::OK;
  }
  grpc::Status ModelStreamInfer(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<inference::ModelStreamInferResponse, inference::ModelInferRequest>*
          stream) override {
    inference::ModelInferRequest r;
    while (stream->Read(&r)) {
      inference::ModelStreamInferResponse a;
      a.mutable_infer_response()->set_id(r.id());
      a.mutable_infer_response()->set_model_name(PeerName(ctx));
      if (!stream->Write(a)) break;
    }
    return grpc::Status::OK;
  }
};

// A gRPC server of `model` that speaks only TLS, with the server certificate
// of the test CA in `dir`; with `client_cert`, it requires a client
// certificate of that CA.
std::unique_ptr<grpc::Server> ServeModelOverTls(grpc::Service& model, const std::string& dir,
                                                bool client_cert, int* port) {
  auto read = [&](const char* f) {
    std::ifstream in(dir + "/" + f);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  grpc::SslServerCredentialsOptions opts(
      client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  opts.pem_root_certs = read("ca.pem");
  opts.pem_key_cert_pairs.push_back({read("server.key"), read("server.pem")});
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(opts), port);
  builder.RegisterService(&model);
  return builder.BuildAndStart();
}

// TLS to upstreams' gRPC ports: with upstream_tls, unary and streaming calls
// go to the upstream over TLS (HTTP/2 chosen by ALPN, which gRPC requires),
// its certificate checked against upstream_tls.ca and the router's own
// presented, as for HTTP/1.1 upstreams. The upstreams are grpc++'s own TLS
// servers. A primary whose gRPC port shows another CA's certificate fails
// the call over to the standby.
TEST_F(RouterGrpcTest, CallsToATlsUpstreamPresentTheRoutersCertificate) {
  const std::string dir = (gpuha::testing::TestTempDir() / "ca").string();
  const std::string other = (gpuha::testing::TestTempDir() / "other-ca").string();
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(other);
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir));
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(other));
  // The upstreams' HTTP ports (which the prober reads), over TLS too.
  std::vector<std::unique_ptr<testing::TestBackend>> http;
  for (const char* name : {"p", "q", "s"}) {
    auto b = testing::TestBackend::Start({.name = name,
                                          .tls_cert = dir + "/server.pem",
                                          .tls_key = dir + "/server.key",
                                          .tls_client_ca = dir + "/ca.pem"});
    ASSERT_TRUE(b.ok()) << b.status();
    http.push_back(std::move(*b));
  }
  TlsEchoModel good_model, stranger_model;
  int good = 0, stranger = 0;
  std::unique_ptr<grpc::Server> good_server = ServeModelOverTls(good_model, dir, true, &good);
  // Another CA's certificate, and no client certificate asked: only the
  // router's check of the server's certificate can refuse it.
  std::unique_ptr<grpc::Server> stranger_server =
      ServeModelOverTls(stranger_model, other, false, &stranger);
  ASSERT_GT(good, 0);
  ASSERT_GT(stranger, 0);
  auto r = StartAnother([&](RouterConfig& c) {
    StaticRoute secure{"cam-1", "acme", http[0]->address(), ""};
    secure.primary_grpc = absl::StrCat("127.0.0.1:", good);
    StaticRoute wrong_ca{"cam-2", "acme", http[1]->address(), http[2]->address()};
    wrong_ca.primary_grpc = absl::StrCat("127.0.0.1:", stranger);
    wrong_ca.standby_grpc = absl::StrCat("127.0.0.1:", good);
    c.routes = {secure, wrong_ca};
    c.upstream_ca = dir + "/ca.pem";
    c.upstream_cert = dir + "/agent.pem";
    c.upstream_key = dir + "/agent.key";
  });
  auto unary = [&](const std::string& stream, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("x-api-key", "k-acme");
    ctx.AddMetadata("x-gpuha-stream", stream);
    inference::ModelInferRequest req;
    req.set_id(id);
    inference::ModelInferResponse resp;
    grpc::Status st = stub_->ModelInfer(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << stream << ": " << st.error_message();
    EXPECT_EQ(resp.id(), id);
    return resp.model_name();
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(unary("cam-1", absl::StrCat("u", i)), "agent");
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-api-key", "k-acme");
    ctx.AddMetadata("x-gpuha-stream", "cam-1");
    auto stream = stub_->ModelStreamInfer(&ctx);
    for (int i = 0; i < 3; ++i) {
      inference::ModelInferRequest req;
      req.set_id(absl::StrCat("s", i));
      ASSERT_TRUE(stream->Write(req));
      inference::ModelStreamInferResponse a;
      ASSERT_TRUE(stream->Read(&a));
      EXPECT_EQ(a.infer_response().id(), absl::StrCat("s", i));
      EXPECT_EQ(a.infer_response().model_name(), "agent");
    }
    stream->WritesDone();
    grpc::Status st = stream->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  // The primary's certificate is not of the CA the router trusts: its call
  // is answered by the standby, and the primary's model never saw it.
  EXPECT_EQ(unary("cam-2", "w"), "agent");
  EXPECT_EQ(stranger_model.calls.load(), 0);
  EXPECT_EQ(good_model.calls.load(), 4);
}

}  // namespace
}  // namespace gpuha::router
