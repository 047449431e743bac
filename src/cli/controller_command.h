// `gpuha controller` and `gpuha ctl`: the controller daemon and its operator CLI.
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

class CtlCommand {
 public:
  explicit CtlCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string controller_ = "http://127.0.0.1:7401";
  std::string token_;
  bool json_ = false;
  bool force_ = false;
  std::string command_;
  std::vector<std::string> args_;
  std::string tenant_;
  int64_t weight_ = 1;
  // Prints the API's answer as a table; throws nlohmann::json::exception on
  // a shape it does not know.
  void Print(const nlohmann::json& j) const;
};

}  // namespace gpuha::cli
