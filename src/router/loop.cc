#include "router/loop.h"

#include "common/log.h"
#include "common/net_util.h"

namespace gpuha::router {

awaitable<void> Sweep(Loop& L) {
  Timer t(L.ioc);
  for (;;) {
    t.expires_after(kSweep);
    error_code ec;
    co_await t.async_wait(Redirect(ec));
    if (ec) co_return;
    L.now = L.clock.Now();
    L.io_now = Clock::now();
    // Check() may not erase; copying keeps the walk safe and is cheap next
    // to the sweep interval.
    std::vector<Deadline*> all(L.deadlines.begin(), L.deadlines.end());
    for (Deadline* d : all) d->Check(L.io_now);
  }
}

void RefreshRoutes(Loop& L) {
  uint64_t gen = L.shared.routes_gen.load(std::memory_order_acquire);
  if (gen == L.routes_gen) return;
  std::lock_guard<std::mutex> lock(L.shared.mu);
  L.routes = L.shared.routes;
  L.routes_gen = gen;
}

UpstreamState& FindUpstream(Loop& L, const Upstream& u) {
  auto it = L.upstreams.find(u.address);
  if (it != L.upstreams.end()) return *it->second;
  auto up = std::make_unique<UpstreamState>(L.ejection);
  up->address = u.address;
  up->node = u.node;
  auto hp = common::ParseHostPort(u.address, "upstream");
  error_code ec;
  if (hp.ok()) {
    auto a = net::ip::make_address(hp->host, ec);
    if (!ec) up->endpoint = tcp::endpoint(a, hp->port);
  }
  up->resolvable = hp.ok() && !ec;
  if (!up->resolvable) spdlog::warn("router: upstream '{}' is not IP:PORT; skipped", u.address);
  return *L.upstreams.emplace(u.address, std::move(up)).first->second;
}

void ConnectionFailed(Loop& L, UpstreamState& up) {
  up.UpstreamHealth::ConnectionFailed(L.clock.Now());
  up.idle.clear();
  Inc(L.stats.ejections);
  std::lock_guard<std::mutex> lock(L.shared.suspects_mu);
  if (L.shared.suspects.size() < 1024) L.shared.suspects.push_back(up.node);
}

void SetHealth(Loop& L, const std::string& address, Health h) {
  auto it = L.upstreams.find(address);
  if (it == L.upstreams.end()) return;
  UpstreamState& up = *it->second;
  up.SetHealth(h);
  if (h == Health::kUp) return;
  for (UpConn& c : up.waiting) {
    c.hung_cancel = true;
    error_code ec;
    c.s.cancel(ec);
  }
  up.idle.clear();
}

}  // namespace gpuha::router
