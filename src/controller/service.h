// The leading controller's network faces: the gRPC AgentService and
// RouteService (proto/gpuha/v1), heartbeat datagrams on UDP, and over HTTP
// the operator API (operator_api.h), /metrics, /healthz (200 while it leads
// and acts) and /livez (200 while the process answers). A standby's are
// standby_server.h.
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
#include "controller/grpc_serving.h"
#include "gpuha/v1/agent.grpc.pb.h"
#include "gpuha/v1/routes.grpc.pb.h"

namespace gpuha::controller {

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

}  // namespace gpuha::controller
