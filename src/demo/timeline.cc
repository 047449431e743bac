#include "demo/timeline.h"

#include "absl/strings/str_format.h"

namespace gpuha::demo {

std::string Ms(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.1f", *v) : std::string("-");
}

void ControllerSteps(const std::vector<api::Event>& events, const std::string& node,
                     int64_t t0_unix_ns, FaultTimeline* t) {
  auto ms = [t0_unix_ns](const api::Event& e) { return e.unix_ms - double(t0_unix_ns) / 1e6; };
  for (const api::FailoverTiming& f : api::FailoverTimings(events)) {
    if (f.detected.node != node) continue;
    t->detected_ms = ms(f.detected);
    if (f.fenced) t->fenced_ms = ms(*f.fenced);
    if (f.routes_pushed) t->routes_pushed_ms = ms(*f.routes_pushed);
    if (f.routers_acked) t->routers_acked_ms = ms(*f.routers_acked);
    if (f.fenced && f.routes_pushed) t->routes_before_fence = f.routes_pushed->id < f.fenced->id;
    return;
  }
}

void GpuSteps(const std::vector<api::Event>& events, const std::string& node, int64_t t0_unix_ns,
              FaultTimeline* t) {
  auto ms = [t0_unix_ns](const api::Event& e) { return e.unix_ms - double(t0_unix_ns) / 1e6; };
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].type != "gpu_out" || events[i].node != node) continue;
    t->detected_ms = ms(events[i]);
    for (size_t j = i + 1; j < events.size(); ++j) {
      if (!t->routes_pushed_ms && events[j].type == "routes_pushed") {
        t->routes_pushed_ms = ms(events[j]);
      } else if (t->routes_pushed_ms && events[j].type == "routers_acked") {
        t->routers_acked_ms = ms(events[j]);
        return;
      }
    }
    return;
  }
}

}  // namespace gpuha::demo
