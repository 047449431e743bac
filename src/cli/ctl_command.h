// `gpuha ctl`: the operator's client of the controller API, one CLI11
// subcommand per verb so each has its own --help with examples.
//
//   gpuha ctl status                      # the cluster at a glance, like `pcs status`
//   gpuha ctl nodes -o wide               # -o table|wide|json|yaml (--json = -o json)
//   gpuha ctl events --since 10m --watch
//   gpuha ctl describe node gpu-3
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace gpuha::cli {

class CtlCommand {
 public:
  explicit CtlCommand(CLI::App& parent);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  struct Answer {
    int rc = 0;  // an exit code; 0 when `body` holds the API's JSON
    nlohmann::json body;
  };
  // One API call; prints the error and sets rc when it fails.
  Answer Call(const std::string& method, const std::string& path,
              const std::string& body = "") const;
  // Prints `j` as -o asks, with `table` for the table and wide forms.
  int Print(const nlohmann::json& j, const std::function<void(const nlohmann::json&)>& table) const;
  int RunVerb();
  int Status();
  int Events();
  int DescribeNode();
  int DescribeStream();
  int Mutate();
  bool wide() const { return output_ == "wide"; }
  bool machine() const { return output_ == "json" || output_ == "yaml"; }

  CLI::App* app_;
  CLI::App* describe_ = nullptr;
  std::string controller_ = "http://127.0.0.1:7401";
  std::string token_;
  std::string output_ = "table";
  bool json_ = false;
  // Per verb.
  bool force_ = false;
  bool watch_ = false;
  std::string since_;
  std::string tenant_;
  int64_t weight_ = 1;
  std::string name_;  // the node, stream or token a verb names
  std::string role_;
  // add-job.
  std::vector<std::string> job_command_;
  int64_t gpus_ = 1;
  std::string checkpoint_dir_;
  int64_t checkpoint_every_ = 50;
  double interval_s_ = 1;
};

}  // namespace gpuha::cli
