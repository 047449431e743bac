// gpuha load against a TestBackend on loopback: the stall metric leaves
// deliberately slow requests out and counts failures in.
#include "load/load.h"

#include <gtest/gtest.h>

#include "common/net_util.h"
#include "router/router.h"
#include "router/testing/test_backend.h"
#include "worker/worker.h"

namespace gpuha::load {
namespace {

using std::chrono::milliseconds;

LoadOptions Options(uint16_t port) {
  LoadOptions o;
  o.port = port;
  o.streams = 2;
  o.rate = 100;
  o.duration = milliseconds(1500);
  o.timeout = milliseconds(5000);
  o.progress = false;
  return o;
}

TEST(LoadTest, SlowRequestsLeaveHolesInAnswersButNoStall) {
  auto backend = router::testing::TestBackend::Start({.name = "b"});
  ASSERT_TRUE(backend.ok()) << backend.status();
  LoadOptions o = Options((*backend)->port());
  o.slow_fraction = 0.5;
  o.slow_query = "delay_ms=600";
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->failed, 0u) << r->Json();
  ASSERT_GT(r->slow_sent, 10u);
  EXPECT_EQ(r->slow_ok, r->slow_sent);  // all answered within the grace
  // Fast requests answer in about a millisecond; the 600 ms ones are not
  // anybody's stall. (Their holes show in max_gap_ms instead.)
  EXPECT_LT(r->max_stall_ms, 600) << r->Json();
  EXPECT_NE(r->Json().find("\"max_stall_ms\":"), std::string::npos);
}

TEST(LoadTest, FailuresStallTheStreamUntilAnAnswer) {
  LoadOptions o = Options(common::FreeLoopbackPort());  // nothing listens: every request fails
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 0u);
  EXPECT_EQ(r->failed, r->sent);
  // The streams waited from their first request to the end of the run.
  EXPECT_GT(r->max_stall_ms, 1000) << r->Json();
  EXPECT_LE(r->max_stall_ms, 1500.5) << r->Json();
}

// Streamed completions through a router to a worker: every answer checked
// and timed; with the worker cutting answers and no standby, each cut one
// is a failure that says how it ended.
TEST(LoadTest, SseAnswersAreCheckedAndTimed) {
  worker::WorkerOptions wo;
  wo.port = 0;
  wo.ttft = milliseconds(10);
  wo.token_latency = milliseconds(2);
  auto w = worker::Worker::Start(wo);
  ASSERT_TRUE(w.ok()) << w.status();
  router::RouterConfig rc;
  rc.listen = {"127.0.0.1", 0};
  rc.admin = {"127.0.0.1", 0};
  rc.threads = 1;
  rc.auth_none = true;
  rc.probe_interval = milliseconds(0);
  std::string up = "127.0.0.1:" + std::to_string((*w)->port());
  rc.routes = {{"llm-0", "", up, ""}, {"llm-1", "", up, ""}};
  router::Router r(rc);
  ASSERT_TRUE(r.Start().ok());
  LoadOptions o = Options(r.port());
  o.sse = true;
  o.path = "/v1/completions";
  o.stream_prefix = "llm-";
  o.rate = 0;
  o.concurrency = 4;
  o.duration = milliseconds(800);
  o.max_tokens = 16;
  auto rep = RunLoad(o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->failed, 0u) << rep->Json();
  ASSERT_GT(rep->ok, 4u);
  EXPECT_GT(rep->tokens, rep->ok);
  EXPECT_GE(rep->ttft_p50_ms, 9) << rep->Json();
  EXPECT_GT(rep->gap_p50_ms, 0) << rep->Json();
  EXPECT_NE(rep->Text().find("time to first token"), std::string::npos);
  EXPECT_NE(rep->Json().find("\"sse\":{\"tokens\":"), std::string::npos);
  // Answers cut with no standby end with the router's error event.
  (*w)->Stop();
  wo.fault = *worker::ParseWorkerFault("cut");
  wo.ttft = milliseconds(0);
  auto cutting = worker::Worker::Start(wo);
  ASSERT_TRUE(cutting.ok());
  rc.routes = {{"llm-0", "", "127.0.0.1:" + std::to_string((*cutting)->port()), ""}};
  router::Router r2(rc);
  ASSERT_TRUE(r2.Start().ok());
  o.port = r2.port();
  o.streams = 1;
  o.concurrency = 1;
  o.duration = milliseconds(200);
  auto bad = RunLoad(o);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->ok, 0u) << bad->Json();
  EXPECT_GT(bad->failed, 0u);
  EXPECT_EQ(bad->failures.begin()->first, "error event") << bad->Json();
  EXPECT_FALSE(RunLoad([&] {
                 LoadOptions x = o;
                 x.max_tokens = 0;
                 return x;
               }())
                   .ok());
}

TEST(LoadTest, GrpcCallsAreCheckedAndCountedByNode) {
  worker::WorkerOptions wo;
  wo.port = 0;
  wo.grpc_port = 0;
  wo.node = "w1";
  wo.latency = milliseconds(1);
  auto w = worker::Worker::Start(wo);
  ASSERT_TRUE(w.ok()) << w.status();
  router::RouterConfig rc;
  rc.listen = {"127.0.0.1", 0};
  rc.admin = {"127.0.0.1", 0};
  rc.threads = 1;
  rc.auth_none = true;
  rc.probe_interval = milliseconds(0);
  const std::string http = "127.0.0.1:" + std::to_string((*w)->port());
  const std::string grpc = "127.0.0.1:" + std::to_string((*w)->grpc_port());
  router::StaticRoute cam{"cam-0", "", http, ""};
  cam.primary_grpc = grpc;
  router::StaticRoute http_only{"cam-1", "", http, ""};
  rc.routes = {cam};
  router::Router r(rc);
  ASSERT_TRUE(r.Start().ok());
  LoadOptions o = Options(r.port());
  o.grpc = true;
  o.streams = 1;
  o.rate = 0;
  o.concurrency = 4;
  o.duration = milliseconds(600);
  o.image_side = 8;
  auto rep = RunLoad(o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->failed, 0u) << rep->Json();
  ASSERT_GT(rep->ok, 10u);
  EXPECT_EQ(rep->served_by["w1"], rep->ok);
  EXPECT_EQ((*w)->counters().success.load(), rep->ok);
  // A stream with no gRPC port fails every call, named by its status.
  rc.routes = {http_only};
  router::Router r2(rc);
  ASSERT_TRUE(r2.Start().ok());
  o.port = r2.port();
  o.stream_prefix = "cam-";
  o.duration = milliseconds(200);
  o.streams = 2;  // cam-0 is unknown to r2, cam-1 has no gRPC port
  auto bad = RunLoad(o);
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->ok, 0u) << bad->Json();
  EXPECT_GT(bad->failures["grpc NOT_FOUND"], 0u) << bad->Json();
  EXPECT_GT(bad->failures["grpc UNAVAILABLE"], 0u) << bad->Json();
}

}  // namespace
}  // namespace gpuha::load
