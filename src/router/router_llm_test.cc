// The router in-process in front of two real gpuha workers serving the
// language model: token streams relayed as they come, and continued on the
// standby when the primary cuts, stalls or errs mid-answer. Every answer is
// checked against the model run locally.
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "router/router.h"
#include "router/testing/llm_workers.h"
#include "worker/llm.h"
#include "worker/worker.h"

namespace gpuha::router {
namespace {

using gpuha::testing::Eventually;
using gpuha::testing::Reply;
using gpuha::testing::Send;
using std::chrono::milliseconds;

double MetricValue(const std::string& text, const std::string& name) {
  size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

std::string Post(const std::string& target, const std::string& body,
                 const std::string& extra = "") {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n",
                      "Content-Length: ", body.size(), "\r\n", extra, "\r\n", body);
}

// A completion body, and what the model answers to it.
struct Ask {
  std::string body;
  worker::LlmAnswer want;
};
Ask Completion(const std::string& prompt, int max_tokens) {
  Ask a;
  a.body = absl::StrCat(R"({"model":"gpuha-tiny","stream":true,"max_tokens":)", max_tokens,
                        R"(,"stream_options":{"include_usage":true},"prompt":")", prompt, R"("})");
  worker::LlmRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  a.want = worker::Complete(r);
  return a;
}
// The first prompt from `seed` on whose answer runs at least `min_tokens`.
Ask LongCompletion(const std::string& seed, int max_tokens, int min_tokens) {
  for (int i = 0;; ++i) {
    Ask a = Completion(absl::StrCat(seed, " ", i), max_tokens);
    if (a.want.completion_tokens >= min_tokens) return a;
  }
}

class RouterLlmTest : public ::testing::Test {
 public:  // for the helpers below the fixture
  void SetUp() override {
    testing::StartLlmWorkers(&a_, &b_, strict_fields_);
    if (HasFatalFailure()) return;
    config_.listen = {"127.0.0.1", 0};
    config_.admin = {"127.0.0.1", 0};
    config_.threads = 2;
    config_.auth_none = true;
    config_.probe_interval = milliseconds(10);
    config_.hang_after = milliseconds(200);
    // One or two streams are judged by their tokens too: a scheduling pause
    // on a loaded CI machine (ASan) must not pass for a stall.
    config_.progress.floor = milliseconds(1000);
    config_.routes = {{"chat-1", "", Address(*a_), Address(*b_)}};
    router_ = std::make_unique<Router>(config_);
    ASSERT_TRUE(router_->Start().ok());
  }
  static std::string Address(const worker::Worker& w) {
    return absl::StrCat("127.0.0.1:", w.port());
  }
  void Fault(worker::Worker& w, const std::string& mode) {
    ASSERT_EQ(Send(w.port(), Post(absl::StrCat("/v1/fault?mode=", mode), "")).status, 200);
  }
  std::future<Reply> Start(const std::string& body, const std::string& extra = "",
                           const std::string& path = "/v1/completions") {
    return std::async(std::launch::async, [this, body, extra, path] {
      return Send(router_->port(), Post("/streams/chat-1" + path, body, extra));
    });
  }
  double Metric(const std::string& name) {
    return MetricValue(router_->MetricsText(), "gpuha_router_" + name);
  }
  // The answer is the model's, whole, with the usage of an uninterrupted one.
  static void ExpectWhole(const Reply& r, const worker::LlmAnswer& want) {
    ASSERT_EQ(r.status, 200) << r.error << r.body;
    auto got = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, r.body);
    ASSERT_TRUE(got.ok()) << got.status() << "\n" << r.body;
    EXPECT_EQ(got->text, want.text);
    EXPECT_EQ(got->finish_reason, want.finish_reason);
    EXPECT_EQ(got->completion_tokens, want.completion_tokens);
    EXPECT_EQ(got->prompt_tokens, want.prompt_tokens);
    EXPECT_EQ(got->ids.size(), 1u);
  }

  bool strict_fields_ = false;
  std::unique_ptr<worker::Worker> a_, b_;
  RouterConfig config_;
  std::unique_ptr<Router> router_;
};

// A token stream lasts as long as its answer is made: it is no request in
// the latency histogram (the dashboard's p99 once read 29 s after the demo,
// its open streams counted as requests).
TEST_F(RouterLlmTest, TokenStreamsStayOutOfTheRequestLatencyHistogram) {
  Ask ask = Completion("not a request latency", 20);
  ExpectWhole(Start(ask.body).get(), ask.want);
  const std::string count =
      R"(gpuha_router_request_duration_seconds_count{tenant="",result="2xx"})";
  EXPECT_EQ(MetricValue(router_->MetricsText(), count), -1) << router_->MetricsText();
  ASSERT_EQ(
      Send(router_->port(), "GET /streams/chat-1/v1/models HTTP/1.1\r\nHost: r\r\n\r\n").status,
      200);
  // The request is counted once its answer is written, which the client can
  // read before the router's next step: wait for it, then look.
  EXPECT_TRUE(Eventually([&] { return MetricValue(router_->MetricsText(), count) >= 1; }));
  EXPECT_EQ(MetricValue(router_->MetricsText(), count), 1);
  EXPECT_EQ(Metric("sse_streams_total"), 1);
}

TEST_F(RouterLlmTest, TokensReachTheClientAsTheyAreMade) {
  Ask ask = LongCompletion("as they come", 400, 150);
  // One connection, read as it arrives: the first token is out long
  // before the answer ends.
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket s(ioc);
  s.connect({net::ip::make_address("127.0.0.1"), router_->port()});
  net::write(s, net::buffer(Post("/streams/chat-1/v1/completions", ask.body)));
  std::string got;
  char buf[4096];
  while (got.find("data: {") == std::string::npos) {
    size_t n = s.read_some(net::buffer(buf));
    got.append(buf, n);
  }
  EXPECT_LT(a_->counters().generation_tokens.load(), 100u)
      << "the first token came only after most of the answer was made";
}

TEST_F(RouterLlmTest, APrimaryThatDiesMidAnswerIsContinuedOnTheStandby) {
  Ask ask = LongCompletion("tell me about failover", 200, 80);
  std::future<Reply> f = Start(ask.body);
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 20; }));
  Fault(*a_, "cut");  // connections close mid-answer: a crash, as the network sees it
  Reply r = f.get();
  ExpectWhole(r, ask.want);
  EXPECT_EQ(Metric("sse_continuations_total"), 1);
  EXPECT_GT(b_->counters().generation_tokens.load(), 0u);
  EXPECT_LT(b_->counters().generation_tokens.load(),
            static_cast<uint64_t>(ask.want.completion_tokens));  // the rest only
}

TEST_F(RouterLlmTest, StreamsStalledMidAnswerAreJudgedByTheirTokensAndContinued) {
  // The primary's probe keeps answering; only its tokens stop. Six streams
  // on the router's two loops (each loop judges its own streams, one or two
  // as well as three or more, and tells the other).
  std::vector<Ask> asks;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 6; ++i) {
    asks.push_back(LongCompletion(absl::StrCat("stall ", i), 200, 100));
    replies.push_back(Start(asks.back().body));
  }
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 120; }));
  Fault(*a_, "stuck");
  for (size_t i = 0; i < replies.size(); ++i) ExpectWhole(replies[i].get(), asks[i].want);
  EXPECT_GE(Metric("token_stalls_total"), 1);
  EXPECT_EQ(Metric("sse_continuations_total"), 6);
  Fault(*a_, "none");
}

// Issue 37: a lone stream is judged by its tokens too (fewer streams than
// the verdict's minimum waited for response_timeout, 60 s).
TEST_F(RouterLlmTest, ALoneStreamStalledMidAnswerIsJudgedByItsTokensAndContinued) {
  Ask ask = LongCompletion("alone", 200, 100);
  std::future<Reply> f = Start(ask.body);
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 20; }));
  Fault(*a_, "stuck");
  ExpectWhole(f.get(), ask.want);
  EXPECT_EQ(Metric("token_stalls_total"), 1);
  EXPECT_EQ(Metric("sse_continuations_total"), 1);
  Fault(*a_, "none");
}

TEST_F(RouterLlmTest, ChatIsContinuedWithAnAssistantPrefix) {
  std::string body;
  worker::LlmAnswer want;
  for (int i = 0; want.completion_tokens < 60; ++i) {
    body = absl::StrCat(
        R"({"model":"gpuha-tiny","stream":true,"max_tokens":150,"messages":[{"role":"user","content":"q)",
        i, R"("}]})");
    want = worker::Complete(*worker::ParseLlmRequest(worker::LlmApi::kChat, body));
  }
  std::future<Reply> f = Start(body, "", "/v1/chat/completions");
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 10; }));
  Fault(*a_, "cut");
  Reply r = f.get();
  ASSERT_EQ(r.status, 200) << r.error;
  auto got = worker::ParseStreamedAnswer(worker::LlmApi::kChat, r.body);
  ASSERT_TRUE(got.ok()) << got.status() << r.body;
  EXPECT_EQ(got->text, want.text);
  EXPECT_EQ(got->finish_reason, want.finish_reason);
}

TEST_F(RouterLlmTest, AStreamThatCannotBeContinuedEndsWithAnErrorEventThatSaysWhy) {
  Ask ask = LongCompletion("no continuation", 200, 80);
  std::future<Reply> f = Start(ask.body, "X-Gpuha-Continue: off\r\n");
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 10; }));
  Fault(*a_, "cut");
  Reply r = f.get();
  ASSERT_EQ(r.status, 200) << r.error;  // a well-formed end, not a cut connection
  auto got = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, r.body);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("continuation is off for this request"), std::string::npos)
      << got.status() << "\n"
      << r.body;
  EXPECT_EQ(Metric("sse_error_events_total"), 1);
  EXPECT_EQ(b_->counters().generation_tokens.load(), 0u);
}

// A drain whose timeout passes with an answer still streaming ends it with
// an error event that says so, never a silent cut.
TEST_F(RouterLlmTest, AnAnswerOpenAtTheDrainsTimeoutEndsWithAnErrorEvent) {
  Ask ask = LongCompletion("drained", 400, 150);  // 150 tokens at 5 ms: 750 ms or more
  std::future<Reply> f = Start(ask.body);
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 10; }));
  router_->Drain(milliseconds(200));
  Reply r = f.get();
  ASSERT_EQ(r.status, 200) << r.error;  // a well-formed end, not a cut connection
  auto got = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, r.body);
  ASSERT_FALSE(got.ok()) << r.body;
  EXPECT_NE(got.status().message().find("drain_timeout passed"), std::string::npos)
      << got.status() << "\n"
      << r.body;
  EXPECT_EQ(Metric("sse_error_events_total"), 1);
  EXPECT_EQ(b_->counters().generation_tokens.load(), 0u);  // not continued elsewhere
}

// Issue 51: on a tokenizer model (gpuha-tiny-bpe), where a continuation
// by text can go another way, chat and completions cut (a crash) or stuck
// (SIGSTOP, its probe still answering) mid-answer are continued on their
// token IDs: token for token the uninterrupted answer, marked so, the IDs
// kept from a client that did not ask for them and given to one that did.
struct BpeAsk {
  worker::LlmApi api;
  std::string path, body;
  bool client_ids;
  worker::LlmAnswer want;
};
BpeAsk LongBpe(worker::LlmApi api, const std::string& seed, bool client_ids) {
  const worker::Bpe& bpe = worker::Bpe::Get();
  for (int i = 0;; ++i) {
    BpeAsk a{api,
             api == worker::LlmApi::kChat ? "/v1/chat/completions" : "/v1/completions",
             "",
             client_ids,
             {}};
    const std::string ids = client_ids ? R"("return_token_ids":true,)" : "";
    a.body =
        api == worker::LlmApi::kChat
            ? absl::StrCat(R"({"model":"gpuha-tiny-bpe","stream":true,"max_tokens":200,)", ids,
                           R"("messages":[{"role":"user","content":")", seed, " ", i, R"("}]})")
            : absl::StrCat(R"({"model":"gpuha-tiny-bpe","stream":true,"max_tokens":200,)", ids,
                           R"("prompt":")", seed, " ", i, R"("})");
    a.want = worker::Complete(*worker::ParseLlmRequest(api, a.body));
    // Long, and read back otherwise by the tokenizer: by text it could break.
    if (a.want.completion_tokens >= 100 &&
        bpe.Encode(bpe.Decode(a.want.token_ids)) != a.want.token_ids) {
      return a;
    }
  }
}

void ExpectWholeOnIds(const Reply& r, const BpeAsk& ask) {
  ASSERT_EQ(r.status, 200) << r.error << r.body;
  auto got = worker::ParseStreamedAnswer(ask.api, r.body);
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << r.body;
  EXPECT_EQ(got->text, ask.want.text);
  EXPECT_EQ(got->finish_reason, ask.want.finish_reason);
  EXPECT_GT(got->continued, 0) << r.body;
  EXPECT_EQ(got->continued_by, "token_ids");
  if (ask.client_ids) {
    EXPECT_EQ(got->token_ids, ask.want.token_ids);
    EXPECT_EQ(got->prompt_token_ids, ask.want.prompt_token_ids);
  } else {
    EXPECT_EQ(r.body.find("token_ids\":"), std::string::npos) << r.body;
  }
}

// A completion and a chat on the primary, the client asking for the IDs on
// one of them, both mid-answer when `fault` strikes.
void ExpectContinuedOnIdsThrough(RouterLlmTest& t, worker::Worker& primary, const char* fault,
                                 bool completion_asks_ids) {
  BpeAsk completion = LongBpe(worker::LlmApi::kCompletions, absl::StrCat(fault, " completion"),
                              completion_asks_ids);
  BpeAsk chat = LongBpe(worker::LlmApi::kChat, absl::StrCat(fault, " chat"), !completion_asks_ids);
  std::future<Reply> f1 = t.Start(completion.body, "", completion.path);
  std::future<Reply> f2 = t.Start(chat.body, "", chat.path);
  // Both generating, and some way into their answers.
  ASSERT_TRUE(Eventually([&] { return primary.counters().llm_running.load() >= 2; }));
  ASSERT_TRUE(Eventually([&] { return primary.counters().generation_tokens.load() >= 40; }));
  t.Fault(primary, fault);
  ExpectWholeOnIds(f1.get(), completion);
  ExpectWholeOnIds(f2.get(), chat);
  EXPECT_EQ(t.Metric("sse_token_id_continuations_total"), 2);
  t.Fault(primary, "none");
}

TEST_F(RouterLlmTest, ATokenizerModelsAnswersCutMidAnswerAreContinuedOnTheirTokenIds) {
  ExpectContinuedOnIdsThrough(*this, *a_, "cut", false);
}

// A 400 that is the client's own (a field of the wrong type) comes back to
// it, sent once with the router's return_token_ids and once without; the
// upstream is still asked for token IDs after.
TEST_F(RouterLlmTest, AClientsOwnBadRequestDoesNotStopTheTokenIds) {
  for (int i = 0; i < 4; ++i) {
    Reply bad = Start(R"({"model":"gpuha-tiny-bpe","stream":true,"max_tokens":5,"prompt":"x",
                          "stream_options":{"include_usage":1}})")
                    .get();
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("stream_options.include_usage"), std::string::npos) << bad.body;
  }
  ExpectContinuedOnIdsThrough(*this, *a_, "cut", false);
}

TEST_F(RouterLlmTest, ATokenizerModelsAnswersStalledMidAnswerAreContinuedOnTheirTokenIds) {
  ExpectContinuedOnIdsThrough(*this, *a_, "stuck", true);
}

// Output held to a JSON schema cannot be continued (the standby would start
// the grammar again mid-document): the answer ends with the error event
// that names why, never a broken document.
TEST_F(RouterLlmTest, AStructuredAnswerThatBreaksEndsWithAnErrorEventNamingItsFormat) {
  BpeAsk ask = LongBpe(worker::LlmApi::kChat, "structured", false);
  ask.body.insert(ask.body.size() - 1,
                  R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a",)"
                  R"("schema":{"type":"object"}}})");
  std::future<Reply> f = Start(ask.body, "", ask.path);
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= 10; }));
  Fault(*a_, "cut");
  Reply r = f.get();
  ASSERT_EQ(r.status, 200) << r.error;
  auto got = worker::ParseStreamedAnswer(worker::LlmApi::kChat, r.body);
  ASSERT_FALSE(got.ok()) << r.body;
  EXPECT_NE(got.status().message().find("response_format json_schema"), std::string::npos)
      << got.status();
  EXPECT_EQ(b_->counters().generation_tokens.load(), 0u);
}

// Upstreams that refuse fields they do not know (OpenAI's own API does)
// answer the return_token_ids the router adds with 400: the router sends
// the request again as the client sent it, to the same upstream, asks that
// upstream no more, and continues its answers by text.
class StrictRouterLlmTest : public RouterLlmTest {
 protected:
  StrictRouterLlmTest() { strict_fields_ = true; }
};

TEST_F(StrictRouterLlmTest, AnUpstreamThatRefusesTokenIdsGetsTheRequestAsTheClientSentIt) {
  for (int i = 0; i < 4; ++i) {
    Ask first = Completion(absl::StrCat("strict first ", i), 20);
    ExpectWhole(Start(first.body).get(), first.want);
  }
  // A 400 at most once per loop of the router (each keeps its upstreams'
  // state): then each remembers.
  const uint64_t refused = a_->counters().http_answers[0][1].load();
  EXPECT_GE(refused, 1u);
  EXPECT_LE(refused, static_cast<uint64_t>(config_.threads));
  EXPECT_EQ(Metric("retries_total"), 0);  // the same upstream again is no retry
  Ask ask = LongCompletion("strict", 200, 80);
  const uint64_t before = a_->counters().generation_tokens.load();
  std::future<Reply> f = Start(ask.body);
  ASSERT_TRUE(Eventually([&] { return a_->counters().generation_tokens.load() >= before + 40; }));
  Fault(*a_, "cut");
  Reply r = f.get();
  ExpectWhole(r, ask.want);
  auto got = worker::ParseStreamedAnswer(worker::LlmApi::kCompletions, r.body);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->continued_by, "text");
  // Still once per loop at most (this request may have gone to the other
  // loop), and the continuation asked for no IDs.
  EXPECT_LE(a_->counters().http_answers[0][1].load(), static_cast<uint64_t>(config_.threads));
  EXPECT_EQ(b_->counters().http_answers[0][1].load(), 0u);
  EXPECT_EQ(Metric("sse_continuations_total"), 1);
}

TEST_F(RouterLlmTest, HealthyStreamsPassUntouched) {
  std::vector<Ask> asks;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 8; ++i) {
    asks.push_back(Completion(absl::StrCat("healthy ", i), 30));
    replies.push_back(Start(asks.back().body));
  }
  for (size_t i = 0; i < replies.size(); ++i) ExpectWhole(replies[i].get(), asks[i].want);
  EXPECT_EQ(Metric("sse_streams_total"), 8);
  EXPECT_EQ(Metric("sse_continuations_total"), 0);
  EXPECT_EQ(b_->counters().generation_tokens.load(), 0u);
}

}  // namespace
}  // namespace gpuha::router
