// Standby: a controller's face while it campaigns to lead on etcd. It
// serves StandbyServer (the read API, the route watch, agents sent on) from
// the state in etcd: it reads every table at one revision
// (Controller::LoadAsStandby on an EtcdStore pinned with ReadAt) and reads
// them again after each change under the prefix that etcd's watch reports;
// a burst of writes (one failover) is one reload.
//
//   Standby standby(config, client, &no_fences);
//   RETURN_IF_ERROR(standby.Start());   // binds listen.http and listen.grpc
//   ... campaign ...
//   standby.Stop();                      // frees both for the leader
#pragma once

#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "controller/controller_config.h"
#include "controller/etcd_store.h"
#include "controller/fence_runner.h"
#include "controller/service.h"
#include "controller/standby_server.h"

namespace gpuha::controller {

class Standby {
 public:
  Standby(const ControllerConfig& config, std::shared_ptr<etcd::EtcdClient> client,
          FenceRunner* fencer);
  ~Standby();
  [[nodiscard]] absl::Status Start();
  // Frees listen.http and listen.grpc at once, for the controller that leads now.
  void Stop();

 private:
  bool Pause(common::Duration d);  // false once stopping
  void Loop();

  const ControllerConfig& config_;
  std::shared_ptr<etcd::EtcdClient> client_;
  FenceRunner* fencer_;
  StandbyServer server_;
  etcd::WatchCancel cancel_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpuha::controller
