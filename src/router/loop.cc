#include "router/loop.h"

#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "common/net_util.h"
#include "router/h2_upstream.h"

namespace gpuha::router {

awaitable<void> Sweep(Loop& L) {
  Timer t(L.ioc);
  Clock::time_point trimmed = Clock::now();
  for (;;) {
    // Every kSweep, or when a stall verdict falls due if that is sooner: a
    // verdict then lands when due, not up to a sweep later.
    common::Duration wait = kSweep;
    if (L.next_verdict) {
      wait = std::clamp<common::Duration>(*L.next_verdict - L.clock.Now(), milliseconds(1), kSweep);
    }
    const Clock::time_point wake_at = Clock::now() + wait;
    t.expires_at(wake_at);
    error_code ec;
    co_await t.async_wait(Redirect(ec));
    if (ec) co_return;
    L.now = L.clock.Now();
    const Clock::time_point before = L.io_now;
    L.io_now = Clock::now();
    NoteLag(L, L.io_now - wake_at, L.io_now - before);
    // Check() may not erase; copying keeps the walk safe and is cheap next
    // to the sweep interval.
    std::vector<Deadline*> all(L.deadlines.begin(), L.deadlines.end());
    for (Deadline* d : all) d->Check(L.io_now);
    ApplyHeldHangs(L);
    L.next_verdict.reset();
    if (L.config.stall_detection) JudgeProgress(L);
    if (L.io_now - trimmed >= std::chrono::seconds(1)) {  // once a second
      TrimIdle(L);
      trimmed = L.io_now;
    }
  }
}

void NoteLag(Loop& L, common::Duration late, common::Duration since_last) {
  // The peak decays by an eighth of the time passed: a one-off 100 ms
  // stall is forgotten within a second, a host that stays loaded keeps it.
  const common::Duration decayed = std::max(common::Duration::zero(), L.lag - since_last / 8);
  L.lag = std::max(decayed, std::max(late, common::Duration::zero()));
}

bool UpConn::HasUnread() const {
  // The socket's receive queue only: `buf` may hold a chunk's trailing CRLF
  // for as long as the next chunk takes, which is no news.
  if (client_paused) return false;
  int n = 0;
  return ::ioctl(const_cast<Socket&>(s).native_handle(), FIONREAD, &n) == 0 && n > 0;
}

namespace {

// Answers of `up` wait unread in the router's own sockets: the upstream
// moves, and the router has not yet taken it in (its loop was busy or
// starved). No verdict until they are read.
bool AnswersUnread(const UpstreamState& up) {
  for (const Waiting& c : up.streaming) {
    if (c.HasUnread()) return true;
  }
  for (const Waiting& c : up.waiting) {
    if (c.HasUnread()) return true;
  }
  return false;
}

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
  up.judged_stalled = true;
}

// An upstream judged stalled and still ejected: a request that began to
// wait on it after the verdict (it was connecting or writing then, or took
// it as a last resort) is cancelled once past its own limit, the verdict
// being in already; left alone, it waited for response_timeout (60 s).
void CancelLate(Loop& L, UpstreamState& up, TimePoint now) {
  const common::Duration window = up.progress.Window();
  for (Waiting& c : up.waiting) {
    common::Duration limit = up.progress.Limit({c.waiting_since, c.expect}, window);
    if (!c.hung_cancel && now - c.waiting_since > limit) {
      Inc(L.stats.stall_resends);
      c.Cancel();
    }
  }
  const common::Duration gap = up.tokens.Window();
  for (Waiting& c : up.streaming) {
    common::Duration limit = up.tokens.Limit({c.waiting_since, c.expect}, gap);
    if (!c.hung_cancel && now - c.waiting_since > limit) c.Cancel();
  }
}

// How long the upstream went without progress when judged (the oldest
// wait, when it never made any), and how late the sweep judged it.
void LogStall(Loop& L, UpstreamState& up, const ProgressMonitor& m, std::string_view what,
              size_t waiting, TimePoint due, TimePoint now) {
  common::Duration quiet = now - m.last_progress();
  if (m.last_progress() == TimePoint()) {
    quiet = {};
    for (const Waiting& c : up.waiting) quiet = std::max(quiet, now - c.waiting_since);
    for (const Waiting& c : up.streaming) quiet = std::max(quiet, now - c.waiting_since);
  }
  L.requests.Stall(quiet);
  spdlog::warn(
      "router: upstream {} ({}) is stalled{}: {} waiting, no progress for {} ms (its window is {} "
      "ms; judged {} ms after the verdict fell due); re-sending them to standbys",
      up.address, up.node, what, waiting, common::ToMillis(quiet), common::ToMillis(m.Window()),
      common::ToMillis(now - due));
}

// A verdict not yet due: the sweep wakes when it falls due.
void NoteDue(Loop& L, std::optional<TimePoint> due, TimePoint now) {
  if (due && *due >= now && (!L.next_verdict || *due < *L.next_verdict)) L.next_verdict = due;
}

}  // namespace

void JudgeProgress(Loop& L) {
  const TimePoint now = L.clock.Now();
  // The verdicts fall due this much later on a lagging host.
  const common::Duration slack = 2 * L.lag;
  std::vector<ProgressMonitor::Waiting> waiting;
  for (auto& [address, up] : L.upstreams) {
    if (!up->streaming.empty() && up->usable(now)) {
      waiting.clear();
      for (const Waiting& c : up->streaming) waiting.push_back({c.waiting_since, c.expect});
      std::optional<TimePoint> due = up->tokens.StreamsStallDue(waiting);
      if (due) *due += slack;
      NoteDue(L, due, now);
      if (due && *due < now && !AnswersUnread(*up)) {
        // Token streams are open and none moves: the engine is stuck
        // mid-answer, whatever its probe says.
        Inc(L.stats.token_stalls);
        LogStall(L, *up, up->tokens, " mid-answer (token streams)", waiting.size(), *due, now);
        Stall(L, *up);
        if (L.shared.on_stall) L.shared.on_stall(address, &L);
        continue;
      }
    }
    if (!up->usable(now)) {
      if (up->judged_stalled && up->candidate()) CancelLate(L, *up, now);
      continue;
    }
    if (up->waiting.empty()) continue;
    waiting.clear();
    for (const Waiting& c : up->waiting) waiting.push_back({c.waiting_since, c.expect});
    // Judged stalled (here or by another loop) and no progress since: one
    // overdue request is enough.
    std::optional<TimePoint> due = up->progress.StallDue(waiting, up->judged_stalled ? 1 : 0);
    if (due) *due += slack;
    NoteDue(L, due, now);
    if (!due || *due >= now || AnswersUnread(*up)) continue;
    // Requests wait and none is answered: the upstream is alive (its probe
    // may well pass) but makes no progress. Its waiting requests go to their
    // standbys now, it is ejected, and the controller hears of it.
    Inc(L.stats.stalls);
    LogStall(L, *up, up->progress, "", waiting.size(), *due, now);
    Stall(L, *up);
    if (L.shared.on_stall) L.shared.on_stall(address, &L);
  }
}

void StallVerdict(Loop& L, const std::string& address) {
  auto it = L.upstreams.find(address);
  const TimePoint now = L.clock.Now();
  if (it == L.upstreams.end() || !it->second->usable(now)) return;
  UpstreamState& up = *it->second;
  // This loop saw it progress (an answer to a request no older than those
  // it answered before, or a token) within a window: not stalled here yet.
  // The verdict stands, though: one request of this loop's overdue is then
  // enough (JudgeProgress), since this loop alone may never hold three
  // (two loops, 20 streams at 200 req/s: requests waited for 60 s).
  for (const ProgressMonitor* m : {&up.progress, &up.tokens}) {
    if (m->last_progress() != TimePoint() && now - m->last_progress() < m->Window()) {
      up.judged_stalled = true;
      return;
    }
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

void PoolIdle(Loop& L, UpstreamState& up, std::unique_ptr<UpConn> c,
              const http::response_header<Fields>& res) {
  if (!Poolable(*c, up)) return;
  milliseconds limit = L.config.limits.upstream_idle_timeout;
  auto hint = res[http::field::keep_alive];
  if (std::optional<int> s =
          common::KeepAliveTimeout(absl::string_view(hint.data(), hint.size()))) {
    limit = std::min(limit, milliseconds(std::max(0, *s - 1) * 1000));
  }
  if (limit <= milliseconds(0)) return;  // the upstream keeps it for a second or less
  c->deadline.Disarm();
  c->idle_until = Clock::now() + limit;
  up.idle.push_back(std::move(c));
}

namespace {

// True when an idle pooled connection has nothing to say: no byte and no
// EOF waiting on its socket. An upstream that wrote after its answer was
// done (a second response, a body after a HEAD answer, a FIN) would put
// those bytes in front of the next request's answer, maybe another
// tenant's: such a connection is closed, never reused (as nginx and
// HAProxy do).
bool Quiet(UpConn& c) {
  char byte;
  ssize_t n = ::recv(c.s.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

std::unique_ptr<UpConn> TakeIdle(Loop& L, UpstreamState& up) {
  const Clock::time_point now = L.io_now;
  while (!up.idle.empty()) {
    std::unique_ptr<UpConn> c = std::move(up.idle.back());
    up.idle.pop_back();
    if (now < c->idle_until && Quiet(*c)) return c;  // else closed here
    if (now < c->idle_until) Inc(L.stats.upstream_conns_unclean);
  }
  return nullptr;
}

void TrimIdle(Loop& L) {
  for (auto& [address, up] : L.upstreams) {
    auto& idle = up->idle;
    idle.erase(
        std::remove_if(idle.begin(), idle.end(),
                       [&](const std::unique_ptr<UpConn>& c) { return c->idle_until <= L.io_now; }),
        idle.end());
  }
}

bool Poolable(const UpConn& c, const UpstreamState& up) {
  if (up.health() != Health::kUp || up.idle.size() >= kMaxIdlePerUpstream) return false;
  if (!up.named) return true;
  error_code ec;
  return c.s.remote_endpoint(ec) == up.endpoint && !ec;
}

void UpstreamAnswered(Loop& L, UpstreamState& up, bool server_error, TimePoint at,
                      std::optional<common::Duration> waited) {
  if (!server_error) {
    if (waited) {
      up.progress.Answered(at, *waited);
    } else {
      up.progress.Progressed(at);  // no latency to learn, no frontier to move
    }
    if (up.progress.last_progress() == at) up.judged_stalled = false;
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

namespace {

// This loop saw the upstream answer a request (or a token) within
// hang_after of now.
bool ProgressedWithinHangAfter(const Loop& L, const UpstreamState& up, TimePoint now) {
  const TimePoint last = std::max(up.progress.last_progress(), up.tokens.last_progress());
  return last != TimePoint() && now - last < L.config.hang_after;
}

void ApplyHealth(UpstreamState& up, Health h) {
  up.hang_held = false;
  up.SetHealth(h);
  if (h == Health::kUp) return;
  for (Waiting& c : up.waiting) c.Cancel();
  CancelStreams(up);
  up.idle.clear();
  DropH2(up);
}

}  // namespace

void SetHealth(Loop& L, const std::string& address, Health h) {
  if (h == Health::kUp) {
    L.verdicts.erase(address);
  } else {
    L.verdicts[address] = h;
  }
  auto it = L.upstreams.find(address);
  if (it == L.upstreams.end()) return;
  UpstreamState& up = *it->second;
  const TimePoint now = L.clock.Now();
  if (h == Health::kHung && up.health() == Health::kUp && ProgressedWithinHangAfter(L, up, now)) {
    up.hang_held = true;
    Inc(L.stats.held_hangs);
    spdlog::warn(
        "router: upstream {} ({}) answered its probe late but its requests {} ms ago: busy, not "
        "hung; the hang verdict waits until its requests go {} ms unanswered",
        up.address, up.node,
        common::ToMillis(now - std::max(up.progress.last_progress(), up.tokens.last_progress())),
        L.config.hang_after.count());
    return;
  }
  ApplyHealth(up, h);
}

void ApplyHeldHangs(Loop& L) {
  const TimePoint now = L.clock.Now();
  for (auto& [address, up] : L.upstreams) {
    if (!up->hang_held || ProgressedWithinHangAfter(L, *up, now)) continue;
    spdlog::warn(
        "router: upstream {} ({}) is hung: no probe answer and no request answered for {} ms",
        up->address, up->node, L.config.hang_after.count());
    ApplyHealth(*up, Health::kHung);
  }
}

}  // namespace gpuha::router
