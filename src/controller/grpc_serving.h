// What the leader's gRPC server (service.h) and a standby's
// (standby_server.h) share: the route watch over a source of routes, and the
// server on listen.grpc with its TLS and keepalive settings.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/controller_config.h"
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

// RouteService.Watch over a RouteSource: one thread per router, which sends
// each new snapshot; a second one reads the router's acks. Ends when
// `*stopping` turns true.
std::unique_ptr<grpc::Service> RouteWatchService(RouteSource* source, std::atomic<bool>* stopping);

// The controller's gRPC server on listen.grpc, with its TLS, serving
// `services`; sets `*port`. Waits up to 2 s for the address to be free (a
// controller that starts or stops leading hands it from one server to the
// other).
[[nodiscard]] absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(
    const ControllerConfig& config, const std::vector<grpc::Service*>& services, int* port);

}  // namespace gpuha::controller
