// EventLog: the controller's recent events (api::Event, src/api/events.h),
// in order, and the failover-step histograms fed from their timings.
//
//   EventLog log(10000);
//   log.Append({.type = "detected", .node = "gpu-2", ...});   // id assigned
//   for (const FailoverTiming& f : FailoverTimings(log.Since(0))) ...
//
// Thread-safety: none; the controller holds its lock around it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "api/events.h"
#include "common/histogram.h"
#include "common/prometheus.h"

namespace gpuha::controller {

// The operator API's event and failover walk (src/api/events.h), the
// controller's throughout.
using api::Event;
using api::EventFromJson;
using api::EventJson;
using api::FailoverTiming;
using api::FailoverTimings;
using api::kRouterHintWindowMs;

class EventLog {
 public:
  explicit EventLog(size_t keep) : keep_(keep) {}
  // Assigns the next id and keeps the newest `keep` events.
  const Event& Append(Event e);
  // Restores an event read back from the store (its id is kept).
  void Restore(Event e);
  std::vector<Event> Since(int64_t after_id, size_t limit = SIZE_MAX) const;
  // Each event kept, oldest first, without a copy.
  template <class F>
  void ForEach(F&& f) const {
    for (const Event& e : events_) f(e);
  }
  // The newest `limit` events, oldest first.
  std::vector<Event> Newest(size_t limit) const;
  int64_t next_id() const { return next_id_; }

 private:
  size_t keep_;
  std::deque<Event> events_;
  int64_t next_id_ = 1;
};

// gpuha_controller_failover_step_seconds{step}: how long each step of a
// failover took (fault_to_detected, detected_to_fenced,
// detected_to_routes_pushed, detected_to_routers_acked), 1 ms to 30 s. Fed
// the same FailoverTimings walk as /api/v1/failovers, so the histogram and
// the table agree; each step of each failover is counted once, when it is
// first seen.
//
//   h.Skip(FailoverTimings(restored));   // at recovery: counted before the restart
//   h.Observe(FailoverTimings(events));  // at each scrape: new steps only
//   h.AppendTo(&prom_text);
class FailoverStepHistograms {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,   30};
  static constexpr std::array<const char*, 4> kSteps = {"fault_to_detected", "detected_to_fenced",
                                                        "detected_to_routes_pushed",
                                                        "detected_to_routers_acked"};
  void Observe(const std::vector<FailoverTiming>& timings);
  // Marks the steps present as counted without counting them.
  void Skip(const std::vector<FailoverTiming>& timings);
  void AppendTo(common::PromText* p) const;

 private:
  void Walk(const std::vector<FailoverTiming>& timings, bool count);
  std::vector<common::Histogram> steps_ = std::vector<common::Histogram>(
      kSteps.size(), common::Histogram({kBounds.begin(), kBounds.end()}));
  std::map<int64_t, unsigned> seen_;  // detected event id -> steps counted (bits)
};

}  // namespace gpuha::controller
