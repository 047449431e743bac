// `gpuha load`: open- or closed-loop load through the router, every answer checked.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "load/load.h"

namespace gpuha::cli {

class LoadCommand {
 public:
  explicit LoadCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  load::LoadOptions o_;
  std::string target_ = "127.0.0.1:8080";
  double seconds_ = 10;
  double timeout_s_ = 30;
  std::string json_path_;
  std::string protocol_ = "http";
  bool quiet_ = false;
  bool no_resend_ = false;
};

}  // namespace gpuha::cli
