// REST and SSE over HTTP/2, from curl as it comes (HTTP/2 by ALPN over TLS,
// and h2c with prior knowledge), through the router in-process to two real
// gpuha workers: the same answers, failover and continuation as over
// HTTP/1.1 (an issue found every HTTP/2 client answered 415).
#include <gtest/gtest.h>

#include <cstdio>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net_util.h"
#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_certs.h"
#include "router/router.h"
#include "router/testing/llm_workers.h"
#include "worker/llm.h"
#include "worker/worker.h"

namespace gpuha::router {
namespace {

using gpuha::testing::Eventually;
using std::chrono::milliseconds;

struct Curl {
  int exit_code = -1;
  std::string version;  // "2", "1.1"
  int status = 0;
  std::string body;
};

// curl with `args`; its body, then the HTTP version and status it saw.
Curl RunCurl(const std::string& args) {
  const std::string cmd =
      absl::StrCat("curl -s -N --max-time 20 -w '\\n@@%{http_version} %{http_code}' ", args);
  Curl c;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  std::string out;
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  c.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  const size_t at = out.rfind("\n@@");
  if (at == std::string::npos) return c;
  c.body = out.substr(0, at);
  std::string tail = out.substr(at + 3);
  c.version = tail.substr(0, tail.find(' '));
  c.status = std::atoi(tail.c_str() + tail.find(' ') + 1);
  return c;
}

std::string CompletionBody(const std::string& prompt, int max_tokens) {
  return absl::StrCat(R"({"model":"gpuha-tiny","stream":true,"max_tokens":)", max_tokens,
                      R"(,"stream_options":{"include_usage":true},"prompt":")", prompt, R"("})");
}

class RouterH2RestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::StartLlmWorkers(&a_, &b_);
    if (HasFatalFailure()) return;
    dir_ = gpuha::testing::TestTempDir().string();
    ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir_));
    RouterConfig c;
    c.listen = {"127.0.0.1", 0};
    c.admin = {"127.0.0.1", 0};
    c.threads = 2;
    c.tenants.push_back({"acme", {common::Sha256Hex("k1")}, 0, 0, 0});
    c.limits.retry_buffer_bytes = 64 * 1024;
    c.progress.floor = milliseconds(1000);  // a loaded CI machine is no stall
    c.routes = {{"s1", "acme", Address(*a_), Address(*b_)}};
    plain_ = std::make_unique<Router>(c);
    ASSERT_TRUE(plain_->Start().ok());
    c.tls_cert = dir_ + "/server.pem";
    c.tls_key = dir_ + "/server.key";
    tls_ = std::make_unique<Router>(c);
    ASSERT_TRUE(tls_->Start().ok());
  }
  static std::string Address(const worker::Worker& w) {
    return absl::StrCat("127.0.0.1:", w.port());
  }
  // curl as it comes: HTTP/2 by ALPN over TLS.
  Curl OverTls(const std::string& path, const std::string& more = "") {
    return RunCurl(absl::StrCat("--cacert ", dir_, "/ca.pem -H 'X-Api-Key: k1' ", more,
                                " https://127.0.0.1:", tls_->port(), "/streams/s1", path));
  }
  // h2c, prior knowledge.
  Curl OverH2c(const std::string& path, const std::string& more = "") {
    return RunCurl(absl::StrCat("--http2-prior-knowledge -H 'X-Api-Key: k1' ", more,
                                " http://127.0.0.1:", plain_->port(), "/streams/s1", path));
  }
  static void ExpectWholeAnswer(const Curl& c, const std::string& prompt, int max_tokens) {
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(c.version, "2");
    worker::LlmRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    worker::LlmAnswer want = worker::Complete(r);
    auto got = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, c.body);
    ASSERT_TRUE(got.ok()) << got.status() << "\n" << c.body;
    EXPECT_EQ(got->text, want.text);
    EXPECT_EQ(got->completion_tokens, want.completion_tokens);
  }

  std::unique_ptr<worker::Worker> a_, b_;
  std::string dir_;
  std::unique_ptr<Router> plain_, tls_;
};

TEST_F(RouterH2RestTest, KServeRestAndAnSseCompletionOverTlsAndH2c) {
  for (bool tls : {true, false}) {
    auto over = [&](const std::string& path, const std::string& more) {
      return tls ? OverTls(path, more) : OverH2c(path, more);
    };
    Curl ready = over("/v2/health/ready", "");
    EXPECT_EQ(ready.exit_code, 0);
    EXPECT_EQ(ready.version, "2");
    EXPECT_EQ(ready.status, 200) << ready.body;
    Curl meta = over("/v2/models/cv", "");
    EXPECT_EQ(meta.status, 200);
    EXPECT_TRUE(absl::StrContains(meta.body, R"("name":"cv")")) << meta.body;
    Curl infer = over(
        "/v2/models/cv/infer",
        R"(-H 'content-type: application/json' -d '{"inputs":[{"name":"IMAGE","datatype":"UINT8","shape":[1,1,3],"data":[1,2,3]}]}')");
    EXPECT_EQ(infer.status, 200) << infer.body;
    EXPECT_TRUE(absl::StrContains(infer.body, "HISTOGRAM")) << infer.body;
    Curl sse = over("/v1/completions", "-H 'content-type: application/json' -d '" +
                                           CompletionBody("over http two", 40) + "'");
    ExpectWholeAnswer(sse, "over http two", 40);
  }
  // The tenant rules and the limits are the HTTP/1.1 path's, with its reasons.
  Curl wrong = RunCurl(absl::StrCat("--http2-prior-knowledge -H 'X-Api-Key: nope' -D - ",
                                    "http://127.0.0.1:", plain_->port(), "/streams/s1/v2"));
  EXPECT_EQ(wrong.status, 401);
  EXPECT_TRUE(absl::StrContains(wrong.body, "x-gpuha-error: unauthorized")) << wrong.body;
  // A body over limits.retry_buffer_bytes (64 KiB here): 413, as over HTTP/1.1.
  std::FILE* f = std::fopen((dir_ + "/big.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(std::string(100 * 1024, ' ').c_str(), f);
  std::fclose(f);
  Curl big = OverH2c("/v2/models/cv/infer", "-H 'content-type: application/json' --data-binary @" +
                                                dir_ + "/big.json -D -");
  EXPECT_EQ(big.status, 413) << big.body;
  EXPECT_TRUE(absl::StrContains(big.body, "body_too_large")) << big.body;
  // HTTP/1.1 on the same ports still works, of course.
  Curl h1 =
      RunCurl(absl::StrCat("--http1.1 --cacert ", dir_, "/ca.pem -H 'X-Api-Key: k1' ",
                           "https://127.0.0.1:", tls_->port(), "/streams/s1/v2/health/ready"));
  EXPECT_EQ(h1.version, "1.1");
  EXPECT_EQ(h1.status, 200);
}

TEST_F(RouterH2RestTest, FailoverAndContinuationAreTheHttp11PathsOverHttp2Too) {
  // The primary stopped: REST goes to the standby.
  a_->Stop();
  Curl r = OverTls("/v2/models/cv", "-D -");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "x-gpuha-node: b")) << r.body;
}

TEST_F(RouterH2RestTest, AnSseAnswerCutMidwayIsContinuedOnTheStandby) {
  // A prompt whose answer runs long enough to be cut partway.
  std::string prompt;
  for (int i = 0;; ++i) {
    prompt = absl::StrCat("continued over http two ", i);
    worker::LlmRequest r;
    r.prompt = prompt;
    r.max_tokens = 200;
    if (worker::Complete(r).completion_tokens >= 80) break;
  }
  std::future<Curl> f = std::async(std::launch::async, [&] {
    return OverTls("/v1/completions",
                   "-H 'content-type: application/json' -d '" + CompletionBody(prompt, 200) + "'");
  });
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 20; }));
  ASSERT_EQ(gpuha::testing::Send(a_->port(),
                                 "POST /v1/fault?mode=cut HTTP/1.1\r\nHost: w\r\n"
                                 "Content-Length: 0\r\n\r\n")
                .status,
            200);
  Curl c = f.get();
  ExpectWholeAnswer(c, prompt, 200);
  EXPECT_GT(b_->counters().generation_tokens.load(), 0u);
}

}  // namespace
}  // namespace gpuha::router
