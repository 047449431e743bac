// `gpuha demo`: the whole stack on loopback with faults and timelines (demo/demo.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "demo/demo.h"

namespace gpuha::cli {

class DemoCommand {
 public:
  explicit DemoCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  demo::DemoOptions o_;
  std::string faults_;
  std::string json_path_;
};

}  // namespace gpuha::cli
