#include "api/events.h"

#include "absl/strings/str_cat.h"

namespace gpuha::api {

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

}  // namespace gpuha::api
