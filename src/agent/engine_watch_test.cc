#include "agent/engine_watch.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;

TEST(EngineWatchTest, ReadsTritonsAndVllmsFamiliesSummedOverLabels) {
  auto t = ParseEngineMetrics(
      "# HELP nv_inference_exec_count Model executions\n"
      "# TYPE nv_inference_exec_count counter\n"
      "nv_inference_exec_count{model=\"a\",version=\"1\"} 10\n"
      "nv_inference_exec_count{model=\"b\",version=\"1\"} 5\n"
      "nv_inference_exec_count_other 99\n"
      "nv_inference_pending_request_count{model=\"a\",version=\"1\"} 3\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->progress, 15);
  EXPECT_EQ(t->pending, 3);
  auto v = ParseEngineMetrics(
      "vllm:num_requests_running{model_name=\"m\"} 4.0\n"
      "vllm:num_requests_waiting{model_name=\"m\"} 2.0\n"
      "vllm:generation_tokens_total{model_name=\"m\"} 12345.0 1700000000000\n");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->pending, 6);
  EXPECT_EQ(v->progress, 12345);
  // Both kinds from one engine: judged on the sum.
  auto both = ParseEngineMetrics(
      "nv_inference_exec_count{model=\"cv\"} 7\n"
      "nv_inference_pending_request_count{model=\"cv\"} 1\n"
      "vllm:num_requests_running 2\n"
      "vllm:generation_tokens_total 100\n");
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->pending, 3);
  EXPECT_EQ(both->progress, 107);
  EXPECT_EQ(both->generating, 2);
  EXPECT_FALSE(ParseEngineMetrics("up 1\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 50\n").has_value());
  EXPECT_FALSE(ParseEngineMetrics("").has_value());
  EXPECT_FALSE(ParseEngineMetrics("nv_inference_exec_count{oops 1\n").has_value());
}

TEST(EngineWatchTest, PendingWithNoProgressForStallAfterIsAStall) {
  common::FakeClock clock;
  EngineWatch w(milliseconds(1000));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 10}));
  clock.Advance(milliseconds(500));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 5, .progress = 20}));  // moving
  clock.Advance(milliseconds(900));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 40, .progress = 20}));
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(w.Observe(clock.Now(), {.pending = 80, .progress = 20}));  // 1 s, no progress
  // Progress again ends it.
  clock.Advance(milliseconds(100));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 80, .progress = 21}));
}

TEST(EngineWatchTest, AnIdleEngineIsNeverStalled) {
  common::FakeClock clock;
  EngineWatch w(milliseconds(1000));
  for (int i = 0; i < 100; ++i) {
    clock.Advance(milliseconds(100));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 7}));
  }
  // Slow requests in flight and no other work: never a stall, however long
  // they take, however many (found by the half-hang demo, whose 1.5 s slow
  // requests on a quiet spare once failed it over).
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 8}));
  for (int i = 0; i < 50; ++i) {
    clock.Advance(milliseconds(100));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 8}));
  }
  // Two more arrive: not yet a stall when first seen; still nothing moves
  // for stall_after: now it is one.
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 6, .progress = 8}));
  clock.Advance(milliseconds(900));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 6, .progress = 8}));
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(w.Observe(clock.Now(), {.pending = 6, .progress = 8}));
}

// Regression (ChaosTest.NodeCrashLosesNothing, in CI): the clock ran from
// the last progress, so an engine idle for seconds was stalled at the first
// scrape after work arrived: four LLM requests starting on a quiet worker
// failed it over before their first token was due.
TEST(EngineWatchTest, WorkArrivingAfterIdleIsNotAStallBeforeStallAfter) {
  common::FakeClock clock;
  EngineWatch w(milliseconds(600));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 100}));
  for (int i = 0; i < 15; ++i) {  // 2.25 s idle, scraped every 150 ms
    clock.Advance(milliseconds(150));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 100}));
  }
  // Four completions start generating, a burst of three more queued behind.
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 7, .progress = 100, .generating = 4}));
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 7, .progress = 130, .generating = 4}));
  // And stuck from here: a stall once stall_after has passed with work
  // waiting and nothing done, not before.
  for (int i = 0; i < 3; ++i) {
    clock.Advance(milliseconds(150));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 7, .progress = 130, .generating = 4}));
  }
  clock.Advance(milliseconds(150));
  EXPECT_TRUE(w.Observe(clock.Now(), {.pending = 7, .progress = 130, .generating = 4}));
}

// A stuck engine whose queue dips for one scrape (clients cancelling) is
// still judged from when work began waiting; two idle scrapes restart it.
TEST(EngineWatchTest, OneDipInTheQueueDoesNotRestartTheStallClock) {
  common::FakeClock clock;
  EngineWatch w(milliseconds(600));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 5}));
  for (double pending : {4.0, 5.0, 0.0}) {
    clock.Advance(milliseconds(150));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = pending, .progress = 5}));
  }
  clock.Advance(milliseconds(150));  // 600 ms since progress; waiting but for one dip
  EXPECT_TRUE(w.Observe(clock.Now(), {.pending = 6, .progress = 5}));
  // Idle twice in a row: the engine had nothing to do; the clock restarts.
  for (int i = 0; i < 2; ++i) {
    clock.Advance(milliseconds(150));
    EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 0, .progress = 5}));
  }
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 6, .progress = 5}));
}

// A token engine's long answers hold pending high from before it stuck; once
// a router stops sending it work, pending never rises past that. Requests
// generating and no token for stall_after is a stall by itself.
TEST(EngineWatchTest, ATokenEngineGeneratingNothingIsAStall) {
  common::FakeClock clock;
  EngineWatch w(milliseconds(1000));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 500, .generating = 4}));
  clock.Advance(milliseconds(500));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 500, .generating = 4}));
  clock.Advance(milliseconds(500));
  EXPECT_TRUE(w.Observe(clock.Now(), {.pending = 4, .progress = 500, .generating = 4}));
  // Tokens again: not stalled; and none generating, the first rule alone.
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 501, .generating = 4}));
  clock.Advance(milliseconds(2000));
  EXPECT_FALSE(w.Observe(clock.Now(), {.pending = 4, .progress = 501, .generating = 0}));
}

}  // namespace
}  // namespace gpuha::agent

namespace gpuha::agent {
namespace {

EngineSample Outcomes(double succeeded, double failed, double progress) {
  return {.pending = 0,
          .progress = progress,
          .generating = 0,
          .has_outcomes = true,
          .succeeded = succeeded,
          .failed = failed};
}

TEST(FailureWatchTest, ReadsTritonsRequestOutcomes) {
  auto t = ParseEngineMetrics(
      "nv_inference_exec_count{model=\"cv\",version=\"1\"} 30\n"
      "nv_inference_request_success{model=\"cv\",version=\"1\"} 20\n"
      "nv_inference_request_success{model=\"b\",version=\"1\"} 1\n"
      "nv_inference_request_failure{model=\"cv\",version=\"1\"} 9\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_TRUE(t->has_outcomes);
  EXPECT_EQ(t->succeeded, 21);
  EXPECT_EQ(t->failed, 9);
  auto v = ParseEngineMetrics("vllm:generation_tokens_total 5\n");
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->has_outcomes);
}

// Adversarial finding: a client naming a model the server does not serve
// (or sending bad input) on a quiet node made "only errors" of its requests,
// and the agent fenced each node they reached, the whole fleet in turn.
// Triton's reason label says whose a failure is; only BACKEND is the
// engine's (a failure without the label, an older Triton, still counts).
TEST(FailureWatchTest, OnlyTheEnginesOwnFailuresCount) {
  auto s = ParseEngineMetrics(
      "nv_inference_exec_count{model=\"cv\",version=\"1\"} 1\n"
      "nv_inference_request_success{model=\"cv\",version=\"1\"} 1\n"
      "nv_inference_request_failure{model=\"cv\",version=\"1\",reason=\"REJECTED\"} 100\n"
      "nv_inference_request_failure{model=\"cv\",version=\"1\",reason=\"CANCELED\"} 100\n"
      "nv_inference_request_failure{model=\"cv\",version=\"1\",reason=\"OTHER\"} 100\n"
      "nv_inference_request_failure{model=\"cv\",version=\"1\",reason=\"BACKEND\"} 2\n"
      "nv_inference_request_failure{model=\"old\",version=\"1\"} 3\n");
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->has_outcomes);
  EXPECT_EQ(s->failed, 5);
  // Only client errors on a quiet engine, for longer than the window: not failing.
  FailureWatch w(milliseconds(1000));
  common::TimePoint t{};
  EngineSample quiet{.progress = 1, .has_outcomes = true, .succeeded = 1};
  EXPECT_FALSE(w.Observe(t, quiet));
  for (int i = 1; i <= 5; ++i) {
    std::string text = absl::StrCat(
        "nv_inference_exec_count 1\nnv_inference_request_success 1\n"
        "nv_inference_request_failure{reason=\"OTHER\"} ",
        50 * i, "\n");
    EXPECT_FALSE(w.Observe(t + milliseconds(500 * i), *ParseEngineMetrics(text))) << i;
  }
}

// The error-burst: executions still count (no stall), every request fails.
TEST(FailureWatchTest, OnlyErrorsForTheWindowIsFailing) {
  common::FakeClock clock;
  FailureWatch f(milliseconds(1000));
  EngineWatch stall(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(100, 0, 100)));
  for (int i = 1; i <= 5; ++i) {
    clock.Advance(milliseconds(250));
    const EngineSample s = Outcomes(100, 40.0 * i, 100 + 40.0 * i);
    EXPECT_FALSE(stall.Observe(clock.Now(), s));  // it executes: not a stall
    EXPECT_EQ(f.Observe(clock.Now(), s), i >= 4) << i;
  }
  EXPECT_EQ(f.failures(), 200);
  // One success clears it.
  clock.Advance(milliseconds(250));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(101, 240, 340)));
}

// As the demo's error-burst looks to the agent: the routers shield the
// engine within a few requests, so its failures fall beside its last
// successes in one scrape's interval, and nothing comes after.
TEST(FailureWatchTest, FailuresBesideTheLastSuccessesThenSilenceIsFailing) {
  common::FakeClock clock;
  FailureWatch f(milliseconds(600));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(100, 0, 100)));
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(120, 4, 124)));  // the fault, mid-interval
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(120, 7, 127)));  // the last few, then silence
  for (int i = 0; i < 3; ++i) {
    clock.Advance(milliseconds(150));
    EXPECT_EQ(f.Observe(clock.Now(), Outcomes(120, 7, 127)), i == 2) << i;
  }
  // An engine restarted (its counters back to 0) starts over.
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(0, 0, 0)));
}

TEST(FailureWatchTest, AFewFailuresAQuietEngineOrSuccessesBesideThemAreNotFailing) {
  common::FakeClock clock;
  FailureWatch f(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 0, 10)));
  clock.Advance(milliseconds(5000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 4, 14)));  // quiet, 4 failures: too few
  FailureWatch g(milliseconds(1000));
  for (int i = 0; i < 20; ++i) {  // a tenant's bad requests beside good ones
    clock.Advance(milliseconds(250));
    EXPECT_FALSE(g.Observe(clock.Now(), Outcomes(10 + i, 50.0 * i, 0)));
  }
  // An engine without outcome counters (vLLM) is never judged by them.
  FailureWatch h(milliseconds(1000));
  clock.Advance(milliseconds(5000));
  EXPECT_FALSE(h.Observe(clock.Now(), {.pending = 0, .progress = 1}));
}

// Five client errors (Triton counts INVALID_ARG) and then no traffic:
// failing, but not for good. With no new failure for a minute the verdict
// is forgotten (Pacemaker's failure-timeout); a server still broken fails
// again at its next requests. (It stayed failing forever before.)
TEST(FailureWatchTest, AVerdictWithNoNewFailureForAMinuteIsForgotten) {
  common::FakeClock clock;
  FailureWatch f(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 0, 10)));
  clock.Advance(milliseconds(250));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 5, 15)));
  for (int i = 0; i < 58; ++i) {
    clock.Advance(milliseconds(1000));
    EXPECT_TRUE(f.Observe(clock.Now(), Outcomes(10, 5, 15))) << i;
  }
  clock.Advance(milliseconds(1000));
  EXPECT_TRUE(f.Observe(clock.Now(), Outcomes(10, 5, 15)));  // 59.25 s after the failures
  clock.Advance(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 5, 15)));  // 60.25 s: forgotten
  EXPECT_EQ(f.failures(), 0);
  clock.Advance(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), Outcomes(10, 5, 15)));
  // Still broken: its next requests all fail, with no success since the
  // verdict was forgotten 1.5 s before: failing again.
  clock.Advance(milliseconds(500));
  EXPECT_TRUE(f.Observe(clock.Now(), Outcomes(10, 12, 22)));
  EXPECT_EQ(f.failures(), 7);
}

// Issue 51: an errors-only vLLM, SGLang or TGI server exports no Triton
// counter; its own outcomes are read instead. The sample texts follow each
// engine's documented families (vLLM's API server counts its answers
// through prometheus-fastapi-instrumentator, grouped by status class).
TEST(FailureWatchTest, ReadsVllmsTgisAndSglangsOutcomesAndProgress) {
  auto vllm = ParseEngineMetrics(
      "# TYPE http_requests_total counter\n"
      "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"} 40\n"
      "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"2xx\"} 2\n"
      "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"4xx\"} 7\n"
      "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"5xx\"} 3\n"
      "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"500\"} 1\n"
      // A probe's GETs are no inference: neither a success nor a failure.
      "http_requests_total{handler=\"/v1/models\",method=\"GET\",status=\"2xx\"} 900\n"
      "vllm:num_requests_running{model_name=\"m\"} 2\n"
      "vllm:generation_tokens_total{model_name=\"m\"} 500\n");
  ASSERT_TRUE(vllm.has_value());
  EXPECT_TRUE(vllm->has_progress);
  EXPECT_TRUE(vllm->has_outcomes);
  EXPECT_EQ(vllm->succeeded, 42);
  EXPECT_EQ(vllm->failed, 4);
  EXPECT_EQ(vllm->generating, 2);

  // TGI: only its engine's errors count (generation, incomplete).
  auto tgi = ParseEngineMetrics(
      "tgi_request_success 12\n"
      "tgi_request_failure{err=\"validation\"} 50\n"
      "tgi_request_failure{err=\"overloaded\"} 9\n"
      "tgi_request_failure{err=\"generation\"} 4\n"
      "tgi_request_failure{err=\"incomplete\"} 1\n"
      "tgi_queue_size 3\n"
      "tgi_batch_current_size 5\n"
      "tgi_batch_inference_success{method=\"decode\"} 700\n"
      "tgi_batch_inference_success{method=\"prefill\"} 20\n");
  ASSERT_TRUE(tgi.has_value());
  EXPECT_EQ(tgi->succeeded, 12);
  EXPECT_EQ(tgi->failed, 5);
  EXPECT_EQ(tgi->pending, 8);
  EXPECT_EQ(tgi->generating, 5);
  EXPECT_EQ(tgi->progress, 720);

  // SGLang's progress families; its answers through the same HTTP counter.
  auto sglang = ParseEngineMetrics(
      "sglang:num_running_reqs{model_name=\"q\"} 1\n"
      "sglang:num_queue_reqs{model_name=\"q\"} 4\n"
      "sglang:generation_tokens_total{model_name=\"q\"} 90\n"
      "sglang:prompt_tokens_total{model_name=\"q\"} 10\n");
  ASSERT_TRUE(sglang.has_value());
  EXPECT_EQ(sglang->pending, 5);
  EXPECT_EQ(sglang->progress, 100);
  EXPECT_FALSE(sglang->has_outcomes);

  // Outcomes with no progress family: judged by the failing rule alone.
  auto only =
      ParseEngineMetrics("tgi_request_success 1\ntgi_request_failure{err=\"generation\"} 2\n");
  ASSERT_TRUE(only.has_value());
  EXPECT_FALSE(only->has_progress);
  EXPECT_TRUE(only->has_outcomes);

  // An engine's own count is read before HTTP classes (the worker exports both).
  auto both = ParseEngineMetrics(
      "nv_inference_request_success 5\n"
      "nv_inference_request_failure{reason=\"REJECTED\"} 3\n"
      "http_requests_total{method=\"POST\",status=\"5xx\"} 3\n");
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->succeeded, 5);
  EXPECT_EQ(both->failed, 0);
}

// The errors-only server of a vLLM, scraped as the agent does: 500s and
// no 2xx for the window fail it; its successes again end the verdict.
TEST(FailureWatchTest, AVllmAnsweringOnly500IsFailing) {
  auto scrape = [](int ok, int failed) {
    return *ParseEngineMetrics(absl::StrCat(
        "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"} ", ok,
        "\nhttp_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"5xx\"} ",
        failed, "\nvllm:generation_tokens_total 100\n"));
  };
  common::FakeClock clock;
  FailureWatch f(milliseconds(1000));
  EXPECT_FALSE(f.Observe(clock.Now(), scrape(100, 0)));
  clock.Advance(milliseconds(250));
  EXPECT_FALSE(f.Observe(clock.Now(), scrape(101, 20)));
  clock.Advance(milliseconds(1000));
  EXPECT_TRUE(f.Observe(clock.Now(), scrape(101, 60)));
  clock.Advance(milliseconds(250));
  EXPECT_FALSE(f.Observe(clock.Now(), scrape(102, 60)));
}

}  // namespace
}  // namespace gpuha::agent
