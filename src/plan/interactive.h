// Asks the planner's questions in a terminal, one at a time, and builds the
// same PlanInput a YAML file would give. A bad answer is explained and asked
// again; an empty answer takes the default shown in brackets.
//
//   absl::StatusOr<PlanInput> in = AskPlanInput(std::cin, std::cout);
#pragma once

#include <istream>
#include <ostream>

#include "absl/status/statusor.h"
#include "plan/plan_input.h"

namespace gpuha::plan {

// Fails when the input ends before every question is answered, or when the
// answers together are impossible (nodes not above redundancy).
[[nodiscard]] absl::StatusOr<PlanInput> AskPlanInput(std::istream& in, std::ostream& out);

}  // namespace gpuha::plan
