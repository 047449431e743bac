#include "common/prometheus.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpuha::common {

std::string PromEscape(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void PromText::Family(absl::string_view name, absl::string_view type, absl::string_view help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void PromText::Sample(absl::string_view name, const PromLabels& labels, double value) {
  absl::StrAppend(&out_, name);
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&out_, i ? "," : "", labels[i].first, "=\"", PromEscape(labels[i].second),
                      "\"");
    }
    out_ += '}';
  }
  if (std::isnan(value)) {
    out_ += " NaN\n";
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    absl::StrAppend(&out_, " ", static_cast<int64_t>(value), "\n");
  } else {
    absl::StrAppend(&out_, " ", absl::StrFormat("%.6g", value), "\n");
  }
}

}  // namespace gpuha::common
