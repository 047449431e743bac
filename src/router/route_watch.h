// RouteWatch: keeps the router's routes in step with the controller over the
// RouteService.Watch stream (versioned snapshots, acknowledged one by one, in
// the manner of Envoy's xDS). Reconnects with jittered backoff across the
// listed controllers; while none answers the router keeps its last routes.
// Acks carry the router's suspect nodes (connection failures it saw).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "router/router.h"

namespace grpc {
class ClientContext;
}

namespace gpuha::router {

class RouteWatch {
 public:
  RouteWatch(Router* router, const RouterConfig& config,
             common::Clock* clock = common::RealClock::Get());
  ~RouteWatch();
  void Start();
  void Stop();
  bool connected() const { return connected_.load(); }
  // Watches that ended and were retried (the next controller in turn).
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  void Run();
  absl::Status WatchOnce(const common::HostPort& controller, common::Duration connect_timeout);

  Router* const router_;
  const RouterConfig config_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::atomic<uint64_t> reconnects_{0};
  common::Clock* const clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
};

}  // namespace gpuha::router
