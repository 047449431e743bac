// `gpuha controller`: the controller daemon (its operator CLI, `gpuha ctl`,
// is ctl_command.h).
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "cli/signals.h"
#include "controller/controller_config.h"
#include "controller/etcd_leader.h"
#include "controller/store.h"
#include "etcd/client.h"

namespace gpuha::controller {
class Controller;
}  // namespace gpuha::controller

namespace gpuha::cli {

class ControllerCommand {
 public:
  explicit ControllerCommand(CLI::App& app);
  int Run();
  CLI::App* app() const { return app_; }

 private:
  // On an etcd store: stands by and campaigns, leads, and after a lost
  // leadership stands by again, until a stop signal.
  int RunOnEtcd(const controller::ControllerConfig& config, StopSignals& stop_signals);
  // Campaigns (standing by, serving the read API, while another leads) and,
  // once leading, returns the store fenced by this leadership. Cancelled
  // when a stop signal came first.
  absl::StatusOr<std::unique_ptr<controller::Store>> LeadOnEtcd(
      const controller::ControllerConfig& config, std::shared_ptr<etcd::EtcdClient> client,
      StopSignals& stop_signals, std::unique_ptr<controller::EtcdLeader>* leader);
  // Runs the controller on `store` until a stop signal (`*signalled`) or,
  // with a `leader`, until the leadership is lost; the exit code.
  int Serve(const controller::ControllerConfig& config, std::unique_ptr<controller::Store> store,
            controller::EtcdLeader* leader, StopSignals& stop_signals, bool* signalled);
  // Leadership is gone (the lease, or a write found the fence moved): the
  // controller stops acting at once, and Serve returns, so that only the
  // leader acts.
  void LoseLeadership(const std::string& why);
  // The controller LoseLeadership stops (nullptr outside its lifetime).
  void SetActing(controller::Controller* c);

  std::atomic<bool> leadership_lost_{false};
  std::mutex lost_mu_;
  controller::Controller* acting_ = nullptr;  // guarded by lost_mu_
  std::string lost_why_;                      // guarded by lost_mu_

  CLI::App* app_;
  std::string config_path_;
  std::string grpc_listen_;
  std::string http_listen_;
  std::string store_path_;
  bool init_ = false;
  bool check_ = false;
};

}  // namespace gpuha::cli
