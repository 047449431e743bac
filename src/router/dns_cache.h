// DnsCache: upstream addresses given by name (HOST:PORT with a DNS name, as
// a Kubernetes Service or a pod's headless name), resolved off the event
// loops and re-resolved every `refresh` (Envoy's strict DNS refresh rate;
// getaddrinfo gives no TTL). A name that does not resolve is logged when it
// stops resolving, and its upstream answers 502 upstream_unresolved.
//
//   DnsCache dns(std::chrono::seconds(30));
//   dns.Start();                          // the refresh thread
//   dns.Track(table->upstreams());        // a control thread: resolves new names now
//   std::optional<tcp::endpoint> ep = dns.Find("triton-0.triton:8000");  // any thread
//   if (dns.generation() != seen) ...     // an answer changed: look again
//
// IP hosts are not tracked (they need no resolving). Thread-safety: all
// methods lock; Track and the refresh thread block on getaddrinfo, never a
// loop.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace gpuha::router {

class DnsCache {
 public:
  using Endpoint = boost::asio::ip::tcp::endpoint;
  // Resolves "HOST:PORT" (blocking); nullopt with *error set when it does
  // not. Tests give a fake: a real lookup of an unknown name asks the
  // network's DNS server.
  using ResolveFn = std::function<std::optional<Endpoint>(const std::string&, std::string*)>;
  // getaddrinfo; the first answer, preferring IPv4.
  static std::optional<Endpoint> SystemResolve(const std::string& address, std::string* error);

  explicit DnsCache(common::Duration refresh, ResolveFn resolve = SystemResolve)
      : refresh_(refresh), resolve_(std::move(resolve)) {}
  ~DnsCache() { Stop(); }
  DnsCache(const DnsCache&) = delete;
  DnsCache& operator=(const DnsCache&) = delete;

  void Start();
  void Stop();
  // Resolves the names among `addresses` not yet tracked, now, and keeps
  // every one of them for refresh.
  void Track(const std::vector<std::string>& addresses);
  // The last answer for a tracked name; nullopt when it did not resolve or
  // is not tracked.
  std::optional<Endpoint> Find(const std::string& address) const;
  // Bumped whenever an answer changes (resolved, moved, or lost).
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }
  size_t tracked() const;

  // HOST of "HOST:PORT" is an IP literal (no DNS needed).
  static bool IsIpAddress(const std::string& address);

 private:
  void Store(const std::string& address, std::optional<Endpoint> ep, const std::string& error);
  void RefreshLoop();

  const common::Duration refresh_;
  const ResolveFn resolve_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                                   // guarded by mu_
  std::map<std::string, std::optional<Endpoint>> answers_;  // guarded by mu_
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
};

}  // namespace gpuha::router
