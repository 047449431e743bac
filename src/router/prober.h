// Prober: the router's own health check of every upstream in the routes
// (Envoy's active health checker). A GET of probe_path every probe_interval
// on one kept-alive connection per upstream: no answer within hang_after
// makes the upstream hung, a refused connection makes it down, any answer
// makes it up. Each change of verdict is handed to `on_verdict` (the router
// posts it to every loop), and an upstream that leaves the routes takes its
// verdict with it.
//
//   Prober prober(config, [&](const std::string& addr, Health h) { ... });
//   prober.SetRoutes(table);
//   prober.Start();                 // its own thread and io_context
//
// Thread-safety: SetRoutes, SetTls and the counters may be called from any
// thread; on_verdict runs on the prober's thread.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "router/dns_cache.h"
#include "router/loop.h"
#include "router/route_table.h"
#include "router/router_config.h"
#include "router/upstream_health.h"

namespace gpuha::router {

class Prober {
 public:
  using OnVerdict = std::function<void(const std::string& address, Health h)>;
  // `dns` resolves upstreams given by name (null: IP addresses only).
  Prober(const RouterConfig& config, const DnsCache* dns, OnVerdict on_verdict);
  ~Prober();
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // Starts probing on its own thread; nothing when probe_interval is 0.
  void Start();
  void Stop();
  // The upstreams to probe: every address in `routes`.
  void SetRoutes(std::shared_ptr<const RouteTable> routes);
  // upstream_tls's context for the probes' connections (null: plain).
  void SetTls(std::shared_ptr<ssl::context> tls);

  uint64_t probes() const { return probes_.load(); }
  uint64_t hangs() const { return hangs_.load(); }
  uint64_t downs() const { return downs_.load(); }
  // Upstreams with a running probe (each leaves once out of the routes).
  uint64_t probed() const { return probed_.load(); }

 private:
  awaitable<void> ProbeLoop();
  awaitable<void> Probe(std::string address);

  const RouterConfig& config_;
  const DnsCache* dns_;
  OnVerdict on_verdict_;
  net::io_context ioc_{1};
  std::thread thread_;
  std::mutex mu_;
  std::shared_ptr<const RouteTable> routes_;       // guarded by mu_
  std::shared_ptr<ssl::context> tls_;              // guarded by mu_
  std::unordered_map<std::string, Health> state_;  // prober thread only
  std::unordered_set<std::string> wanted_;         // prober thread only
  std::atomic<uint64_t> probes_{0}, hangs_{0}, downs_{0}, probed_{0};
};

}  // namespace gpuha::router
