#include "router/tenants.h"

#include <algorithm>
#include <atomic>

#include "common/net_util.h"

namespace gpuha::router {

RateLimiter::RateLimiter(double rate, double burst) {
  interval_ns_ = std::max<int64_t>(1, static_cast<int64_t>(1e9 / rate));
  tolerance_ns_ = static_cast<int64_t>((std::max(1.0, burst) - 1.0) * 1e9 / rate);
}

bool RateLimiter::Allow(int64_t now_ns, int64_t* retry_after_ns) {
  int64_t tat = tat_.load(std::memory_order_relaxed);
  for (;;) {
    int64_t start = std::max(tat, now_ns);
    if (start - now_ns > tolerance_ns_) {
      *retry_after_ns = start - now_ns - tolerance_ns_;
      return false;
    }
    if (tat_.compare_exchange_weak(tat, start + interval_ns_, std::memory_order_relaxed)) {
      return true;
    }
  }
}

std::shared_ptr<TenantSet> TenantSet::Build(const std::vector<TenantConfig>& tenants,
                                            const TenantSet* previous) {
  static std::atomic<uint64_t> builds{0};
  auto set = std::make_shared<TenantSet>();
  set->generation_ = ++builds;
  for (const TenantConfig& tc : tenants) {
    auto t = std::make_shared<Tenant>();
    t->name = tc.name;
    if (previous != nullptr) {
      auto it = previous->by_name_.find(tc.name);
      if (it != previous->by_name_.end()) t->in_flight = it->second->in_flight;
    }
    t->limiter = tc.requests_per_second > 0
                     ? std::make_unique<RateLimiter>(
                           tc.requests_per_second,
                           tc.burst > 0 ? tc.burst : std::max(1.0, tc.requests_per_second))
                     : nullptr;
    t->max_concurrent = tc.max_concurrent;
    t->default_stream = tc.default_stream;
    set->by_name_[tc.name] = t;
    for (const std::string& h : tc.key_hashes) set->by_hash_[h] = t;
  }
  set->open_ = std::make_shared<Tenant>();
  return set;
}

std::shared_ptr<Tenant> TenantSet::Lookup(std::string_view api_key) const {
  if (api_key.empty()) return nullptr;
  auto it = by_hash_.find(common::Sha256Hex(absl::string_view(api_key.data(), api_key.size())));
  return it == by_hash_.end() ? nullptr : it->second;
}

}  // namespace gpuha::router
