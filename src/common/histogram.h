// Histogram: the state of one Prometheus histogram: fixed upper bounds,
// per-bucket counts (not cumulative; the last bucket is +Inf) and the sum of
// what was observed. A value equal to a bound falls in that bound's bucket
// (`le`).
//
//   Histogram h({0.005, 0.01, 0.1});
//   h.Observe(0.007);
//   h.AppendTo(&prom_text, "gpuha_x_seconds", {{"step", "fenced"}});
//
// Thread-safety: none; owners lock around it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/prometheus.h"

namespace gpuha::common {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

  void Observe(double v) {
    const auto b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    counts_[static_cast<size_t>(b)]++;
    sum_ += v;
  }
  // Adds `other`, which must have the same bounds.
  void Merge(const Histogram& other) {
    for (size_t i = 0; i < counts_.size() && i < other.counts_.size(); ++i) {
      counts_[i] += other.counts_[i];
    }
    sum_ += other.sum_;
  }
  void AppendTo(PromText* p, absl::string_view name, const PromLabels& labels) const {
    p->Histogram(name, labels, bounds_.data(), counts_.data(), bounds_.size(), sum_);
  }
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
};

}  // namespace gpuha::common
