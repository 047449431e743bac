#include "cli/plan_command.h"

#include "common/file_util.h"
#include "plan/interactive.h"
#include "plan/plan_input.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace gpuha::cli {

PlanCommand::PlanCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "plan",
      "Walk the HA decision flow of the GPU HA & Sharing Strategy guide, N+k capacity and "
      "power sizing for a cluster");
  app_->add_option("input", input_path_, "Planner input YAML (see examples/)");
  app_->add_option("-f,--format", format_, "Report format")
      ->check(CLI::IsMember({"text", "json", "markdown"}));
  app_->add_option("-o,--output", output_path_, "Write the report to this file instead of stdout");
  auto* interactive =
      app_->add_flag("-i,--interactive", interactive_, "Ask the questions in the terminal");
  app_->add_option("--write", write_path_, "With --interactive: save the answers as YAML here")
      ->needs(interactive);
  app_->add_flag("--strict", strict_, "Exit 3 when the plan has warnings (for CI pipelines)");
  interactive->excludes(app_->get_option("input"));
}

int PlanCommand::Run(std::istream& in, std::ostream& out, std::ostream& err) {
  absl::StatusOr<plan::PlanInput> input;
  std::string source = input_path_;
  if (interactive_) {
    source = write_path_.empty() ? "<interactive>" : write_path_;
    input = plan::AskPlanInput(in, err);
  } else if (input_path_.empty()) {
    err << "gpuha plan: give a planner input file (see examples/) or --interactive\n";
    return kExitBadInput;
  } else {
    input = plan::LoadPlanInputFile(input_path_);
  }
  if (!input.ok()) {
    err << "gpuha plan: " << input.status().message() << "\n";
    return input.status().code() == absl::StatusCode::kInvalidArgument ||
                   input.status().code() == absl::StatusCode::kNotFound
               ? kExitBadInput
               : kExitFailure;
  }
  if (!write_path_.empty()) {
    if (absl::Status s = common::WriteFileAtomic(write_path_, plan::PlanInputToYaml(*input));
        !s.ok()) {
      err << "gpuha plan: " << s.message() << "\n";
      return kExitFailure;
    }
    err << "gpuha plan: answers saved to " << write_path_ << "\n";
  }

  plan::Plan result = plan::MakePlan(*input);
  std::string report;
  if (format_ == "json") {
    report = plan::RenderJson(result).dump(2) + "\n";
  } else if (format_ == "markdown") {
    report = plan::RenderMarkdown(result, source);
  } else {
    report = plan::RenderText(result, source);
  }
  if (output_path_.empty()) {
    out << report << std::flush;
  } else if (absl::Status s = common::WriteFileAtomic(output_path_, report); !s.ok()) {
    err << "gpuha plan: " << s.message() << "\n";
    return kExitFailure;
  }
  return strict_ && !result.warnings.empty() ? kExitWarnings : kExitOk;
}

}  // namespace gpuha::cli
