// `gpuha agent`: wires flags and config to the agent library and runs it
// until SIGINT or SIGTERM.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace gpuha::cli {

class AgentCommand {
 public:
  explicit AgentCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string config_path_;
  std::string node_;
  std::string controllers_;
  std::string gpu_;
  std::string nvml_lib_;
  std::string sim_model_;
  int sim_gpus_ = 0;
  int sim_mig_ = -1;  // -1: the config's
  double sim_load_ = -1;
  std::vector<std::string> faults_;
  std::string fault_script_;
  std::string listen_;
  int heartbeat_ms_ = 0;
  int sample_ms_ = 0;
  std::vector<std::string> nics_;
  std::string server_cmd_;
  std::string ready_url_;
  std::string fence_mode_;
  std::string address_;
  int64_t capacity_ = 0;
  int gpu_port_base_ = 0;
  std::vector<std::string> labels_;
  std::string join_token_file_;
  bool check_ = false;
};

}  // namespace gpuha::cli
