// `gpuha plan`: wires the planner library to the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <istream>
#include <ostream>
#include <string>

#include "cli/exit_codes.h"

namespace gpuha::cli {

class PlanCommand {
 public:
  explicit PlanCommand(CLI::App& app);
  // Runs after parsing when the subcommand was chosen.
  int Run(std::istream& in, std::ostream& out, std::ostream& err);
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string input_path_;
  std::string format_ = "text";
  std::string output_path_;
  std::string write_path_;
  bool interactive_ = false;
  bool strict_ = false;
};

}  // namespace gpuha::cli
