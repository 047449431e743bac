#include "controller/traffic_history.h"

#include <algorithm>
#include <cmath>

namespace gpuha::controller {

using nlohmann::json;

namespace {

// What grew from `before` to `now`; a counter that went down started again.
uint64_t Grew(uint64_t before, uint64_t now) { return now >= before ? now - before : now; }

}  // namespace

void TrafficHistory::Report(const std::string& router, const v1::RouterStats& s, double unix_ms) {
  auto it = routers_.find(router);
  if (it == routers_.end()) {
    // The first report of a router (new, reconnected, or after this
    // controller restarted) is a baseline: what it served before is not
    // traffic of this second.
    routers_[router] = {s, unix_ms};
    return;
  }
  const v1::RouterStats empty;
  const v1::RouterStats& before = it->second.last;
  // A restart shows as the answered count going down: every figure is new.
  const bool restarted = s.answered() < before.answered();
  const v1::RouterStats& base = restarted ? empty : before;
  pending_.answered += Grew(base.answered(), s.answered());
  pending_.errors += Grew(base.errors(), s.errors());
  pending_.resends += Grew(base.resends(), s.resends());
  if (bounds_.empty() || bounds_.size() == static_cast<size_t>(s.latency_bounds_size())) {
    bounds_.assign(s.latency_bounds().begin(), s.latency_bounds().end());
    pending_.latency.resize(bounds_.size() + 1, 0);
    if (static_cast<size_t>(s.latency_counts_size()) == pending_.latency.size()) {
      for (size_t b = 0; b < pending_.latency.size(); ++b) {
        uint64_t was =
            static_cast<int>(b) < base.latency_counts_size() ? base.latency_counts(b) : 0;
        pending_.latency[b] += Grew(was, s.latency_counts(b));
      }
    }
  }
  routers_[router] = {s, unix_ms};
}

void TrafficHistory::Tick(double unix_ms, double interval_ms) {
  if (!last_point_ms_) {
    last_point_ms_ = unix_ms;
    return;
  }
  const double elapsed_ms = unix_ms - *last_point_ms_;
  if (elapsed_ms < interval_ms) return;
  const double seconds = elapsed_ms / 1000;
  Point p;
  p.unix_ms = unix_ms;
  p.requests_per_s = pending_.answered / seconds;
  p.errors_per_s = pending_.errors / seconds;
  p.resends_per_s = pending_.resends / seconds;
  if (auto q = Quantile(0.99, bounds_, pending_.latency)) p.p99_ms = *q * 1000;
  points_.push_back(p);
  while (points_.size() > keep_) points_.pop_front();
  pending_ = Sums{.latency = std::vector<uint64_t>(pending_.latency.size(), 0)};
  last_point_ms_ = unix_ms;
}

std::optional<double> TrafficHistory::Quantile(double q, const std::vector<double>& bounds,
                                               const std::vector<uint64_t>& counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0 || bounds.empty() || counts.size() != bounds.size() + 1) return std::nullopt;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    if (static_cast<double>(below + counts[b]) >= rank && counts[b] > 0) {
      if (b == bounds.size()) return bounds.back();  // past the last bound
      const double lower = b == 0 ? 0 : bounds[b - 1];
      return lower + (bounds[b] - lower) * (rank - static_cast<double>(below)) /
                         static_cast<double>(counts[b]);
    }
    below += counts[b];
  }
  return bounds.back();
}

json TrafficHistory::FailoversPerMinute(const std::vector<double>& detected_unix_ms,
                                        double since_ms, double now_ms, double span_ms,
                                        double step_ms) {
  std::vector<double> at = detected_unix_ms;
  std::sort(at.begin(), at.end());
  json out = json::array();
  // Points on the step's grid, ending at now: each counts (t - 60 s, t].
  const double first = std::max(since_ms, now_ms - span_ms);
  for (int64_t i = static_cast<int64_t>(std::floor((now_ms - first) / step_ms)); i >= 0; --i) {
    const double t = now_ms - static_cast<double>(i) * step_ms;
    auto lo = std::upper_bound(at.begin(), at.end(), t - 60'000);
    auto hi = std::upper_bound(at.begin(), at.end(), t);
    out.push_back({{"unix_ms", t}, {"failovers_per_min", static_cast<double>(hi - lo)}});
  }
  return out;
}

json TrafficHistory::PointsJson() const {
  json points = json::array();
  for (const Point& p : points_) {
    points.push_back({{"unix_ms", p.unix_ms},
                      {"requests_per_s", p.requests_per_s},
                      {"errors_per_s", p.errors_per_s},
                      {"resends_per_s", p.resends_per_s},
                      {"p99_ms", p.p99_ms ? json(*p.p99_ms) : json()}});
  }
  return points;
}

json TrafficHistory::RoutersJson() const {
  json out = json::array();
  for (const auto& [id, seen] : routers_) {
    const v1::RouterStats& s = seen.last;
    std::vector<uint64_t> counts(s.latency_counts().begin(), s.latency_counts().end());
    std::vector<double> bounds(s.latency_bounds().begin(), s.latency_bounds().end());
    std::optional<double> p99 = Quantile(0.99, bounds, counts);
    out.push_back({{"router", id},
                   {"reported_unix_ms", seen.unix_ms},
                   {"answered", s.answered()},
                   {"errors", s.errors()},
                   {"resends", s.resends()},
                   {"stalls", s.stalls()},
                   {"in_flight", s.in_flight()},
                   {"p99_ms_since_start", p99 ? json(*p99 * 1000) : json()}});
  }
  return out;
}

}  // namespace gpuha::controller
