// Renders a Plan as an operator-facing text report, a Markdown document for a
// design review, or the JSON contract that tests and other tools read.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/string_view.h"
#include "plan/planner.h"

namespace gpuha::plan {

// `source` names the input (a path, or "<interactive>") in the report header.
std::string RenderText(const Plan& plan, absl::string_view source);
std::string RenderMarkdown(const Plan& plan, absl::string_view source);
// Keys: path, outcome, summary, design, capacity, facilities, warnings, matrix,
// defaults_applied. Watts, VA and BTU/h are rounded to 0.1.
nlohmann::json RenderJson(const Plan& plan);

}  // namespace gpuha::plan
