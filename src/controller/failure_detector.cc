#include "controller/failure_detector.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

const char* LivenessName(Liveness l) {
  switch (l) {
    case Liveness::kAlive:
      return "alive";
    case Liveness::kSuspect:
      return "suspect";
    case Liveness::kFailed:
      return "failed";
  }
  return "failed";
}

FailureDetector::FailureDetector(DetectorOptions options, common::Clock* clock)
    : options_(options), clock_(clock) {}

void FailureDetector::Connected(const std::string& node) {
  // A (re)connected agent starts a fresh history; whether a node that had
  // failed may serve again is the controller's call, not the detector's.
  NodeState fresh;
  fresh.last = clock_->Now();
  nodes_[node] = std::move(fresh);
}

void FailureDetector::Heartbeat(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return Connected(node);
  NodeState& s = it->second;
  common::TimePoint now = clock_->Now();
  double ms = std::chrono::duration<double, std::milli>(now - s.last).count();
  s.intervals_ms.push_back(ms);
  s.sum += ms;
  s.sum_sq += ms * ms;
  if (s.intervals_ms.size() > options_.window) {
    double old = s.intervals_ms.front();
    s.intervals_ms.pop_front();
    s.sum -= old;
    s.sum_sq -= old * old;
  }
  s.last = now;
  s.broken = false;
}

void FailureDetector::StreamBroken(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  it->second.broken = true;
  it->second.broken_at = clock_->Now();
}

void FailureDetector::Forget(const std::string& node) { nodes_.erase(node); }

void FailureDetector::ForgiveSilence() {
  common::TimePoint now = clock_->Now();
  for (auto& [node, s] : nodes_) {
    if (s.liveness != Liveness::kFailed) s.last = now;
  }
}

void FailureDetector::ForgiveSilence(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.broken || it->second.liveness == Liveness::kFailed) return;
  it->second.last = clock_->Now();
}

common::Duration FailureDetector::ThresholdOf(const NodeState& s) const {
  if (s.intervals_ms.size() < options_.warmup_intervals) {
    return std::max(options_.floor, options_.warmup_threshold);
  }
  double n = double(s.intervals_ms.size());
  double mean = s.sum / n;
  double var = std::max(0.0, s.sum_sq / n - mean * mean);
  double ms = mean + options_.k * std::sqrt(var);
  auto d =
      std::chrono::duration_cast<common::Duration>(std::chrono::duration<double, std::milli>(ms));
  return std::clamp(d, options_.floor, options_.ceiling);
}

common::Duration FailureDetector::Threshold(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? options_.floor : ThresholdOf(it->second);
}

std::vector<LivenessChange> FailureDetector::Check() {
  std::vector<LivenessChange> changes;
  common::TimePoint now = clock_->Now();
  for (auto& [node, s] : nodes_) {
    if (s.liveness == Liveness::kFailed) continue;
    Liveness to = Liveness::kAlive;
    std::string reason;
    common::Duration silent = now - s.last;
    common::Duration threshold = ThresholdOf(s);
    if (s.broken) {
      to = now - s.broken_at >= options_.broken_grace ? Liveness::kFailed : Liveness::kSuspect;
      reason = "stream broke";
    } else if (silent >= threshold) {
      to = Liveness::kFailed;
      reason = absl::StrCat("silent ", common::ToMillis(silent), " ms (threshold ",
                            common::ToMillis(threshold), " ms)");
    } else if (silent >= std::min(threshold, options_.suspect_after)) {
      to = Liveness::kSuspect;
      reason = absl::StrCat("silent ", common::ToMillis(silent), " ms");
    }
    if (to != s.liveness) {
      changes.push_back({node, s.liveness, to, reason, s.last});
      s.liveness = to;
    }
  }
  return changes;
}

Liveness FailureDetector::state(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? Liveness::kFailed : it->second.liveness;
}

}  // namespace gpuha::controller
