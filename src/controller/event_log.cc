#include "controller/event_log.h"

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

using nlohmann::json;

const Event& EventLog::Append(Event e) {
  e.id = next_id_++;
  events_.push_back(std::move(e));
  if (events_.size() > keep_) events_.pop_front();
  return events_.back();
}

void EventLog::Restore(Event e) {
  next_id_ = std::max(next_id_, e.id + 1);
  events_.push_back(std::move(e));
  if (events_.size() > keep_) events_.pop_front();
}

std::vector<Event> EventLog::Since(int64_t after_id, size_t limit) const {
  std::vector<Event> out;
  for (const Event& e : events_) {
    if (out.size() >= limit) break;
    if (e.id > after_id) out.push_back(e);
  }
  return out;
}

std::vector<Event> EventLog::Newest(size_t limit) const {
  size_t skip = events_.size() > limit ? events_.size() - limit : 0;
  return std::vector<Event>(events_.begin() + static_cast<std::ptrdiff_t>(skip), events_.end());
}

void FailoverStepHistograms::Observe(const std::vector<FailoverTiming>& timings) {
  Walk(timings, true);
}

void FailoverStepHistograms::Skip(const std::vector<FailoverTiming>& timings) {
  Walk(timings, false);
}

void FailoverStepHistograms::Walk(const std::vector<FailoverTiming>& timings, bool count) {
  // Failovers that left the event log cannot come back: forget them.
  if (!timings.empty()) seen_.erase(seen_.begin(), seen_.lower_bound(timings.front().detected.id));
  for (const FailoverTiming& t : timings) {
    const Event& d = t.detected;
    // Steps in kSteps' order; the fault is timed by the wall clock (it
    // comes from the agent), the others by the controller's monotonic one.
    const std::array<std::optional<double>, kSteps.size()> ms = {
        t.fault_seen ? std::optional(d.unix_ms - t.fault_seen->unix_ms) : std::nullopt,
        t.fenced ? std::optional(t.fenced->mono_ms - d.mono_ms) : std::nullopt,
        t.routes_pushed ? std::optional(t.routes_pushed->mono_ms - d.mono_ms) : std::nullopt,
        t.routers_acked ? std::optional(t.routers_acked->mono_ms - d.mono_ms) : std::nullopt};
    unsigned& seen = seen_[d.id];
    for (size_t i = 0; i < ms.size(); ++i) {
      if (!ms[i] || (seen & (1u << i)) != 0) continue;
      seen |= 1u << i;
      if (!count) continue;
      steps_[i].Observe(std::max(0.0, *ms[i] / 1000));
    }
  }
}

void FailoverStepHistograms::AppendTo(common::PromText* p) const {
  const char* name = "gpuha_controller_failover_step_seconds";
  p->Family(name, "histogram",
            "Duration of each failover step, from the controller's events (fault_to_detected "
            "by the wall clock).");
  for (size_t i = 0; i < kSteps.size(); ++i) steps_[i].AppendTo(p, name, {{"step", kSteps[i]}});
}

}  // namespace gpuha::controller
