// TrafficHistory: the data plane's traffic over the last minutes, for the
// dashboard's graphs. Routers send their cumulative figures (RouterStats, on
// their route acks) about once a second; each report adds what changed since
// the router's previous one (a lower figure means the router restarted: all
// of it is new). A router's first report, after it connects, is a baseline. Once a second the sums
// become one point: requests, errors and re-sends per second, p99 latency from the latency buckets.
// The points live in memory: a restarted controller draws from its start. Failovers per minute
// come from the stored event log instead (FailoversPerMinute), so they outlive a restart.
//
//   TrafficHistory h(600);                         // ten minutes of points
//   h.Report("r1", ack.stats(), now_ms);           // each router ack with stats
//   h.Tick(now_ms);                                // every controller tick
//   api_json = h.PointsJson(); routers = h.RoutersJson();
//
// Thread-safety: none; the controller holds its lock around it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gpuha/v1/routes.pb.h"

namespace gpuha::controller {

class TrafficHistory {
 public:
  struct Point {
    double unix_ms = 0;
    double requests_per_s = 0;
    double errors_per_s = 0;
    double resends_per_s = 0;
    std::optional<double> p99_ms;  // none answered in the interval: no figure
  };
  explicit TrafficHistory(size_t keep) : keep_(keep) {}

  void Report(const std::string& router, const v1::RouterStats& stats, double unix_ms);
  void Forget(const std::string& router) { routers_.erase(router); }
  // Adds a point once `interval_ms` has passed since the last one.
  void Tick(double unix_ms, double interval_ms = 1000);

  const std::deque<Point>& points() const { return points_; }
  nlohmann::json PointsJson() const;
  // Each reporting router's latest figures and when they came.
  nlohmann::json RoutersJson() const;

  // The q-quantile (0..1) of a histogram, interpolated inside its bucket as
  // Prometheus' histogram_quantile does; `counts` has one entry per bound
  // and a last one for +Inf (which answers the highest bound). nullopt when
  // it holds nothing.
  static std::optional<double> Quantile(double q, const std::vector<double>& bounds,
                                        const std::vector<uint64_t>& counts);

  // Failovers in the minute before each point, every `step_ms` from
  // `since_ms` (at most `span_ms` back) up to `now_ms`, from the failovers'
  // detection times: [{unix_ms, failovers_per_min}], oldest first.
  static nlohmann::json FailoversPerMinute(const std::vector<double>& detected_unix_ms,
                                           double since_ms, double now_ms, double span_ms = 600'000,
                                           double step_ms = 5'000);

 private:
  struct Sums {
    uint64_t answered = 0, errors = 0, resends = 0;
    std::vector<uint64_t> latency;  // per bucket
  };
  struct Seen {
    v1::RouterStats last;
    double unix_ms = 0;
  };
  size_t keep_;
  std::map<std::string, Seen> routers_;
  std::vector<double> bounds_;  // from the routers' reports
  Sums pending_;                // since the last point
  std::optional<double> last_point_ms_;
  std::deque<Point> points_;
};

}  // namespace gpuha::controller
