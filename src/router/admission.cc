#include "router/admission.h"

#include <algorithm>

namespace gpuha::router {

Identity Identify(const TenantSet& tenants, std::string_view api_key, KeyCache* cache) {
  if (!tenants.auth_required()) return {tenants.open_tenant(), std::nullopt};
  if (api_key.empty()) {
    return {nullptr,
            Refusal{Reason::kUnauthorized, "no API key (Authorization: Bearer KEY or X-Api-Key)"}};
  }
  if (cache->tenant && cache->generation == tenants.generation() && api_key == cache->key) {
    return {cache->tenant, std::nullopt};
  }
  std::shared_ptr<Tenant> t = tenants.Lookup(api_key);
  if (!t) {
    cache->tenant.reset();
    return {nullptr, Refusal{Reason::kUnauthorized, "unknown API key"}};
  }
  cache->tenant = t;
  cache->key.assign(api_key);
  cache->generation = tenants.generation();
  return {std::move(t), std::nullopt};
}

std::optional<Refusal> CheckRate(Tenant& tenant, common::TimePoint now) {
  if (!tenant.limiter) return std::nullopt;
  int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  int64_t wait_ns = 0;
  if (tenant.limiter->Allow(now_ns, &wait_ns)) return std::nullopt;
  int secs = static_cast<int>(std::max<int64_t>(1, (wait_ns + 999'999'999) / 1'000'000'000));
  return Refusal{Reason::kRateLimited, "tenant request rate limit", secs};
}

}  // namespace gpuha::router
