// EngineWatch: the inference engine's own progress, read from its metrics,
// as a second opinion beside its readiness probe. A Triton whose CUDA
// context broke, or a vLLM whose engine core deadlocked, keeps answering
// its health check; its metrics still tell: requests pending, and the
// counter of work done no longer moving.
//
//   Triton: nv_inference_pending_request_count (pending),
//           nv_inference_exec_count (progress)
//   vLLM:   vllm:num_requests_running + vllm:num_requests_waiting (pending),
//           vllm:generation_tokens_total + vllm:prompt_tokens_total (progress)
//   SGLang: sglang:num_running_reqs + sglang:num_queue_reqs (pending),
//           sglang:generation_tokens_total + sglang:prompt_tokens_total
//   TGI:    tgi_batch_current_size + tgi_queue_size (pending),
//           tgi_batch_inference_success (progress: its forward passes)
//
// and, for the failing rule (FailureWatch), request outcomes: Triton's
// nv_inference_request_success/_failure, TGI's tgi_request_success/_failure,
// or else the API server's http_requests_total by status class (vLLM's).
//
//   EngineWatch w(std::chrono::milliseconds(1000));
//   auto s = ParseEngineMetrics(body);      // a scrape of the metrics URL
//   if (s && w.Observe(now, *s)) ...        // stalled: fail the server
//
// Pure: text and time come in as arguments. Thread-safety: none.
#pragma once

#include <optional>
#include <string_view>

#include "common/clock.h"

namespace gpuha::agent {

struct EngineSample {
  double pending = 0;   // requests accepted and not finished
  double progress = 0;  // a counter of work done
  // Requests a token engine is generating for now (vLLM's
  // num_requests_running): each one makes a token every step while the
  // engine works, so their tokens stopping is a stall by itself.
  double generating = 0;
  // Whether any progress family was read (else the stall rule cannot judge).
  bool has_progress = false;
  // Requests succeeded and failed by the engine's fault (Triton's, TGI's,
  // or the API server's 2xx and 5xx); has_outcomes false when the engine
  // exports none of them.
  bool has_outcomes = false;
  double succeeded = 0;
  double failed = 0;
};

// Sums each family over its label sets, and the engines' families together
// when an engine exports several. nullopt when the text holds no family
// above (then the engine cannot be judged).
std::optional<EngineSample> ParseEngineMetrics(std::string_view text);

// Silence alone means nothing: legitimately slow requests on an engine that
// gets no other work leave it pending with no progress, however long they
// take. A stall is work arriving and none done: at least `min_pending`
// requests pending, more than when progress last moved, and no progress for
// stall_after (found by the half-hang demo, whose 1.5 s slow requests on a
// quiet spare once failed it over). A token engine is judged more directly:
// requests it is generating for and no progress for stall_after is a stall,
// since a running request makes a token every step. (Its long answers hold
// pending high from before the stall, so the first rule, needing more than
// that, could miss it once a router stops sending it work.)
//
// The stall_after clock runs only while work waits: from the last scrape
// that saw progress, or the second of two in a row that saw nothing
// waiting (one dip, clients cancelling while the engine is stuck, does not
// restart it). Counted from the last progress
// alone, an engine idle for seconds was stalled at the first scrape after
// work arrived, before that work had had a step to run (the demo's LLM
// streams starting on a quiet worker failed it over, and a second failure
// meanwhile lost requests).
class EngineWatch {
 public:
  explicit EngineWatch(common::Duration stall_after, double min_pending = 3)
      : stall_after_(stall_after), min_pending_(min_pending) {}
  // One scrape at `now`; true while the engine is stalled: work waiting
  // (see above) and progress unchanged for stall_after since it was seen
  // not waiting.
  bool Observe(common::TimePoint now, const EngineSample& s) {
    if (!progress_ || s.progress != *progress_) {
      progress_ = s.progress;
      moved_at_ = now;
      clear_at_ = now;
      idle_scrapes_ = 0;
      pending_when_moved_ = s.pending;
      return false;
    }
    const bool waiting =
        s.generating >= 1 || (s.pending >= min_pending_ && s.pending > pending_when_moved_);
    idle_scrapes_ = waiting ? 0 : idle_scrapes_ + 1;
    if (idle_scrapes_ >= 2) clear_at_ = now;
    return waiting && now - clear_at_ >= stall_after_;
  }
  // Since when nothing has moved (meaningful while Observe says stalled).
  common::TimePoint moved_at() const { return moved_at_; }

 private:
  common::Duration stall_after_;
  double min_pending_;
  std::optional<double> progress_;
  double pending_when_moved_ = 0;
  common::TimePoint moved_at_{};
  common::TimePoint clear_at_{};  // last scrape with progress, or 2nd in a row idle
  int idle_scrapes_ = 0;          // scrapes in a row with nothing waiting
};

// FailureWatch: an engine that answers, but only with errors (read from
// its outcomes: Triton's, TGI's or its API server's). A broken CUDA
// context answers every inference 500 at once while its readiness says 200
// and its executions still count (the demo's error-burst): no stall, and
// each router ejects it only after its own run of 5xx, while the controller
// never moves its streams. Failing: at least `min_failures` failures since
// the last success, and no success for `window`. A scrape's counters cannot
// order its interval's outcomes, so the failures of the interval that saw
// the last successes count too: the routers shield such an engine within
// a few requests, and its failures then all fall in that interval, beside
// the last successes, with silence after (the demo's error-burst). A busy
// engine that goes quiet right after 5 failed requests looks the same.
// One tenant's bad requests beside others' good ones are not it: every
// success restarts the window. A verdict with no new failure for
// `forget_after` (60 s) is forgotten, as Pacemaker's failure-timeout
// forgets a resource's failures: five client errors (Triton counts
// INVALID_ARG as a failure) and then no traffic at all held a healthy
// server not ready for good, since nothing but a success or a restart
// could clear it. A server still broken fails again at its next requests.
//
//   FailureWatch f(std::chrono::seconds(1));
//   if (s && f.Observe(now, *s)) ...  // failing: fail the server
//
// Pure. Thread-safety: none.
class FailureWatch {
 public:
  explicit FailureWatch(common::Duration window, double min_failures = 5,
                        common::Duration forget_after = std::chrono::seconds(60))
      : window_(window), min_failures_(min_failures), forget_after_(forget_after) {}
  bool Observe(common::TimePoint now, const EngineSample& s) {
    if (!s.has_outcomes) return false;
    const bool restarted = seen_ && (s.succeeded < last_.succeeded || s.failed < last_.failed);
    if (!seen_ || restarted) {
      seen_ = true;
      last_ = s;
      failures_ = 0;
      success_at_ = now;
      return false;
    }
    const double failed = s.failed - last_.failed;
    if (failed > 0) failed_at_ = now;
    if (s.succeeded > last_.succeeded) {
      failures_ = failed;  // may have come after the interval's last success
      success_at_ = now;
    } else if (failures_ > 0 && failed == 0 && now - failed_at_ >= forget_after_) {
      failures_ = 0;  // forgotten: as if they had not occurred
      success_at_ = now;
    } else {
      failures_ += failed;
    }
    last_ = s;
    return failures_ >= min_failures_ && now - success_at_ >= window_;
  }
  // Failures since the last success (meaningful while Observe says failing).
  double failures() const { return failures_; }
  common::TimePoint success_at() const { return success_at_; }

 private:
  common::Duration window_;
  double min_failures_;
  common::Duration forget_after_;
  // The last sample, once there is one (no std::optional: g++ 12 at -O2
  // took its payload for maybe-uninitialized).
  bool seen_ = false;
  EngineSample last_{};
  double failures_ = 0;
  common::TimePoint success_at_{};
  common::TimePoint failed_at_{};  // the last scrape that saw new failures
};

}  // namespace gpuha::agent
