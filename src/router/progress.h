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
// window = clamp(p90 * factor, floor, ceiling).
//
// Progress is an answer to a request that began no more than a window
// before the newest request answered so far (the frontier of answered
// requests). An answer to a request older than that is not progress. When
// an engine stops, the
// slow requests it had begun may still come back over the next seconds (a
// 1.5 s request begun just before); they say nothing of the requests begun
// since, and once counted as progress they held the verdict back until the
// last of them was in (issue 37: 1.9 s at 500 req/s, 7.9 s at 1,000). A
// healthy queue that drains in order still moves the frontier with every
// answer, however long its requests wait; the window's slack lets a server
// answer a little out of order (kept-alive connections before new ones in
// its accept queue) without its older answers being taken for no progress.
//
// The verdict needs `min_waiting` requests that began after the last
// progress and have all waited past the window:
// - a healthy upstream that keeps answering other requests is never stalled
//   by one slow request (the slow one began before the last progress);
// - a lone slow request is never cut: a single waiting request proves
//   nothing, whatever the window (the prober's hang verdict and the
//   response timeout still apply to it). The one exception is an upstream
//   already judged stalled that has answered nothing since (`need` = 1,
//   the router's judged_stalled): there one overdue request is enough, and
//   it goes to the standby, not lost;
// - an upstream that stopped answering under load is stalled one window
//   after it stopped: at 500 requests a second, 3 requests have waited past
//   a 150 ms window about 156 ms after the last progress.
// A request may declare how long it expects to take (the router reads
// X-Gpuha-Expect-Ms); it is then overdue after that, within floor..ceiling,
// instead of after the learned window: a known-long generation is not taken
// for a stall, and a known-short request shows one sooner. The router needs
// no declaration.
//
//   ProgressMonitor m({.floor = 150ms, .ceiling = 30s});
//   m.Answered(now, latency);                 // on every response head
//   if (m.Stalled(now, {{since, expect}, ...})) ...  // each sweep
//   m.StallDue({...});                        // when the verdict fell due
//
// Pure: time comes in as arguments. Thread-safety: none; each loop keeps one
// per upstream.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
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

  // A response head arrived for a request that waited `latency`: learned,
  // and progress if it began within a window of the newest request
  // answered before it (or after).
  void Answered(common::TimePoint now, common::Duration latency) {
    Learn(latency);
    const common::TimePoint since = now - latency;
    if (since + window_ >= newest_answered_since_) last_progress_ = std::max(last_progress_, now);
    newest_answered_since_ = std::max(newest_answered_since_, since);
  }

  // A latency to learn the window from, with nothing said of progress.
  void Learn(common::Duration latency) {
    samples_[next_ % kSamples] = latency;
    ++next_;
    // The window, from the samples: again every 16 answers (an nth_element
    // over 256 samples per answer cost more than the answer's relay).
    if (next_ <= 16 || next_ % 16 == 0) window_ = ComputeWindow();
  }

  // Progress seen by other means: a token on any of an engine's token
  // streams (they interleave, so any token is progress). Requests waiting
  // since before now are outpaced.
  void Progressed(common::TimePoint now) { last_progress_ = std::max(last_progress_, now); }

  // How long a request may wait, with others waiting beside it and no
  // progress at all, before the upstream counts as stalled.
  common::Duration Window() const { return window_; }

 private:
  common::Duration ComputeWindow() const {
    size_t n = std::min(next_, kSamples);
    if (n == 0) return o_.ceiling;  // nothing learned yet: the most patient
    std::vector<common::Duration> s(samples_.begin(), samples_.begin() + n);
    size_t k = (n * 9) / 10;
    std::nth_element(s.begin(), s.begin() + k, s.end());
    auto w = std::chrono::duration_cast<common::Duration>(s[k] * o_.factor);
    return std::clamp(w, o_.floor, o_.ceiling);
  }

 public:
  // A request now waiting for a response head.
  struct Waiting {
    common::TimePoint since;    // when it began to wait
    common::Duration expect{};  // what it declared it takes; 0: nothing
  };

  // When the verdict on requests awaiting their heads fell (or falls) due:
  // the moment the min_waiting-th request began after the last progress
  // passed its limit. Nothing: not enough such requests. `need` replaces
  // min_waiting when set: an upstream another witness has judged stalled
  // already needs one overdue request, not three.
  std::optional<common::TimePoint> StallDue(const std::vector<Waiting>& waiting,
                                            size_t need = 0) const {
    if (need == 0) need = o_.min_waiting;
    if (waiting.size() < need) return std::nullopt;
    const common::Duration window = Window();
    std::vector<common::TimePoint> due;
    for (const Waiting& w : waiting) {
      // Begun before the last progress: outpaced by another, so slow, not
      // evidence that nothing moves.
      if (w.since < last_progress_) continue;
      due.push_back(w.since + Limit(w, window));
    }
    return NthDue(due, need);
  }
  bool Stalled(common::TimePoint now, const std::vector<Waiting>& waiting) const {
    std::optional<common::TimePoint> due = StallDue(waiting);
    return due && *due < now;
  }

  // The same verdict on token streams: `waiting` holds each open stream
  // since its last token (expect: its first-token window, until the first).
  // Streams of one engine interleave, so none is "outpaced" by another;
  // instead the engine as a whole must have given no token for a window,
  // and min_waiting streams must each be silent past their limit. With
  // fewer streams open than that, every one of them must be: a stream has
  // its engine's rhythm to go by, so one or two streams are judged too
  // (a stuck lone stream waited for response_timeout, 60 s).
  std::optional<common::TimePoint> StreamsStallDue(const std::vector<Waiting>& waiting) const {
    if (waiting.empty()) return std::nullopt;
    const common::Duration window = Window();
    std::vector<common::TimePoint> due;
    for (const Waiting& w : waiting) due.push_back(w.since + Limit(w, window));
    std::optional<common::TimePoint> d = NthDue(due, std::min(o_.min_waiting, waiting.size()));
    if (d) d = std::max(*d, last_progress_ + window);
    return d;
  }
  bool StreamsStalled(common::TimePoint now, const std::vector<Waiting>& waiting) const {
    std::optional<common::TimePoint> due = StreamsStallDue(waiting);
    return due && *due < now;
  }

  common::TimePoint last_progress() const { return last_progress_; }

  // How long `w` may wait: its declared expectation (within floor..ceiling)
  // or the window.
  common::Duration Limit(const Waiting& w, common::Duration window) const {
    return w.expect > common::Duration::zero() ? std::clamp(w.expect, o_.floor, o_.ceiling)
                                               : window;
  }

 private:
  // The n-th earliest of `due` (1-based), if there are n.
  static std::optional<common::TimePoint> NthDue(std::vector<common::TimePoint>& due, size_t n) {
    if (n == 0 || due.size() < n) return std::nullopt;
    std::nth_element(due.begin(), due.begin() + static_cast<std::ptrdiff_t>(n - 1), due.end());
    return due[n - 1];
  }

  ProgressOptions o_;
  common::Duration window_ = o_.ceiling;  // nothing learned yet: the most patient
  std::array<common::Duration, kSamples> samples_{};
  size_t next_ = 0;
  common::TimePoint last_progress_{};
  common::TimePoint newest_answered_since_{};
};

}  // namespace gpuha::router
