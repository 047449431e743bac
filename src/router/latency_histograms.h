// LatencyHistograms: the router's request latency, from a request's head
// read to its answer written, by tenant and by answer class (1xx..5xx; "none"
// when the client went away before any answer), as Prometheus histograms
// (gpuha_router_request_duration_seconds). Buckets run from 1 ms to 60 s,
// about 20% apart from 5 to 20 ms, where KServe calls answer: a quantile is
// interpolated inside its bucket, so with Prometheus' default 5/10/25 ms a
// p99 of 8.2 ms read 10.0 (the dashboard's, against the demo's own). They
// keep every bound of those defaults, so no `le` series goes away.
//
//   LatencyHistograms h;                          // one per event loop
//   h.Observe("acme", 200, elapsed);              // the loop's thread
//   LatencyHistograms::Map all; h.AddTo(&all);    // a scrape, any thread
//
// Thread-safety: every call takes the object's mutex. Only the owning loop
// writes, so the lock is uncontended except while a scrape reads.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"

namespace gpuha::router {

class LatencyHistograms {
 public:
  static constexpr std::array<double, 27> kBounds = {
      0.001, 0.0025, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,  0.0125,
      0.015, 0.0175, 0.02,  0.025, 0.03,  0.04,  0.05,  0.075, 0.1,
      0.15,  0.25,   0.5,   1,     2.5,   5,     10,    30,    60};
  static constexpr std::array<const char*, 6> kResults = {"none", "1xx", "2xx",
                                                          "3xx",  "4xx", "5xx"};
  struct Counts {
    std::array<uint64_t, kBounds.size() + 1> buckets{};  // per bucket, not cumulative; last: +Inf
    double sum = 0;                                      // seconds
  };
  // (tenant, result) -> counts; ordered, so the exposition is stable.
  using Map = std::map<std::pair<std::string, std::string>, Counts>;

  // `status`: the answer's status code; 0 when none was sent.
  void Observe(const std::string& tenant, int status, common::Duration elapsed) {
    const double s = std::chrono::duration<double>(elapsed).count();
    size_t b = 0;
    while (b < kBounds.size() && s > kBounds[b]) ++b;
    const size_t r = status >= 100 && status < 600 ? static_cast<size_t>(status / 100) : 0;
    std::lock_guard<std::mutex> lock(mu_);
    Counts& c = by_tenant_[tenant][r];
    c.buckets[b]++;
    c.sum += s;
  }

  void AddTo(Map* into) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [tenant, results] : by_tenant_) {
      for (size_t r = 0; r < results.size(); ++r) {
        const Counts& c = results[r];
        uint64_t n = 0;
        for (uint64_t v : c.buckets) n += v;
        if (n == 0) continue;
        Counts& out = (*into)[{tenant, kResults[r]}];
        for (size_t b = 0; b < c.buckets.size(); ++b) out.buckets[b] += c.buckets[b];
        out.sum += c.sum;
      }
    }
  }

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::array<Counts, kResults.size()>> by_tenant_;
};

}  // namespace gpuha::router
