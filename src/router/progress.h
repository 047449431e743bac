// ProgressMonitor: judges an upstream by progress, not liveness. The
// failure users of Triton, vLLM and SGLang report most is a server that
// still answers its health check while its inference no longer moves; a
// probe of the health path never sees it. This unit sees it from the
// requests themselves: an upstream with requests waiting for a response
// head that answers none of them, for longer than its requests take, is
// stalled.
//
// "Longer than its requests take" is learned, not configured: the monitor
// keeps the head latencies of the last kSamples answers and takes
// window = clamp(p90 * factor, floor, ceiling). The verdict needs
// `min_waiting` requests that began after the upstream's last answer and
// have all waited past the window:
// - a healthy upstream that keeps answering other requests is never stalled
//   by one slow request (the slow one began before the last answer);
// - a lone slow request is never cut: a single waiting request proves
//   nothing, whatever the window (the prober's hang verdict and the
//   response timeout still apply to it);
// - an upstream that stopped answering under load is stalled one window
//   after it stopped: at 500 requests a second, 3 requests have waited past
//   a 150 ms window about 156 ms after the last answer.
// A request may declare how long it expects to take (the router reads
// X-Gpuha-Expect-Ms); it is then overdue after that, within floor..ceiling,
// instead of after the learned window: a known-long generation is not taken
// for a stall, and a known-short request shows one sooner. The router needs
// no declaration.
//
//   ProgressMonitor m({.floor = 150ms, .ceiling = 30s});
//   m.Answered(now, latency);                 // on every response head
//   if (m.Stalled(now, {{since, expect}, ...})) ...  // each sweep
//
// Pure: time comes in as arguments. Thread-safety: none; each loop keeps one
// per upstream.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "common/clock.h"

namespace gpuha::router {

struct ProgressOptions {
  common::Duration floor = std::chrono::milliseconds(150);
  common::Duration ceiling = std::chrono::seconds(30);
  double factor = 4;       // window = p90 latency * factor, within floor..ceiling
  size_t min_waiting = 3;  // requests that must all have waited past the window
};

class ProgressMonitor {
 public:
  static constexpr size_t kSamples = 256;

  ProgressMonitor() = default;
  explicit ProgressMonitor(ProgressOptions o) : o_(o) {}

  // A response head arrived for a request that waited `latency`.
  void Answered(common::TimePoint now, common::Duration latency) {
    last_answer_ = now;
    samples_[next_ % kSamples] = latency;
    ++next_;
  }

  // Progress seen with no latency to learn from (a token stream's first
  // token, learned by another monitor): others waiting since before now
  // are outpaced.
  void Progressed(common::TimePoint now) { last_answer_ = now; }

  // How long a request may wait, with others waiting beside it and no
  // answer at all, before the upstream counts as stalled.
  common::Duration Window() const {
    size_t n = std::min(next_, kSamples);
    if (n == 0) return o_.ceiling;  // nothing learned yet: the most patient
    std::vector<common::Duration> s(samples_.begin(), samples_.begin() + n);
    size_t k = (n * 9) / 10;
    std::nth_element(s.begin(), s.begin() + k, s.end());
    auto w = std::chrono::duration_cast<common::Duration>(s[k] * o_.factor);
    return std::clamp(w, o_.floor, o_.ceiling);
  }

  // A request now waiting for a response head.
  struct Waiting {
    common::TimePoint since;    // when it began to wait
    common::Duration expect{};  // what it declared it takes; 0: nothing
  };
  bool Stalled(common::TimePoint now, const std::vector<Waiting>& waiting) const {
    if (waiting.size() < o_.min_waiting) return false;
    const common::Duration window = Window();
    size_t overdue = 0;
    for (const Waiting& w : waiting) {
      // Begun before the last answer: outpaced by another, so slow, not
      // evidence that nothing moves.
      if (w.since < last_answer_) continue;
      common::Duration limit =
          w.expect > common::Duration::zero() ? std::clamp(w.expect, o_.floor, o_.ceiling) : window;
      if (now - w.since > limit) ++overdue;
    }
    return overdue >= o_.min_waiting;
  }

  // The same verdict on token streams: `waiting` holds each open stream
  // since its last token (expect: its first-token window, until the first).
  // Streams of one engine interleave, so none is "outpaced" by another;
  // instead the engine as a whole must have given no token for a window.
  bool StreamsStalled(common::TimePoint now, const std::vector<Waiting>& waiting) const {
    if (waiting.size() < o_.min_waiting) return false;
    const common::Duration window = Window();
    if (now - last_answer_ <= window) return false;
    size_t overdue = 0;
    for (const Waiting& w : waiting) {
      common::Duration limit =
          w.expect > common::Duration::zero() ? std::clamp(w.expect, o_.floor, o_.ceiling) : window;
      if (now - w.since > limit) ++overdue;
    }
    return overdue >= o_.min_waiting;
  }

  common::TimePoint last_answer() const { return last_answer_; }

 private:
  ProgressOptions o_;
  std::array<common::Duration, kSamples> samples_{};
  size_t next_ = 0;
  common::TimePoint last_answer_{};
};

}  // namespace gpuha::router
