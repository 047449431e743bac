// `gpuha controller`: the controller daemon (its operator CLI, `gpuha ctl`,
// is ctl_command.h).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace gpuha::cli {

class ControllerCommand {
 public:
  explicit ControllerCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string config_path_;
  std::string grpc_listen_;
  std::string http_listen_;
  std::string store_path_;
  bool init_ = false;
  bool check_ = false;
};

}  // namespace gpuha::cli
