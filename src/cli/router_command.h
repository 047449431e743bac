// `gpuha router`: the data plane daemon.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace gpuha::cli {

class RouterCommand {
 public:
  explicit RouterCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string config_path_;
  std::string listen_;
  std::string admin_;
  std::string controllers_;
  int threads_ = -1;
  std::string handoff_socket_;
  bool check_ = false;
  bool background_ = false;
};

}  // namespace gpuha::cli
