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
  fresh.last = fresh.heard = clock_->Now();
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
  s.last = s.heard = now;
  s.broken = false;
  s.held = false;
  s.shared_overdue = false;
  s.hold_to_ceiling = false;
}

bool FailureDetector::HoldToCeiling(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.broken) return false;
  NodeState& s = it->second;
  if (clock_->Now() - s.heard >= options_.ceiling) return false;
  s.hold_to_ceiling = true;
  if (s.liveness == Liveness::kFailed) s.liveness = Liveness::kSuspect;  // watched on
  return true;
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
    if (s.liveness == Liveness::kFailed) continue;
    s.last = now;
    s.held = false;
    s.shared_overdue = false;
  }
}

void FailureDetector::ForgiveSilence(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.broken || it->second.liveness == Liveness::kFailed) return;
  it->second.last = clock_->Now();
  it->second.held = false;
  it->second.shared_overdue = false;
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

common::Duration FailureDetector::OverdueAfter(const NodeState& s) const {
  const common::Duration threshold = ThresholdOf(s);
  if (s.intervals_ms.empty()) return threshold / 2;
  const auto mean = std::chrono::duration_cast<common::Duration>(
      std::chrono::duration<double, std::milli>(s.sum / double(s.intervals_ms.size())));
  return std::min(threshold, mean + (threshold - mean) / 2);
}

std::vector<LivenessChange> FailureDetector::Check() {
  std::vector<LivenessChange> changes;
  common::TimePoint now = clock_->Now();
  // Shared silence: more than half the watched nodes overdue (streams
  // intact) at once. Each node is judged by its own rhythm, so a live node
  // between slow beats is not counted.
  size_t watched = 0, overdue = 0;
  for (const auto& [node, s] : nodes_) {
    if (s.liveness == Liveness::kFailed) continue;
    ++watched;
    overdue += !s.broken && now - s.last >= OverdueAfter(s);
  }
  const bool shared = watched >= 2 && overdue * 2 > watched;
  if (shared) {
    last_shared_ = now;
    for (auto& [node, s] : nodes_) {
      if (s.liveness != Liveness::kFailed && !s.broken && now - s.last >= OverdueAfter(s)) {
        s.shared_overdue = true;
      }
    }
  }
  for (auto& [node, s] : nodes_) {
    if (s.liveness == Liveness::kFailed) continue;
    Liveness to = Liveness::kAlive;
    std::string reason;
    common::Duration silent_for = now - s.last;
    common::Duration threshold = ThresholdOf(s);
    // Held: past its threshold while the silence is shared, or was until
    // less than a threshold ago (beats come back one by one, a tick apart);
    // never once the node has been unheard for the ceiling.
    const bool past = silent_for >= threshold && now - s.heard < options_.ceiling;
    const bool shared_hold = past && (shared || ((s.held || s.shared_overdue) && last_shared_ &&
                                                 now - *last_shared_ < threshold));
    if (s.broken) {
      to = now - s.broken_at >= options_.broken_grace ? Liveness::kFailed : Liveness::kSuspect;
      reason = "stream broke";
    } else if (past && s.hold_to_ceiling && !shared_hold) {
      to = Liveness::kSuspect;  // the watcher's hold (HoldToCeiling), already reported
    } else if (shared_hold) {
      to = Liveness::kSuspect;
      if (!s.held) {
        s.held = true;
        changes.push_back(
            {node, s.liveness, to,
             absl::StrCat("silent ", common::ToMillis(silent_for), " ms (threshold ",
                          common::ToMillis(threshold), " ms), held: ",
                          shared ? absl::StrCat(overdue, " of ", watched,
                                                " watched nodes are silent together")
                                 : absl::StrCat("it was silent with most watched nodes ",
                                                common::ToMillis(now - *last_shared_), " ms ago"),
                          ", more likely the controller's own delay than theirs; held up to ",
                          common::ToMillis(options_.ceiling), " ms unheard"),
             s.last, /*held=*/true});
        s.liveness = to;
        continue;
      }
    } else if (silent_for >= threshold) {
      to = Liveness::kFailed;
      reason = absl::StrCat("silent ", common::ToMillis(silent_for), " ms (threshold ",
                            common::ToMillis(threshold), " ms)");
      if (s.held) absl::StrAppend(&reason, ", held as shared silence before");
      if (s.hold_to_ceiling) {
        absl::StrAppend(&reason, ", held until unheard for ", common::ToMillis(options_.ceiling),
                        " ms");
      }
    } else if (silent_for >= std::min(threshold, options_.suspect_after)) {
      to = Liveness::kSuspect;
      reason = absl::StrCat("silent ", common::ToMillis(silent_for), " ms");
    }
    if (to != s.liveness) {
      changes.push_back({node, s.liveness, to, reason, s.last, /*held=*/false, s.broken});
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
