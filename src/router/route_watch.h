// RouteWatch: keeps the router's routes in step with the controller over the
// RouteService.Watch stream (versioned snapshots, acknowledged one by one, in
// the manner of Envoy's xDS). Reconnects with jittered backoff across the
// listed controllers; while none answers the router keeps its last routes.
// Acks carry the router's suspect nodes (connection failures it saw).
//
// A standby controller (controllers on etcd) serves the leader's routes too,
// marked as a standby's: the router takes them, and after kStandbyDwell, or
// at once when it has a suspect node to report, goes on to the next
// controller to find the leader, where its acks and hints are acted on. So a
// router that cannot reach the leader, or watches while none leads, still
// gets current routes. Suspects seen on a standby go to the leader.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/router.h"

namespace grpc {
class ClientContext;
}

namespace gpuha::router {

class RouteWatch {
 public:
  // How long the router stays on a standby before it looks for the leader.
  static constexpr common::Duration kStandbyDwell = std::chrono::milliseconds(2000);
  // Suspects kept for the leader at most (the router's own list stops at 1024).
  static constexpr size_t kMaxHeldSuspects = 1024;

  RouteWatch(Router* router, const RouterConfig& config,
             common::Clock* clock = common::RealClock::Get(),
             common::Duration standby_dwell = kStandbyDwell);
  ~RouteWatch();
  void Start();
  void Stop();
  bool connected() const { return connected_.load(); }
  // The stream's controller stands by (its last snapshot said so).
  bool on_standby() const { return on_standby_.load(); }
  // Watches that ended and were retried (the next controller in turn).
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  void Run();
  // Adds to held_suspects_, each node once, up to kMaxHeldSuspects.
  void HoldSuspectsLocked(const std::vector<std::string>& nodes);
  absl::Status WatchOnce(const common::HostPort& controller, common::Duration connect_timeout);

  Router* const router_;
  const RouterConfig config_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::atomic<bool> on_standby_{false};
  std::atomic<uint64_t> reconnects_{0};
  common::Clock* const clock_;
  const common::Duration standby_dwell_;
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
  // Suspects taken and not yet sent to a leader.
  std::vector<std::string> held_suspects_;  // guarded by mu_
};

}  // namespace gpuha::router
