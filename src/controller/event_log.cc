#include "controller/event_log.h"

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

using nlohmann::json;

json EventJson(const Event& e) {
  return {{"id", e.id},     {"mono_ms", e.mono_ms}, {"unix_ms", e.unix_ms}, {"type", e.type},
          {"node", e.node}, {"epoch", e.epoch},     {"detail", e.detail}};
}

absl::StatusOr<Event> EventFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("event: not a JSON object");
  Event e;
  auto field = [&](const char* key, auto* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    try {
      *out = it->get<std::decay_t<decltype(*out)>>();
    } catch (const json::exception&) {
      return absl::InvalidArgumentError(absl::StrCat("event.", key, ": wrong type"));
    }
    return absl::OkStatus();
  };
  for (absl::Status s :
       {field("id", &e.id), field("mono_ms", &e.mono_ms), field("unix_ms", &e.unix_ms),
        field("type", &e.type), field("node", &e.node), field("epoch", &e.epoch),
        field("detail", &e.detail)}) {
    if (!s.ok()) return s;
  }
  if (e.type.empty()) return absl::InvalidArgumentError("event.type: missing");
  return e;
}

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

std::vector<FailoverTiming> FailoverTimings(const std::vector<Event>& events) {
  std::vector<FailoverTiming> out;
  for (size_t d = 0; d < events.size(); ++d) {
    const Event& det = events[d];
    if (det.type != "detected") continue;
    FailoverTiming f{.detected = det};
    for (size_t i = d; i-- > 0;) {
      const Event& e = events[i];
      if (e.type == "fault_seen" && e.node == det.node && e.epoch == det.epoch) {
        f.fault_seen = e;
        break;
      }
      if (e.epoch < det.epoch) break;
    }
    // A router that saw the node's server fail (a refused or reset
    // connection, a stalled answer) hints it within 20 ms, often before the
    // agent's next probe: the earliest hint shortly before `detected` (by
    // when the controller logged it) is when the fault was first seen. The
    // node's previous failover ends the search.
    for (size_t i = d; i-- > 0;) {
      const Event& e = events[i];
      if (e.type == "controller_started") break;
      if (det.mono_ms - e.mono_ms > kRouterHintWindowMs) break;
      if (e.node != det.node) continue;
      if (e.type == "detected") break;
      // The agent's sighting carries the agent's clock, a hint the
      // controller's: one after `detected` is a clock ahead, and loses.
      if (e.type == "router_hint" && (!f.fault_seen || e.unix_ms < f.fault_seen->unix_ms ||
                                      f.fault_seen->unix_ms > det.unix_ms)) {
        f.fault_seen = e;
      }
    }
    bool next_failover = false;  // fenced and routes_pushed belong to this one only
    for (size_t i = d + 1; i < events.size(); ++i) {
      const Event& e = events[i];
      // Another controller process: its monotonic clock is not this one's.
      if (e.type == "controller_started") break;
      if (e.epoch < det.epoch) continue;
      if (e.type == "detected") next_failover = true;
      if (!next_failover && !f.fenced && e.node == det.node &&
          (e.type == "fenced" || e.type == "fence_unconfirmed")) {
        f.fenced = e;
      }
      if (!next_failover && !f.routes_pushed && e.type == "routes_pushed") f.routes_pushed = e;
      // An acknowledgement of a later version covers this failover's routes.
      if (f.routes_pushed && !f.routers_acked && e.type == "routers_acked") f.routers_acked = e;
      if (f.fenced && f.routers_acked) break;
    }
    out.push_back(std::move(f));
  }
  return out;
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
