// The controller's network faces: the gRPC AgentService and RouteService
// (proto/gpuha/v1) and the HTTP operator API, /metrics and /healthz.
//
//   ControllerServer server(&controller, config);
//   RETURN_IF_ERROR(server.Start());   // binds, starts the tick thread
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

#include "common/http_server.h"
#include "controller/controller.h"
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

 private:
  class AgentServiceImpl;
  class RouteServiceImpl;
  Controller* const controller_;
  const ControllerConfig& config_;
  std::unique_ptr<AgentServiceImpl> agents_;
  std::unique_ptr<RouteServiceImpl> routes_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<common::HttpServer> http_;
  int grpc_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
};

}  // namespace gpuha::controller
