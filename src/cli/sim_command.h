// `gpuha sim`: wires the fleet simulator to the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>

#include "cli/exit_codes.h"

namespace gpuha::cli {

class SimCommand {
 public:
  explicit SimCommand(CLI::App& app);
  int Run(std::ostream& out, std::ostream& err);
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string input_path_;
  std::string format_ = "text";
  std::string svg_path_;
  int64_t seed_ = -1;
  int threads_ = 0;
  bool progress_ = false;
};

}  // namespace gpuha::cli
