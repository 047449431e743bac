#include "demo/timeline.h"

#include "absl/strings/str_format.h"

namespace gpuha::demo {

std::string Ms(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.1f", *v) : std::string("-");
}

void ControllerSteps(const std::vector<controller::Event>& events, const std::string& node,
                     int64_t t0_unix_ns, FaultTimeline* t) {
  auto ms = [t0_unix_ns](const controller::Event& e) {
    return e.unix_ms - double(t0_unix_ns) / 1e6;
  };
  for (const controller::FailoverTiming& f : controller::FailoverTimings(events)) {
    if (f.detected.node != node) continue;
    t->detected_ms = ms(f.detected);
    if (f.fenced) t->fenced_ms = ms(*f.fenced);
    if (f.routes_pushed) t->routes_pushed_ms = ms(*f.routes_pushed);
    if (f.routers_acked) t->routers_acked_ms = ms(*f.routers_acked);
    if (f.fenced && f.routes_pushed) t->routes_before_fence = f.routes_pushed->id < f.fenced->id;
    return;
  }
}

}  // namespace gpuha::demo
