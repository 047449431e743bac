// StandbyServer: a standby controller's faces while it campaigns on etcd:
// the read API from the state it last read from etcd, writes redirected to
// the leader (307 with the leader's address), /healthz 503 naming the
// leader, and /metrics with only gpuha_controller_leader 0 and
// gpuha_controller_store_up. On listen.grpc it serves the route watch from
// the same state (the leader's routes under the leader's epoch and version,
// marked as a standby's) and refuses agents (UNAVAILABLE, naming the leader)
// so they go on to it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/http_server.h"
#include "controller/controller.h"
#include "controller/grpc_serving.h"
#include "gpuha/v1/agent.grpc.pb.h"

namespace gpuha::controller {

class StandbyServer {
 public:
  explicit StandbyServer(const ControllerConfig& config);
  ~StandbyServer();
  [[nodiscard]] absl::Status Start();  // binds listen.http and listen.grpc
  void Stop();
  uint16_t http_port() const { return http_ ? http_->port() : 0; }
  int grpc_port() const { return grpc_port_; }
  // What to serve: `state` loaded with Controller::LoadAsStandby (null: none
  // read), the leader's address ("" while none leads), and why the store
  // could not be read ("" when it could).
  void Set(std::shared_ptr<Controller> state, std::string leader, std::string error);
  common::HttpResponse HandleHttp(const common::HttpRequest& r);

 private:
  class StandbyRoutes;
  class RefuseAgents;
  const ControllerConfig& config_;
  std::unique_ptr<common::HttpServer> http_;
  std::unique_ptr<StandbyRoutes> route_source_;
  std::unique_ptr<grpc::Service> routes_;
  std::unique_ptr<RefuseAgents> agents_;
  std::unique_ptr<grpc::Server> grpc_;
  int grpc_port_ = 0;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::shared_ptr<Controller> state_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpuha::controller
