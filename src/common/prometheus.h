// PromText: writes the Prometheus text exposition format (version 0.0.4).
// Each family is declared once with its HELP and TYPE, then its samples.
//
//   PromText p;
//   p.Family("gpuha_agent_heartbeats_sent_total", "counter", "Heartbeats written");
//   p.Sample("gpuha_agent_heartbeats_sent_total", {{"node", "n1"}}, 42);
//   std::string body = p.str();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace gpuha::common {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

class PromText {
 public:
  void Family(absl::string_view name, absl::string_view type, absl::string_view help);
  void Sample(absl::string_view name, const PromLabels& labels, double value);
  // One histogram's samples under a family declared with type "histogram":
  // NAME_bucket{...,le} (cumulative), NAME_sum and NAME_count. `counts` has
  // one entry per bound and a last one for +Inf, each not cumulative.
  void Histogram(absl::string_view name, const PromLabels& labels, const double* bounds,
                 const uint64_t* counts, size_t n_bounds, double sum);
  const std::string& str() const { return out_; }
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  std::string out_;
};

// gpuha_build_info{component,version} and the process_* families that the
// Prometheus client libraries export (CPU seconds, resident and virtual
// memory, open and maximum descriptors, start time), read from /proc and
// getrusage, so every component's page says what runs and what it costs.
void AppendProcessFamilies(absl::string_view component, PromText* p);

// Escapes a label value: backslash, double quote and newline.
std::string PromEscape(absl::string_view value);

}  // namespace gpuha::common
