#include "router/loop.h"

#include "common/log.h"
#include "common/net_util.h"
#include "router/h2_upstream.h"

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
    if (L.config.stall_detection) JudgeProgress(L);
  }
}

namespace {

void CancelStreams(UpstreamState& up) {
  for (Waiting& c : up.streaming) c.Cancel();
}

// Waiting requests cancelled for their standbys; the upstream ejected (and
// named to the controller as a suspect).
// Token streams are cut too: their answers go on at the standby.
void Stall(Loop& L, UpstreamState& up) {
  for (Waiting& c : up.waiting) {
    Inc(L.stats.stall_resends);
    c.Cancel();
  }
  CancelStreams(up);
  ConnectionFailed(L, up);
}

}  // namespace

void JudgeProgress(Loop& L) {
  const TimePoint now = L.clock.Now();
  std::vector<ProgressMonitor::Waiting> waiting;
  for (auto& [address, up] : L.upstreams) {
    if (!up->streaming.empty() && up->usable(now)) {
      waiting.clear();
      for (const Waiting& c : up->streaming) waiting.push_back({c.waiting_since, c.expect});
      if (up->tokens.StreamsStalled(now, waiting)) {
        // Token streams are open and none moves: the engine is stuck
        // mid-answer, whatever its probe says.
        Inc(L.stats.token_stalls);
        spdlog::warn(
            "router: upstream {} ({}) is stalled mid-answer: {} token stream(s) open, no token "
            "for {} ms (the window its tokens set is {} ms); continuing them on standbys",
            address, up->node, waiting.size(), common::ToMillis(now - up->tokens.last_answer()),
            common::ToMillis(up->tokens.Window()));
        Stall(L, *up);
        if (L.shared.on_stall) L.shared.on_stall(address, &L);
        continue;
      }
    }
    if (up->waiting.empty() || !up->usable(now)) continue;
    waiting.clear();
    for (const Waiting& c : up->waiting) waiting.push_back({c.waiting_since, c.expect});
    if (!up->progress.Stalled(now, waiting)) continue;
    // Requests wait and none is answered: the upstream is alive (its probe
    // may well pass) but makes no progress. Its waiting requests go to their
    // standbys now, it is ejected, and the controller hears of it.
    Inc(L.stats.stalls);
    common::Duration oldest{};
    for (const Waiting& c : up->waiting) oldest = std::max(oldest, now - c.waiting_since);
    L.requests.Stall(oldest);
    spdlog::warn(
        "router: upstream {} ({}) is stalled: {} request(s) waiting, none answered for {} ms "
        "(its requests take up to {} ms); re-sending them to standbys",
        address, up->node, waiting.size(), common::ToMillis(now - up->progress.last_answer()),
        common::ToMillis(up->progress.Window()));
    Stall(L, *up);
    if (L.shared.on_stall) L.shared.on_stall(address, &L);
  }
}

void StallVerdict(Loop& L, const std::string& address) {
  auto it = L.upstreams.find(address);
  const TimePoint now = L.clock.Now();
  if (it == L.upstreams.end() || !it->second->usable(now)) return;
  UpstreamState& up = *it->second;
  // This loop saw it answer, or give a token, within a window: it is not
  // stalled here.
  for (const ProgressMonitor* m : {&up.progress, &up.tokens}) {
    if (m->last_answer() != TimePoint() && now - m->last_answer() < m->Window()) return;
  }
  Stall(L, up);
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
  auto up = std::make_unique<UpstreamState>(L.ejection, L.config.progress);
  up->address = u.address;
  up->node = u.node;
  auto hp = common::ParseHostPort(u.address, "upstream");
  error_code ec;
  if (hp.ok()) {
    auto a = net::ip::make_address(hp->host, ec);
    if (!ec) up->endpoint = tcp::endpoint(a, hp->port);
  }
  up->resolvable = hp.ok() && !ec;
  up->named = hp.ok() && ec && L.shared.dns != nullptr;
  if (auto v = L.verdicts.find(u.address); v != L.verdicts.end()) up->SetHealth(v->second);
  if (!hp.ok()) spdlog::warn("router: upstream '{}' is not HOST:PORT; skipped", u.address);
  UpstreamState& out = *L.upstreams.emplace(u.address, std::move(up)).first->second;
  if (out.named) LookUpName(L, out);
  return out;
}

void LookUpName(Loop& L, UpstreamState& up) {
  up.dns_generation = L.shared.dns->generation();
  std::optional<tcp::endpoint> ep = L.shared.dns->Find(up.address);
  up.resolvable = ep.has_value();
  if (ep && *ep != up.endpoint) {
    up.endpoint = *ep;
    up.idle.clear();  // pooled connections go to the old address
  }
}

bool Poolable(const UpConn& c, const UpstreamState& up) {
  if (up.health() != Health::kUp || up.idle.size() >= kMaxIdlePerUpstream) return false;
  if (!up.named) return true;
  error_code ec;
  return c.s.remote_endpoint(ec) == up.endpoint && !ec;
}

void UpstreamAnswered(Loop& L, UpstreamState& up, bool server_error, TimePoint at,
                      common::Duration waited) {
  if (!server_error) {
    up.progress.Answered(at, waited);
    up.consecutive_5xx = 0;
    up.Answered();
    return;
  }
  // Outlier ejection on consecutive server errors (Envoy's consecutive_5xx).
  const int limit = L.config.consecutive_5xx;
  if (limit > 0 && ++up.consecutive_5xx >= limit) {
    up.consecutive_5xx = 0;
    Inc(L.stats.ejections_5xx);
    spdlog::warn("router: upstream {} ({}) ejected after {} consecutive 5xx answers", up.address,
                 up.node, limit);
    ConnectionFailed(L, up);
  }
}

void ConnectionFailed(Loop& L, UpstreamState& up) {
  up.UpstreamHealth::ConnectionFailed(L.clock.Now());
  up.idle.clear();
  DropH2(up);
  Inc(L.stats.ejections);
  std::lock_guard<std::mutex> lock(L.shared.suspects_mu);
  if (L.shared.suspects.size() < 1024) L.shared.suspects.push_back(up.node);
}

void SetHealth(Loop& L, const std::string& address, Health h) {
  if (h == Health::kUp) {
    L.verdicts.erase(address);
  } else {
    L.verdicts[address] = h;
  }
  auto it = L.upstreams.find(address);
  if (it == L.upstreams.end()) return;
  UpstreamState& up = *it->second;
  up.SetHealth(h);
  if (h == Health::kUp) return;
  for (Waiting& c : up.waiting) c.Cancel();
  CancelStreams(up);
  up.idle.clear();
  DropH2(up);
}

}  // namespace gpuha::router
