// EngineWatch: the inference engine's own progress, read from its metrics,
// as a second opinion beside its readiness probe. A Triton whose CUDA
// context broke, or a vLLM whose engine core deadlocked, keeps answering
// its health check; its metrics still tell: requests pending, and the
// counter of work done no longer moving.
//
//   Triton: nv_inference_pending_request_count (pending),
//           nv_inference_exec_count (progress)
//   vLLM:   vllm:num_requests_running + vllm:num_requests_waiting (pending),
//           vllm:generation_tokens_total (progress)
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
};

// Sums each family over its label sets. nullopt when the text holds neither
// Triton's nor vLLM's families (then the engine cannot be judged).
std::optional<EngineSample> ParseEngineMetrics(std::string_view text);

// Like the router's ProgressMonitor, it wants `min_pending` requests
// waiting before silence means anything: one or two legitimately slow
// requests on an otherwise idle engine are not a stall, whatever their
// length; an engine that stopped under load piles requests up at once.
class EngineWatch {
 public:
  explicit EngineWatch(common::Duration stall_after, double min_pending = 3)
      : stall_after_(stall_after), min_pending_(min_pending) {}
  // One scrape at `now`; true while the engine is stalled: at least
  // min_pending requests pending and progress unchanged for stall_after.
  bool Observe(common::TimePoint now, const EngineSample& s) {
    if (!progress_ || s.progress != *progress_ || s.pending < min_pending_) {
      progress_ = s.progress;
      moved_at_ = now;
      return false;
    }
    return now - moved_at_ >= stall_after_;
  }
  // Since when nothing has moved (meaningful while Observe says stalled).
  common::TimePoint moved_at() const { return moved_at_; }

 private:
  common::Duration stall_after_;
  double min_pending_;
  std::optional<double> progress_;
  common::TimePoint moved_at_{};
};

}  // namespace gpuha::agent
