// Admission: whether one request may go upstream for its tenant. Three
// checks, in order: who the tenant is (its API key), the tenant's request
// rate (GCRA, 429 with Retry-After), and its quota of requests in flight
// (429). Pure policy: the key is already parsed, time is an argument.
//
//   KeyCache cache;                                  // per client connection
//   auto who = Identify(tenants, ApiKey(req), &cache);
//   if (!who.tenant) answer(who.refusal);
//   std::optional<Refusal> r = CheckRate(*who.tenant, now);
//   QuotaSlot slot(*who.tenant);                     // held until the answer
//   if (slot.over()) answer(QuotaRefusal());
//
// Thread-safety: tenants are shared by every loop; their limiter and
// in-flight counter are atomics. KeyCache belongs to one connection.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "router/request.h"
#include "router/tenants.h"

namespace gpuha::router {

// A request turned away: the reason, what the client is told, and when to
// come back (seconds; 0: no Retry-After).
struct Refusal {
  Reason reason;
  std::string detail;
  int retry_after_s = 0;
};

// The last API key a connection presented and its tenant: keep-alive
// requests skip the hash. Good only for the tenant set it was read from: a
// reload that revokes the key, or moves it to another tenant, holds for a
// connection opened before it too (a revoked key once went on working on
// a kept-alive connection, an HTTP/2 one or a gRPC channel for hours).
struct KeyCache {
  std::shared_ptr<Tenant> tenant;
  std::string key;
  uint64_t generation = 0;  // TenantSet::generation() of the set it came from
};

struct Identity {
  std::shared_ptr<Tenant> tenant;  // null: refused
  std::optional<Refusal> refusal;
};

// The tenant `api_key` belongs to; the open tenant when no tenants are
// configured; 401 when the key is missing or unknown.
Identity Identify(const TenantSet& tenants, std::string_view api_key, KeyCache* cache);

// The tenant's request rate at `now`: nullopt when the request may pass.
std::optional<Refusal> CheckRate(Tenant& tenant, common::TimePoint now);

// One request counted against its tenant's quota of requests in flight, for
// as long as the slot lives.
class QuotaSlot {
 public:
  explicit QuotaSlot(Tenant& t) : in_flight_(t.in_flight.get()) {
    int64_t mine = in_flight_->fetch_add(1, std::memory_order_relaxed) + 1;
    over_ = t.max_concurrent > 0 && mine > t.max_concurrent;
  }
  ~QuotaSlot() { in_flight_->fetch_sub(1, std::memory_order_relaxed); }
  QuotaSlot(const QuotaSlot&) = delete;
  QuotaSlot& operator=(const QuotaSlot&) = delete;
  // Past the quota: the request is refused (the slot still counts until it
  // goes, as the request is still being answered).
  bool over() const { return over_; }
  static Refusal Refused() { return {Reason::kOverQuota, "tenant concurrent request quota", 1}; }

 private:
  std::atomic<int64_t>* in_flight_;
  bool over_ = false;
};

}  // namespace gpuha::router
