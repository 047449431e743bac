// Tenants: API keys (stored as SHA-256) map a request to a tenant; each
// tenant has a request-rate limit and a quota of requests in flight. Both are
// lock-free (one CAS or one atomic add) and shared by every event loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "router/route_table.h"
#include "router/router_config.h"

namespace gpuha::router {

// GCRA (the token bucket as one timestamp): `rate` per second, bursts of
// `burst`. Lock-free.
class RateLimiter {
 public:
  RateLimiter(double rate, double burst);
  // True if a request may pass at `now_ns`; otherwise *retry_after_ns says
  // when one will.
  bool Allow(int64_t now_ns, int64_t* retry_after_ns);

 private:
  int64_t interval_ns_;          // 1 / rate
  int64_t tolerance_ns_;         // (burst - 1) / rate
  std::atomic<int64_t> tat_{0};  // theoretical arrival time
};

struct Tenant {
  std::string name;
  std::unique_ptr<RateLimiter> limiter;  // null: unlimited
  int64_t max_concurrent = 0;            // 0: unlimited
  std::string default_stream;            // empty: a request must name its stream
  // Shared with the same tenant in a reloaded set, so requests in flight
  // across a reload are counted once.
  std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
};

class TenantSet {
 public:
  // A tenant kept across a reload (same name in `previous`) keeps its
  // in-flight count; its limits and rate limiter are new. Tenants are
  // immutable once built, so loops may hold either set.
  static std::shared_ptr<TenantSet> Build(const std::vector<TenantConfig>& tenants,
                                          const TenantSet* previous);
  bool auth_required() const { return !by_hash_.empty(); }
  // The tenant owning `api_key`, or null.
  std::shared_ptr<Tenant> Lookup(std::string_view api_key) const;
  // The implicit tenant when no tenants are configured.
  const std::shared_ptr<Tenant>& open_tenant() const { return open_; }
  // Which build this is: each Build() gives a new one, never reused (an
  // address could be: a set freed and the next built in its place).
  uint64_t generation() const { return generation_; }

 private:
  uint64_t generation_ = 0;
  std::unordered_map<std::string, std::shared_ptr<Tenant>, StringHash, std::equal_to<>> by_hash_;
  std::unordered_map<std::string, std::shared_ptr<Tenant>> by_name_;
  std::shared_ptr<Tenant> open_;
};

}  // namespace gpuha::router
