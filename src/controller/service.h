// The controller's network faces: the gRPC AgentService and RouteService
// (proto/gpuha/v1) and the HTTP operator API, /metrics, /healthz (200 while
// it leads and acts) and /livez (200 while the process answers).
//
// StandbyServer is a standby's face while it campaigns on etcd: the read API
// from the state it last read from etcd, writes redirected to the leader (307
// with the leader's address), /healthz 503 naming the leader, and /metrics
// with only gpuha_controller_leader 0 and gpuha_controller_store_up. On
// listen.grpc it serves the route watch from the same state (the leader's
// routes under the leader's epoch and version, marked as a standby's) and
// refuses agents (UNAVAILABLE, naming the leader) so they go on to it.
//
//   ControllerServer server(&controller, config);
//   RETURN_IF_ERROR(server.Start());   // binds, starts the tick thread
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/http_server.h"
#include "common/udp.h"
#include "controller/controller.h"
#include "gpuha/v1/agent.grpc.pb.h"
#include "gpuha/v1/routes.grpc.pb.h"

namespace gpuha::controller {

// What a route watch streams: the leader's routes, or a standby's copy.
class RouteSource {
 public:
  virtual ~RouteSource() = default;
  // False once this source may serve no more (a deposed leader; a standby
  // that has not read the routes): the stream ends, and the router goes on
  // to the next controller.
  virtual bool Serving() const = 0;
  // The routes, once they differ from what the stream sent. `*sent` is the
  // source's mark of that (0: nothing yet), and moves with each snapshot
  // returned. Waits up to `timeout`; nullopt if nothing new came.
  virtual std::optional<v1::RouteSnapshot> Next(uint64_t* sent, common::Duration timeout) = 0;
  // What the router says: its first ack (a refusal ends the stream, and the
  // router goes on to the next controller), later acks, and its leaving.
  [[nodiscard]] virtual absl::Status Hello(const std::string& router,
                                           const v1::RouteAck& first) = 0;
  virtual void Ack(const std::string& router, const v1::RouteAck& ack) = 0;
  virtual void Gone(const std::string& router) = 0;
};

class ControllerServer {
 public:
  ControllerServer(Controller* controller, const ControllerConfig& config);
  ~ControllerServer();
  [[nodiscard]] absl::Status Start();
  void Stop();
  int grpc_port() const { return grpc_port_; }
  uint16_t http_port() const { return http_ ? http_->port() : 0; }

  // The HTTP API, public for tests that call it without sockets.
  common::HttpResponse HandleHttp(const common::HttpRequest& r);
  // The UDP port of heartbeat datagrams; 0: off.
  uint16_t datagram_port() const { return datagrams_ ? datagrams_->port() : 0; }

 private:
  class AgentServiceImpl;
  void OnDatagram(absl::string_view datagram);
  Controller* const controller_;
  const ControllerConfig& config_;
  std::unique_ptr<AgentServiceImpl> agents_;
  std::unique_ptr<RouteSource> route_source_;
  std::unique_ptr<grpc::Service> routes_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<common::HttpServer> http_;
  std::unique_ptr<common::UdpReceiver> datagrams_;  // heartbeats on UDP; null: off
  int grpc_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
  // Refused datagrams are logged at most every 10 s (receiver thread only).
  std::chrono::steady_clock::time_point refusal_logged_{};
  uint64_t refusals_unlogged_ = 0;
};

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
  std::mutex mu_;
  std::shared_ptr<Controller> state_;  // guarded by mu_
  std::string leader_, error_;         // guarded by mu_
};

}  // namespace gpuha::controller
