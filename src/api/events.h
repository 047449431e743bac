// The operator API's events and the failover walk read from them, shared by
// the controller (which records and serves them), `gpuha ctl` and `gpuha
// demo` (which read them over the API): a small module of its own, so that
// the tools that only read the API do not link the controller.
//
// Every state change the controller makes records one Event with a monotonic
// and a wall timestamp; a failover is the run of events that a `detected`
// event starts: fault seen -> detected -> fenced -> routes pushed -> routers
// acknowledged.
//
//   auto e = EventFromJson(json);                  // errors name the field
//   for (const FailoverTiming& f : FailoverTimings(events)) ...
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::api {

struct Event {
  int64_t id = 0;
  double mono_ms = 0;     // since the controller started; orders and times a failover
  double unix_ms = 0;     // wall clock, fractional: other processes time faults against it
  std::string type = {};  // fault_seen, detected, fenced, routes_pushed, routers_acked, ...
  std::string node = {};
  uint64_t epoch = 0;
  std::string detail = {};
};
nlohmann::json EventJson(const Event& e);
// The inverse of EventJson; errors name the field.
[[nodiscard]] absl::StatusOr<Event> EventFromJson(const nlohmann::json& j);

// One failover's steps, each the first matching event after `detected` (of
// the same epoch or later) and before the controller restarted: fenced (or
// fence_unconfirmed) of the same node and routes pushed, both before the next
// failover's `detected`, then routers acknowledged (an acknowledgement of a
// later version covers this one's routes too). fault_seen is the fault's
// first sighting: the node's fault_seen event of the same epoch just before
// `detected` (the agent's), or a router's router_hint of the node within
// kRouterHintWindowMs before it, whichever came first.
inline constexpr double kRouterHintWindowMs = 2000;
struct FailoverTiming {
  Event detected = {};
  std::optional<Event> fault_seen = {}, fenced = {}, routes_pushed = {}, routers_acked = {};
};
// Every failover in `events` (ordered by id), oldest first.
std::vector<FailoverTiming> FailoverTimings(const std::vector<Event>& events);

}  // namespace gpuha::api
