#include "router/router.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "router/client_conn.h"
#include "router/grpc_call.h"
#include "router/handoff.h"
#include "router/loop.h"
#include "router/prober.h"
#include "router/tls_contexts.h"

namespace gpuha::router {

// The router's control side: its loops, the admin server, the prober, and
// what they share. The request path lives in client_conn and exchange.
struct Router::Impl {
  Impl(RouterConfig c, common::Clock& clk, DnsCache::ResolveFn resolve)
      : config(std::move(c)),
        clock(clk),
        dns(config.dns_refresh, std::move(resolve)),
        prober(config, &dns, [this](const std::string& a, Health h) { Broadcast(a, h); }) {}

  // Hands one loop's stall verdict to the others.
  void BroadcastStall(const std::string& address, const Loop* from) {
    for (auto& L : loops) {
      if (L.get() == from) continue;
      net::post(L->ioc, [lp = L.get(), address] { StallVerdict(*lp, address); });
    }
  }
  // Hands a prober verdict to every loop.
  void Broadcast(const std::string& address, Health h) {
    for (auto& L : loops) {
      net::post(L->ioc, [lp = L.get(), address, h] { SetHealth(*lp, address, h); });
    }
  }
  absl::Status Listen();
  std::string Metrics() const;

  const RouterConfig config;  // as started; a reload changes only what loops copy
  common::Clock& clock;
  RouterShared shared;
  std::vector<std::unique_ptr<Loop>> loops;
  std::unique_ptr<common::HttpServer> admin;
  uint16_t port = 0;
  std::shared_ptr<const TenantSet> tenants;  // as last published to the loops
  DnsCache dns;                              // before the prober, which reads it
  Prober prober;
  // Listeners a predecessor gave (Start), until Listen and the admin
  // server take them; `taken->giver` until this router serves (Serving).
  std::optional<Listeners> taken;
  std::unique_ptr<HandoffServer> handoff;  // gives the listeners to a successor
  std::atomic<bool> handed_off{false};
  std::mutex serving_mu;
  bool accepting = false;  // guarded by serving_mu
  // Accepts on every loop, and tells a predecessor this router serves, once
  // it holds routes (a taker accepts nothing before: the predecessor
  // serves meanwhile). Idempotent; any thread.
  void Serving();
};

void Router::Impl::Serving() {
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    if (shared.routes == nullptr && taken) return;
  }
  std::lock_guard<std::mutex> lock(serving_mu);
  if (accepting) return;
  accepting = true;
  for (auto& L : loops) {
    net::post(L->ioc, [lp = L.get()] { net::co_spawn(lp->ioc, Accept(*lp), net::detached); });
  }
  if (taken) SayReady(&taken->giver);
}

absl::Status Router::Impl::Listen() {
  // A router running at the handoff socket gives its listeners: they stay
  // open across the restart, and no connection is refused.
  if (taken) {
    std::optional<Listeners>& got = taken;
    {
      for (size_t i = 0; i < loops.size(); ++i) {
        int fd = ::dup(got->data[i % got->data.size()]);
        error_code ec;
        loops[i]->acceptor = std::make_unique<tcp::acceptor>(loops[i]->ioc);
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
        loops[i]->acceptor->assign(a.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
        if (ec) {
          ::close(fd);
          return absl::InternalError(absl::StrCat("listen: a handed-off socket: ", ec.message()));
        }
      }
      for (int fd : got->data) ::close(fd);  // each loop holds its own descriptor
      got->data.clear();
      port = loops.front()->acceptor->local_endpoint().port();
      if (port != config.listen.port && config.listen.port != 0) {
        spdlog::warn("router: the listeners taken are on port {}, not listen's {}: kept", port,
                     config.listen.port);
      }
      spdlog::info("router: took the listeners (port {}) of the router at {}", port,
                   config.handoff_socket);
      return absl::OkStatus();
    }
  }
  std::vector<net::io_context*> iocs;
  for (auto& L : loops) iocs.push_back(&L->ioc);
  auto acceptors = common::ListenReusePort(iocs, config.listen.host, config.listen.port);
  if (!acceptors.ok()) {
    return absl::Status(acceptors.status().code(),
                        absl::StrCat("listen: ", acceptors.status().message()));
  }
  for (size_t i = 0; i < loops.size(); ++i) loops[i]->acceptor = std::move((*acceptors)[i]);
  port = loops.front()->acceptor->local_endpoint().port();
  return absl::OkStatus();
}

Router::Router(RouterConfig config, common::Clock* clock, DnsCache::ResolveFn resolve)
    : impl_(std::make_unique<Impl>(std::move(config), *clock, std::move(resolve))) {}
Router::~Router() { Stop(); }

absl::Status Router::Start() {
  Impl& I = *impl_;
  int threads = I.config.threads > 0
                    ? I.config.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A router running at the handoff socket gives its listeners: they stay
  // open across the restart, and no connection is refused. A loop each,
  // at least: a socket of the group no loop accepted on would hold
  // connections no one takes.
  if (!I.config.handoff_socket.empty()) {
    absl::StatusOr<Listeners> got = TakeListeners(I.config.handoff_socket);
    if (got.ok()) {
      threads = std::max(threads, static_cast<int>(got->data.size()));
      I.taken = std::move(*got);
    } else if (got.status().code() != absl::StatusCode::kNotFound) {
      return absl::Status(got.status().code(), absl::StrCat("listen: ", got.status().message()));
    }
  }
  auto tls = MakeServerTls(I.config);
  if (!tls.ok()) return tls.status();
  auto upstream_tls = MakeUpstreamTls(I.config);
  if (!upstream_tls.ok()) return upstream_tls.status();
  I.prober.SetTls(*upstream_tls);
  I.tenants = TenantSet::Build(I.config.tenants, nullptr);
  I.shared.on_stall = [&I](const std::string& address, const Loop* from) {
    I.BroadcastStall(address, from);
  };
  I.shared.dns = &I.dns;
  I.dns.Start();  // before the first routes, whose names it resolves
  for (int i = 0; i < threads; ++i) {
    auto L = std::make_unique<Loop>(I.clock, I.config, I.shared);
    L->tls = *tls;
    L->upstream_tls = *upstream_tls;
    L->tenants = I.tenants;
    I.loops.push_back(std::move(L));
  }
  if (absl::Status s = I.Listen(); !s.ok()) return s;
  if (!I.config.routes.empty() || I.config.controllers.empty()) {
    if (absl::Status s = SetRoutes(RouteTable::FromStatic(I.config.routes)); !s.ok()) return s;
  }
  auto admin = common::HttpServer::Start(
      {.address = I.config.admin.host,
       .port = I.config.admin.port,
       .adopt_fd = I.taken ? std::exchange(I.taken->admin, -1) : -1},
      [this](const common::HttpRequest& r) -> common::HttpResponse {
        if (r.path == "/metrics") {
          return {200, "text/plain; version=0.0.4; charset=utf-8", MetricsText(), {}};
        }
        // /livez: the process answers (liveness). /healthz: it is ready for
        // traffic (readiness): a load balancer, a Kubernetes Service or
        // keepalived's check sends it none otherwise.
        if (r.path == "/livez") return {200, "text/plain; charset=utf-8", "ok\n", {}};
        if (r.path == "/healthz") {
          std::string why;
          if (Ready(&why)) return {200, "text/plain; charset=utf-8", "ok\n", {}};
          return {503, "text/plain; charset=utf-8", absl::StrCat("not ready: ", why, "\n"), {}};
        }
        if (r.path == "/routes") {
          auto t = routes();
          std::string out =
              absl::StrCat("{\"version\":", t ? t->version() : 0, ",\"epoch\":", t ? t->epoch() : 0,
                           ",\"streams\":", t ? t->size() : 0, "}\n");
          return {200, "application/json", out, {}};
        }
        return {404, "text/plain; charset=utf-8", "not found\n", {}};
      });
  if (!admin.ok()) return admin.status();
  I.admin = std::move(*admin);
  for (auto& L : I.loops) {
    Loop* lp = L.get();
    net::co_spawn(lp->ioc, Sweep(*lp), net::detached);
    lp->thread = std::thread([lp] { lp->ioc.run(); });
  }
  I.prober.Start();
  if (!I.config.handoff_socket.empty()) {
    Listeners mine;
    for (auto& L : I.loops) mine.data.push_back(::dup(L->acceptor->native_handle()));
    mine.admin = ::dup(I.admin->listen_fd());
    auto handoff = HandoffServer::Start(I.config.handoff_socket, std::move(mine),
                                        [&I] { I.handed_off = true; });
    if (!handoff.ok()) return handoff.status();
    I.handoff = std::move(*handoff);
  }
  I.Serving();
  spdlog::info("router: {} loop(s) on {}:{}{}, admin on {}:{}", threads, I.config.listen.host,
               I.port, I.loops[0]->tls ? " (TLS)" : "", I.config.admin.host, I.admin->port());
  if (!I.tenants->auth_required()) {
    spdlog::warn(
        "router: auth is off (no tenants): {}:{} answers anyone without an API key and reaches "
        "every stream",
        I.config.listen.host, I.port);
  }
  return absl::OkStatus();
}

void Router::Stop() {
  if (!impl_) return;
  Impl& I = *impl_;
  I.handoff.reset();
  I.prober.Stop();
  I.dns.Stop();
  for (auto& L : I.loops) L->ioc.stop();
  for (auto& L : I.loops) {
    if (L->thread.joinable()) L->thread.join();
  }
  if (I.admin) I.admin->Stop();
}

bool Router::HandedOff() const { return impl_->handed_off.load(); }

bool Router::Ready(std::string* why) const {
  auto say = [&](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if (impl_->shared.draining.load()) return say("draining");
  if (routes() == nullptr) return say("no routes yet from the controller");
  return true;
}

void Router::Drain(std::chrono::milliseconds timeout) {
  Impl& I = *impl_;
  if (I.shared.draining.exchange(true)) return;
  if (!I.handed_off) {
    // Its copies of the listeners go, or the sockets would stay open with
    // no one accepting: connections would queue unserved for the drain.
    I.handoff.reset();
  } else if (I.admin) {
    // The successor answers on the shared admin socket; this one's 503s
    // would fail half the health checks.
    I.admin->Stop();
  }
  using SteadyClock = std::chrono::steady_clock;
  const auto start = SteadyClock::now();
  auto sum = [&I](std::atomic<int64_t> Stats::*field) {
    int64_t n = 0;
    for (const auto& L : I.loops) n += (L->stats.*field).load();
    return n;
  };
  spdlog::info("router: draining: {} connection(s) open, {} request(s) in flight; up to {} ms",
               sum(&Stats::open_connections), sum(&Stats::in_flight), timeout.count());
  // On each loop: no more connections, and HTTP/2 clients hear the first
  // GOAWAY. `what` runs on every loop's own thread.
  auto on_loops = [&I](std::function<void(Loop&)> what) {
    for (auto& L : I.loops) net::post(L->ioc, [lp = L.get(), what] { what(*lp); });
  };
  on_loops([](Loop& L) {
    error_code ec;
    if (L.acceptor) L.acceptor->close(ec);
    for (grpc_proxy::H2ClientConn* c : L.h2_clients) {
      c->h2.ShutdownNotice();
      c->Kick();
    }
  });
  bool final_goaway = false, idle_closed = false;
  // Since when nothing has been in flight (max: something is).
  SteadyClock::time_point quiet_since = SteadyClock::time_point::max();
  const char* ended = "every connection closed";
  for (;;) {
    const auto now = SteadyClock::now();
    if (sum(&Stats::open_connections) == 0) break;
    if (now - start >= timeout) {
      ended = "drain_timeout passed";
      break;
    }
    // A round trip after the notice, the GOAWAY that names the last stream.
    if (!final_goaway && now - start >= std::chrono::milliseconds(500)) {
      final_goaway = true;
      on_loops([](Loop& L) {
        for (grpc_proxy::H2ClientConn* c : L.h2_clients) {
          c->h2.GoAwayGraceful();
          c->Kick();
        }
      });
    }
    // Nothing in flight for a second: the clients that send had their
    // Connection: close; the kept-alive connections left are idle.
    if (sum(&Stats::in_flight) > 0) {
      quiet_since = SteadyClock::time_point::max();
    } else if (quiet_since == SteadyClock::time_point::max()) {
      quiet_since = now;
    } else if (!idle_closed && now - quiet_since >= std::chrono::seconds(1)) {
      idle_closed = true;
      on_loops([](Loop& L) {
        for (Deadline* d : L.idle_clients) d->Check(Clock::time_point::max());
      });
      ended = "nothing in flight for a second; idle connections closed";
    } else if (idle_closed && now - quiet_since >= std::chrono::seconds(2)) {
      break;  // what is left holds no request
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t cut = sum(&Stats::in_flight);
  if (cut > 0) {
    // HTTP/2 streams still open end with GOAWAY (gRPC: UNAVAILABLE), and
    // HTTP/1.1 answers awaited from an upstream (an SSE answer between two
    // tokens) with an error the client reads (ClientConn), not a silent
    // close.
    I.shared.drain_expired = true;
    on_loops([](Loop& L) {
      for (auto& [address, up] : L.upstreams) {
        std::vector<UpConn*> awaited;
        for (WaitingList* list : {&up->waiting, &up->streaming}) {
          for (Waiting& w : *list) {
            if (auto* c = dynamic_cast<UpConn*>(&w)) awaited.push_back(c);
          }
        }
        for (UpConn* c : awaited) c->Cancel();
      }
    });
    on_loops([](Loop& L) {
      for (grpc_proxy::H2ClientConn* c : L.h2_clients) {
        c->h2.GoAway(NGHTTP2_NO_ERROR);
        c->Kick();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  spdlog::info(
      "router: drained in {} ms ({}): {} connection(s) left, {} request(s) cut",
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start).count(),
      ended, sum(&Stats::open_connections), cut);
}

uint16_t Router::port() const { return impl_->port; }
uint16_t Router::admin_port() const { return impl_->admin ? impl_->admin->port() : 0; }

absl::Status Router::SetRoutes(std::shared_ptr<const RouteTable> table) {
  if (table == nullptr) return absl::InvalidArgumentError("no route table");
  // Under shared.mu: OK, or why `table` is older than the one held.
  auto check = [&]() -> absl::Status {
    const RouteTable* held = impl_->shared.routes.get();
    if (held != nullptr &&
        (table->epoch() < held->epoch() ||
         (table->epoch() == held->epoch() && table->version() < held->version()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale route snapshot: version ", table->version(), " epoch ", table->epoch(),
          " is older than the held version ", held->version(), " epoch ", held->epoch()));
    }
    return absl::OkStatus();
  };
  {
    std::lock_guard<std::mutex> lock(impl_->shared.mu);
    if (absl::Status s = check(); !s.ok()) return s;
  }
  // The table's names, resolved on the cache's thread; new ones get a short
  // wait for their first answer before the loops see the table (a DNS
  // outage cannot hold up a failover's routes for long).
  std::vector<std::string> addresses;
  for (const Upstream& u : table->upstreams()) addresses.push_back(u.address);
  impl_->dns.Track(addresses);
  {
    std::lock_guard<std::mutex> lock(impl_->shared.mu);
    if (absl::Status s = check(); !s.ok()) return s;  // a newer one came meanwhile
    impl_->shared.routes = table;
  }
  impl_->shared.routes_gen.fetch_add(1, std::memory_order_release);
  impl_->prober.SetRoutes(std::move(table));
  impl_->Serving();  // the first routes of a router that took its listeners
  return absl::OkStatus();
}

std::shared_ptr<const RouteTable> Router::routes() const {
  std::lock_guard<std::mutex> lock(impl_->shared.mu);
  return impl_->shared.routes;
}

absl::Status Router::Reload(const RouterConfig& config) {
  Impl& I = *impl_;
  auto tls = MakeServerTls(config);
  if (!tls.ok()) return tls.status();
  if (I.loops.empty()) return absl::FailedPreconditionError("router not started");
  if (static_cast<bool>(*tls) != static_cast<bool>(I.loops[0]->tls)) {
    return absl::InvalidArgumentError("tls: turning TLS on or off needs a restart");
  }
  auto upstream_tls = MakeUpstreamTls(config);
  if (!upstream_tls.ok()) return upstream_tls.status();
  if (config.upstream_server_name != I.config.upstream_server_name ||
      static_cast<bool>(*upstream_tls) != static_cast<bool>(I.loops[0]->upstream_tls)) {
    return absl::InvalidArgumentError(
        "upstream_tls: turning it on or off, or a new server_name, needs a restart");
  }
  I.prober.SetTls(*upstream_tls);
  std::shared_ptr<const TenantSet> tenants = TenantSet::Build(config.tenants, I.tenants.get());
  I.tenants = tenants;
  // Every loop takes the new settings on its own thread; Reload returns once
  // all have, so a request after "reloaded" meets them on any loop. New
  // upstream connections use the new certificates; pooled ones finish their
  // life on the old.
  auto applied = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(I.loops.size()));
  for (auto& L : I.loops) {
    net::post(L->ioc, [lp = L.get(), tls = *tls, upstream_tls = *upstream_tls, tenants, applied] {
      lp->tls = tls;
      lp->upstream_tls = upstream_tls;
      lp->tenants = tenants;
      applied->count_down();
    });
  }
  applied->wait();
  if (I.config.controllers.empty()) {
    if (absl::Status s = SetRoutes(RouteTable::FromStatic(config.routes)); !s.ok()) return s;
  }
  spdlog::info("router: reloaded ({} tenant(s){})", config.tenants.size(),
               *tls ? ", new certificate" : "");
  return absl::OkStatus();
}

std::vector<std::string> Router::TakeSuspects() {
  std::lock_guard<std::mutex> lock(impl_->shared.suspects_mu);
  return std::exchange(impl_->shared.suspects, {});
}

// ---------------------------------------------------------------------------
// Metrics

std::string Router::MetricsText() const { return impl_->Metrics(); }

v1::RouterStats Router::TrafficStats() const {
  v1::RouterStats out;
  LatencyHistograms::Map latency;
  for (const auto& L : impl_->loops) L->latency.AddTo(&latency);
  std::array<uint64_t, LatencyHistograms::kBounds.size() + 1> counts{};
  for (const auto& [key, c] : latency) {
    if (key.second == "none") continue;  // the client left: nothing was answered
    for (size_t b = 0; b < counts.size(); ++b) {
      counts[b] += c.buckets[b];
      out.set_answered(out.answered() + c.buckets[b]);
      if (key.second == "5xx") out.set_errors(out.errors() + c.buckets[b]);
    }
  }
  for (double b : LatencyHistograms::kBounds) out.add_latency_bounds(b);
  for (uint64_t c : counts) out.add_latency_counts(c);
  for (const auto& L : impl_->loops) {
    out.set_resends(out.resends() + L->stats.retries.load(std::memory_order_relaxed));
    out.set_stalls(out.stalls() + L->stats.stalls.load(std::memory_order_relaxed));
    out.set_in_flight(out.in_flight() + L->stats.in_flight.load(std::memory_order_relaxed));
  }
  return out;
}

std::string Router::Impl::Metrics() const {
  common::PromText p;
  auto sum = [&](auto field) {
    uint64_t total = 0;
    for (const auto& L : loops) total += field(L->stats).load(std::memory_order_relaxed);
    return total;
  };
  p.Family("gpuha_router_responses_total", "counter",
           "Final answers: from an upstream (by status class) or from the router (by reason).");
  for (int c = 1; c <= 5; ++c) {
    p.Sample("gpuha_router_responses_total",
             {{"source", "upstream"}, {"code", absl::StrCat(c, "xx")}, {"reason", ""}},
             double(sum([c](Stats & s) -> auto& { return s.upstream_class[c]; })));
  }
  for (size_t r = 0; r < static_cast<size_t>(Reason::kCount); ++r) {
    p.Sample("gpuha_router_responses_total",
             {{"source", "router"},
              {"code", std::to_string(ReasonStatus(static_cast<Reason>(r)))},
              {"reason", ReasonLabel(static_cast<Reason>(r))}},
             double(sum([r](Stats & s) -> auto& { return s.router_answers[r]; })));
  }
#define GPUHA_FAMILY(name, help)                             \
  p.Family("gpuha_router_" #name "_total", "counter", help); \
  p.Sample("gpuha_router_" #name "_total", {},               \
           double(sum([](Stats & s) -> auto& { return s.name; })));
  GPUHA_ROUTER_COUNTERS(GPUHA_FAMILY)
#undef GPUHA_FAMILY
  int64_t in_flight = 0;
  for (const auto& L : loops) in_flight += L->stats.in_flight.load(std::memory_order_relaxed);
  p.Family("gpuha_router_requests_in_flight", "gauge", "Requests being forwarded.");
  p.Sample("gpuha_router_requests_in_flight", {}, double(in_flight));
  int64_t open = 0;
  for (const auto& L : loops) open += L->stats.open_connections.load(std::memory_order_relaxed);
  p.Family("gpuha_router_client_connections", "gauge", "Client connections open.");
  p.Sample("gpuha_router_client_connections", {}, double(open));
  p.Family("gpuha_router_draining", "gauge",
           "1 while the router drains (SIGTERM): it takes no new connections and is not ready.");
  p.Sample("gpuha_router_draining", {}, shared.draining.load() ? 1.0 : 0.0);
  p.Family("gpuha_router_dns_names", "gauge", "Upstream DNS names the router resolves.");
  p.Sample("gpuha_router_dns_names", {}, double(dns.tracked()));
  p.Family("gpuha_router_dns_failures_total", "counter",
           "Upstream names that stopped resolving (or never did).");
  p.Sample("gpuha_router_dns_failures_total", {}, double(dns.failures()));
  p.Family("gpuha_router_probes_total", "counter", "Upstream liveness probes answered or failed.");
  p.Sample("gpuha_router_probes_total", {}, double(prober.probes()));
  p.Family("gpuha_router_probed_upstreams", "gauge", "Upstreams the router's prober checks.");
  p.Sample("gpuha_router_probed_upstreams", {}, double(prober.probed()));
  p.Family("gpuha_router_probe_verdicts_total", "counter", "Upstreams judged hung or down.");
  p.Sample("gpuha_router_probe_verdicts_total", {{"verdict", "hung"}}, double(prober.hangs()));
  p.Sample("gpuha_router_probe_verdicts_total", {{"verdict", "down"}}, double(prober.downs()));
  std::shared_ptr<const RouteTable> t;
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    t = shared.routes;
  }
  p.Family("gpuha_router_route_version", "gauge", "Route table version in use.");
  p.Sample("gpuha_router_route_version", {}, double(t ? t->version() : 0));
  p.Family("gpuha_router_routes", "gauge", "Streams in the route table.");
  p.Sample("gpuha_router_routes", {}, double(t ? t->size() : 0));
  p.Family("gpuha_router_request_duration_seconds", "histogram",
           "Requests from head read to answer written, by tenant and answer class "
           "(none: the client went away first). Token streams (SSE) and gRPC streaming "
           "calls are not requests here: they last as long as their answers are made.");
  LatencyHistograms::Map latency;
  for (const auto& L : loops) L->latency.AddTo(&latency);
  for (const auto& [key, c] : latency) {
    p.Histogram("gpuha_router_request_duration_seconds",
                {{"tenant", key.first}, {"result", key.second}}, LatencyHistograms::kBounds.data(),
                c.buckets.data(), LatencyHistograms::kBounds.size(), c.sum);
  }
  common::Histogram attempts(RequestHistograms::Attempts());
  common::Histogram failover(RequestHistograms::Seconds());
  common::Histogram stall(RequestHistograms::Seconds());
  for (const auto& L : loops) {
    std::lock_guard<std::mutex> lock(L->requests.mu);
    attempts.Merge(L->requests.upstream_attempts);
    failover.Merge(L->requests.failover_seconds);
    stall.Merge(L->requests.stall_detection_seconds);
  }
  p.Family("gpuha_router_upstream_attempts", "histogram",
           "Upstreams tried per request that reached one (1: no failover).");
  attempts.AppendTo(&p, "gpuha_router_upstream_attempts", {});
  p.Family("gpuha_router_failover_duration_seconds", "histogram",
           "Requests that needed more than one upstream: head read to answer written.");
  failover.AppendTo(&p, "gpuha_router_failover_duration_seconds", {});
  p.Family("gpuha_router_stall_detection_seconds", "histogram",
           "How long an upstream had made no progress when it was judged stalled (the "
           "oldest wait, when it never made any).");
  stall.AppendTo(&p, "gpuha_router_stall_detection_seconds", {});
  common::AppendProcessFamilies("router", &p);
  return p.str();
}
}  // namespace gpuha::router
