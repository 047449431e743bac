// DnsCache: upstream addresses given by name (HOST:PORT with a DNS name, as
// a Kubernetes Service or a pod's headless name), resolved on the cache's
// own thread and re-resolved every `refresh` (Envoy's strict DNS refresh
// rate; getaddrinfo gives no TTL). A name that does not resolve is logged
// when it stops resolving, tried again every second, and its upstream
// answers 502 upstream_unresolved meanwhile.
//
//   DnsCache dns(std::chrono::seconds(30));
//   dns.Start();                          // the resolving thread
//   dns.Track(addresses);                 // the names now in the routes
//   std::optional<tcp::endpoint> ep = dns.Find("triton-0.triton:8000");  // any thread
//   if (dns.generation() != seen) ...     // an answer changed: look again
//
// IP hosts are not tracked (they need no resolving). Thread-safety: all
// methods lock; only the cache's thread calls getaddrinfo (a DNS outage
// delays no route snapshot by more than Track's short wait).
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
  // The names among `addresses` are the ones kept (others are dropped).
  // New ones are resolved at once on the cache's thread; Track waits up to
  // `wait` for their first answer, so that routes rarely go live unresolved.
  void Track(const std::vector<std::string>& addresses,
             common::Duration wait = std::chrono::milliseconds(200));
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
  struct Entry {
    bool tried = false;  // resolved at least once
    std::optional<Endpoint> ep;
    std::chrono::steady_clock::time_point next{};  // when to resolve it again
  };
  static constexpr common::Duration kRetry = std::chrono::seconds(1);
  // Records an answer (under mu_); logs a name that stops resolving once.
  void StoreLocked(const std::string& address, std::optional<Endpoint> ep,
                   const std::string& error);
  void Run();

  const common::Duration refresh_;
  const ResolveFn resolve_;
  mutable std::mutex mu_;
  std::condition_variable cv_;            // wakes the thread: new names, or stop
  std::condition_variable answered_;      // wakes Track: a first answer came
  bool stopping_ = false;                 // guarded by mu_
  std::map<std::string, Entry> answers_;  // guarded by mu_
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
};

}  // namespace gpuha::router
