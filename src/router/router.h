// Router: `gpuha router`, the data plane. An HTTP/1.1 reverse proxy with one
// event loop per thread (SO_REUSEPORT, nothing shared on the request path but
// atomics), keep-alive pools per upstream and loop, streamed bodies, and
// real-time failover: a request whose primary refuses, resets or hangs before
// the response starts is re-sent to the stream's standby at once.
//
//   Router router(config);
//   RETURN_IF_ERROR(router.Start());   // binds; routes from config or controller
//   router.SetRoutes(RouteTable::FromSnapshot(snapshot));
//   ...
//   router.Stop();
//
// See src/router/README.md for the request path.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "router/dns_cache.h"
#include "router/route_table.h"
#include "router/router_config.h"

namespace gpuha::router {

class Router {
 public:
  // `clock` drives the policy (ejection, stickiness, retry budget); the
  // event loops' own timers stay on the steady clock.
  // `resolve`: how upstream names are looked up (tests give a fake).
  explicit Router(RouterConfig config, common::Clock* clock = common::RealClock::Get(),
                  DnsCache::ResolveFn resolve = DnsCache::SystemResolve);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  [[nodiscard]] absl::Status Start();
  // Stops at once: whatever is in flight is cut. Drain first.
  void Stop();
  // A graceful stop's first half, as Envoy's listener drain: readiness
  // fails (/healthz 503), the listeners close (a router started beside this
  // one, or the address's next holder, takes new connections), each
  // HTTP/1.1 answer from now on carries Connection: close, HTTP/2 clients
  // get GOAWAY in two steps, and what is in flight finishes. Returns once
  // no client connection is left, or nothing has been in flight for a
  // second (idle kept-alive connections are then closed), or `timeout`
  // passed (HTTP/2 streams still open then end with GOAWAY, which gRPC
  // clients see as UNAVAILABLE). Logs what drained and what was cut.
  void Drain(std::chrono::milliseconds timeout);
  // Ready to take traffic: it holds routes it can serve (static ones, or a
  // snapshot from the controller) and is not draining. Why not, if not.
  bool Ready(std::string* why = nullptr) const;
  // A router started at the same handoff_socket took this one's listeners:
  // this one should drain and stop (router/handoff.h).
  bool HandedOff() const;

  uint16_t port() const;
  uint16_t admin_port() const;

  // Publishes a new route version; requests already running keep theirs.
  // A table older than the one held (a lower epoch, or the same epoch and a
  // lower version) is refused with FailedPrecondition: a delayed snapshot
  // from a deposed controller never rolls the routes back.
  [[nodiscard]] absl::Status SetRoutes(std::shared_ptr<const RouteTable> table);
  std::shared_ptr<const RouteTable> routes() const;
  // SIGHUP: new TLS certificate and key, tenants and (without a controller)
  // static routes. Open connections keep going; listen address and threads
  // need a restart.
  [[nodiscard]] absl::Status Reload(const RouterConfig& config);
  // Nodes that refused or reset connections since the last call: hints for
  // the controller.
  std::vector<std::string> TakeSuspects();
  std::string MetricsText() const;
  // The traffic so far, for the controller's dashboard (sent with route acks).
  v1::RouterStats TrafficStats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuha::router
