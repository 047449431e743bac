#include "router/router.h"

#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/intrusive/list.hpp>
#include <chrono>
#include <latch>
#include <limits>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "router/admission.h"
#include "router/request.h"
#include "router/retry_budget.h"
#include "router/tenants.h"
#include "router/upstream_health.h"
#include "router/upstream_selector.h"

namespace gpuha::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;  // Asio timers; policy time comes from common::Clock
using common::TimePoint;
using std::chrono::milliseconds;

// Coroutines, sockets and timers on the io_context's own executor type rather
// than any_io_executor: no type-erased executor call per operation.
using Executor = net::io_context::executor_type;
template <class T>
using awaitable = net::awaitable<T, Executor>;
using Socket = net::basic_stream_socket<tcp, Executor>;
using Timer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;

struct Loop;

namespace {

constexpr size_t kChunk = 64 * 1024;
constexpr size_t kMaxIdlePerUpstream = 256;

auto Redirect(error_code& ec) { return net::redirect_error(net::use_awaitable_t<Executor>(), ec); }

// Starts TLS on a connected upstream socket: SNI for a DNS name, and the
// certificate must chain to upstream_tls.ca and carry `name`.
template <class TlsStream>
void PrepareUpstreamTls(TlsStream& tls, const std::string& name) {
  error_code ec;
  net::ip::make_address(name, ec);
  if (ec) SSL_set_tlsext_host_name(tls.native_handle(), name.c_str());  // not an IP
  tls.set_verify_callback(ssl::host_name_verification(name));
}

// A coarse deadline on one socket. Arm() only stores a time; the loop's sweep
// (every kSweep) cancels the socket's pending operations once it has passed.
// No timer per operation: no timerfd churn on the request path.
class Deadline {
 public:
  Deadline(Loop& loop, Socket& s);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;
  void Arm(milliseconds d);
  void Disarm() { at_ = TimePoint::max(); }
  bool expired() const { return expired_; }
  // Called by the sweep.
  void Check(TimePoint now) {
    if (now < at_) return;
    expired_ = true;
    at_ = TimePoint::max();
    error_code ec;
    s_.cancel(ec);
  }

 private:
  Loop& loop_;
  Socket& s_;
  TimePoint at_ = TimePoint::max();
  bool expired_ = false;
};

struct UpConn {
  UpConn(Loop& loop, Executor ex) : s(ex), deadline(loop, s) {}
  Socket s;
  Deadline deadline;
  beast::flat_buffer buf;
  bool hung_cancel = false;  // cancelled because its upstream was judged hung
  // In its upstream's `waiting` list while it awaits a response head; leaves
  // it by itself when destroyed.
  boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::auto_unlink>>
      waiting_hook;
  // TLS over `s` when upstream_tls is configured (declared last: destroyed
  // before the socket it runs on).
  std::shared_ptr<ssl::context> tls_ctx;
  std::unique_ptr<ssl::stream<Socket&>> tls;

  // I/O on whichever of the two carries the connection. Plain functions that
  // hand back the operation's awaitable: no coroutine frame of their own.
  template <class Buffers>
  awaitable<size_t> Write(const Buffers& b, error_code& ec) {
    return tls ? net::async_write(*tls, b, Redirect(ec)) : net::async_write(s, b, Redirect(ec));
  }
  template <class Token>
  auto async_read_some(const net::mutable_buffer& b, Token&& token) {
    return tls ? tls->async_read_some(b, std::forward<Token>(token))
               : s.async_read_some(b, std::forward<Token>(token));
  }
};
using WaitingList = boost::intrusive::list<
    UpConn,
    boost::intrusive::member_hook<UpConn, decltype(UpConn::waiting_hook), &UpConn::waiting_hook>,
    boost::intrusive::constant_time_size<false>>;

// One upstream as one loop sees it: its policy state (UpstreamHealth) and
// its connections. Loop-local: no locks.
struct UpstreamState : UpstreamHealth {
  using UpstreamHealth::UpstreamHealth;
  std::string address;
  std::string node;
  tcp::endpoint endpoint;
  std::vector<std::unique_ptr<UpConn>> idle;
  WaitingList waiting;  // awaiting a response head (no allocation per request)
};

// Every plain counter of a loop, declared once: the list makes both the
// fields and their /metrics families (gpuha_router_<field>_total).
#define GPUHA_ROUTER_COUNTERS(X)                                                            \
  X(requests, "Requests read from clients.")                                                \
  X(retries, "Requests re-sent to another upstream.")                                       \
  X(hung_resends, "Requests re-sent because their upstream was judged hung.")               \
  X(stale_resends, "Requests re-sent on a fresh connection after a pooled one was closed.") \
  X(ejections, "Upstreams ejected after a connection failure.")                             \
  X(upstream_connects, "New upstream connections.")                                         \
  X(upstream_reuses, "Requests sent on a pooled connection.")                               \
  X(client_aborts, "Clients that left before their answer.")                                \
  X(upstream_aborts, "Responses cut because the upstream broke mid-body.")                  \
  X(connections, "Client connections accepted.")                                            \
  X(tls_handshake_failures, "Failed TLS handshakes.")

struct Stats {
#define GPUHA_FIELD(name, help) std::atomic<uint64_t> name{0};
  GPUHA_ROUTER_COUNTERS(GPUHA_FIELD)
#undef GPUHA_FIELD
  std::array<std::atomic<uint64_t>, 6> upstream_class{};  // 1xx..5xx from upstreams
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Reason::kCount)> router_answers{};
  std::atomic<int64_t> in_flight{0};
};

void Inc(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

constexpr milliseconds kSweep{20};

struct Loop {
  // One thread runs this io_context and every socket on it is touched only
  // from that thread (other threads post to it), so the reactor's
  // per-socket locking is off.
  Loop(common::Clock& c, const RouterConfig& config)
      : ioc_owner(std::make_unique<net::io_context>(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO)),
        ioc(*ioc_owner),
        clock(c),
        now(c.Now()),
        sticky(config.sticky),
        retry_budget({.percent = config.retry_budget_percent,
                      .min_per_second = config.retry_min_per_second,
                      .burst = config.retry_burst},
                     now),
        ejection({.base = config.ejection_base, .max = config.ejection_max}) {}
  ~Loop() {
    // Pooled sockets first, while the io_context lives; then the io_context,
    // whose destruction frees suspended request frames, which still touch
    // the members below.
    acceptor.reset();
    for (auto& [address, up] : upstreams) up->idle.clear();
    ioc_owner.reset();
  }
  std::unique_ptr<net::io_context> ioc_owner;
  net::io_context& ioc;
  common::Clock& clock;
  TimePoint now;  // clock.Now() as of the last sweep: coarse, and free to read
  std::unordered_set<Deadline*> deadlines;
  std::vector<std::unique_ptr<char[]>> free_chunks;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread thread;
  std::unordered_map<std::string, std::unique_ptr<UpstreamState>> upstreams;
  StickyTable sticky;
  std::shared_ptr<const RouteTable> routes;
  uint64_t routes_gen = ~uint64_t{0};
  std::shared_ptr<const TenantSet> tenants;
  std::shared_ptr<ssl::context> tls;           // null: plain HTTP
  std::shared_ptr<ssl::context> upstream_tls;  // null: plain HTTP to upstreams
  RetryBudget retry_budget;
  UpstreamHealth::Options ejection;
  uint64_t round_robin = 0;
  Stats stats;
};

Deadline::Deadline(Loop& loop, Socket& s) : loop_(loop), s_(s) { loop_.deadlines.insert(this); }
Deadline::~Deadline() { loop_.deadlines.erase(this); }
void Deadline::Arm(milliseconds d) {
  at_ = loop_.now + d;
  expired_ = false;
}

// A 64 KiB relay buffer from the loop's free list; returned on destruction.
class Chunk {
 public:
  explicit Chunk(Loop& loop) : loop_(loop) {
    if (loop.free_chunks.empty()) {
      p_.reset(new char[kChunk]);  // not value-initialised: no memset per request
    } else {
      p_ = std::move(loop.free_chunks.back());
      loop.free_chunks.pop_back();
    }
  }
  ~Chunk() {
    if (loop_.free_chunks.size() < 64) loop_.free_chunks.push_back(std::move(p_));
  }
  char* get() const { return p_.get(); }

 private:
  Loop& loop_;
  std::unique_ptr<char[]> p_;
};

// Parsing happens in place: bytes are read into a flat buffer and fed to the
// parser here, skipping Beast's composed read operations, each of which costs
// a trip through the scheduler even when the bytes are already buffered (a
// small keep-alive request and its response usually arrive whole).
constexpr size_t kReadAhead = 16 * 1024;

// Feeds `p` from `buf`. True when that moved the parser (bytes parsed,
// completion, a full body buffer or an error): no read is needed yet.
template <class Parser>
bool ParseBuffered(beast::flat_buffer& buf, Parser& p, error_code& ec) {
  if (buf.size() == 0) return false;
  size_t n = p.put(buf.data(), ec);
  buf.consume(n);
  if (ec == http::error::need_more) ec = {};
  if (ec == http::error::need_buffer) {  // the body buffer is full
    ec = {};
    return true;
  }
  return ec || n > 0 || p.is_done();
}

// Settles a read of `got` bytes into `buf` that ended with `ec`: the bytes are
// committed, or an end of stream becomes what the parser makes of it. True
// when the peer ended the stream.
template <class Parser>
bool AfterRead(beast::flat_buffer& buf, Parser& p, size_t got, error_code& ec) {
  // A TLS peer that closes without close_notify has ended the stream too.
  if (ec == net::error::eof || ec == ssl::error::stream_truncated) {
    ec = {};
    if (!p.got_some()) {
      ec = http::error::end_of_stream;  // closed between messages
    } else {
      p.put_eof(ec);  // completes a body delimited by close, else partial_message
    }
    return true;
  }
  if (!ec) buf.commit(got);
  return false;
}

// Feeds `p` from `buf`, reading the socket only when the buffered bytes do
// not let the parser advance, and returns after any progress, completion or
// an error. The two heads on every request's path inline this loop instead:
// a coroutine call costs a frame allocation.
template <class Stream, class Parser>
awaitable<void> ReadSome(Stream& s, beast::flat_buffer& buf, Parser& p, error_code& ec) {
  for (;;) {
    if (ParseBuffered(buf, p, ec)) co_return;
    size_t got = co_await s.async_read_some(buf.prepare(kReadAhead), Redirect(ec));
    if (AfterRead(buf, p, got, ec) || ec) co_return;
  }
}

awaitable<void> Sweep(Loop& L) {
  Timer t(L.ioc);
  for (;;) {
    t.expires_after(kSweep);
    error_code ec;
    co_await t.async_wait(Redirect(ec));
    if (ec) co_return;
    L.now = L.clock.Now();
    // Check() may not erase; copying keeps the walk safe and is cheap next
    // to the sweep interval.
    std::vector<Deadline*> all(L.deadlines.begin(), L.deadlines.end());
    for (Deadline* d : all) d->Check(L.now);
  }
}

struct Router::Impl {
  Impl(RouterConfig c, common::Clock& clk) : config(std::move(c)), clock(clk) {}

  RouterConfig config;
  common::Clock& clock;
  std::vector<std::unique_ptr<Loop>> loops;
  std::unique_ptr<common::HttpServer> admin;
  uint16_t port = 0;

  mutable std::mutex routes_mu;
  std::shared_ptr<ssl::context> probe_tls;   // guarded by routes_mu; the prober's upstream_tls
  std::shared_ptr<const RouteTable> routes;  // guarded by routes_mu
  std::atomic<uint64_t> routes_gen{0};

  std::shared_ptr<const TenantSet> tenants;  // as last published to the loops
  std::mutex suspects_mu;
  std::vector<std::string> suspects;  // guarded by suspects_mu

  // The prober: its own loop and thread.
  net::io_context probe_ioc{1};
  std::thread probe_thread;
  std::unordered_map<std::string, Health> probe_state;  // prober thread only
  std::unordered_set<std::string> probe_wanted;         // prober thread only
  std::atomic<uint64_t> probes{0}, probe_hangs{0}, probe_downs{0};

  // --- start-up ---
  absl::Status Listen();
  absl::StatusOr<std::shared_ptr<ssl::context>> MakeTls(const RouterConfig& c);
  absl::StatusOr<std::shared_ptr<ssl::context>> MakeUpstreamTls(const RouterConfig& c);
  // The name an upstream's certificate must carry: upstream_server_name, or
  // the upstream's own IP.
  std::string UpstreamTlsName(const std::string& host) const {
    return config.upstream_server_name.empty() ? host : config.upstream_server_name;
  }

  // --- per-loop request path ---
  awaitable<void> Accept(Loop& L);
  template <class Stream>
  awaitable<void> Serve(Loop& L, Stream& client, Deadline& lowest, std::string peer_ip);
  struct ClientConn;
  template <class Stream>
  awaitable<bool> Handle(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                         RequestParser<http::buffer_body>& p);
  struct Forwarded;
  template <class Stream>
  awaitable<void> Forward(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                          RequestParser<http::buffer_body>& p, UpstreamState& up,
                          const std::string& body, bool body_complete, Framing up_framing,
                          bool keep_alive, Forwarded& out);
  UpstreamState& Upstream(Loop& L, const Upstream& u);
  void RefreshRoutes(Loop& L);
  void ConnectionFailed(Loop& L, UpstreamState& up);
  void SetHealth(Loop& L, const std::string& address, Health h);

  // --- prober ---
  awaitable<void> ProbeLoop();
  awaitable<void> Probe(std::string address);
  void Broadcast(const std::string& address, Health h);

  std::string Metrics() const;
};

// ---------------------------------------------------------------------------
// Start-up

// Loads a certificate chain and its key into `ctx`; errors name the config
// fields (`section`.cert, `section`.key).
absl::Status UseCertificate(ssl::context& ctx, const std::string& cert, const std::string& key,
                            const char* section) {
  error_code ec;
  ctx.use_certificate_chain_file(cert, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(section, ".cert: ", cert, ": ", ec.message()));
  ctx.use_private_key_file(key, ssl::context::pem, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(section, ".key: ", key, ": ", ec.message()));
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(section, ".key: does not match ", section, ".cert"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ssl::context>> Router::Impl::MakeTls(const RouterConfig& c) {
  if (c.tls_cert.empty()) return std::shared_ptr<ssl::context>();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::single_dh_use);
  if (absl::Status s = UseCertificate(*ctx, c.tls_cert, c.tls_key, "tls"); !s.ok()) return s;
  return ctx;
}

absl::StatusOr<std::shared_ptr<ssl::context>> Router::Impl::MakeUpstreamTls(const RouterConfig& c) {
  if (c.upstream_ca.empty()) return std::shared_ptr<ssl::context>();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  error_code ec;
  ctx->load_verify_file(c.upstream_ca, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("upstream_tls.ca: ", c.upstream_ca, ": ", ec.message()));
  }
  ctx->set_verify_mode(ssl::verify_peer);
  if (!c.upstream_cert.empty()) {
    absl::Status s = UseCertificate(*ctx, c.upstream_cert, c.upstream_key, "upstream_tls");
    if (!s.ok()) return s;
  }
  return ctx;
}

absl::Status Router::Impl::Listen() {
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

Router::Router(RouterConfig config, common::Clock* clock)
    : impl_(std::make_unique<Impl>(std::move(config), *clock)) {}
Router::~Router() { Stop(); }

absl::Status Router::Start() {
  Impl& I = *impl_;
  int threads = I.config.threads > 0
                    ? I.config.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto tls = I.MakeTls(I.config);
  if (!tls.ok()) return tls.status();
  auto upstream_tls = I.MakeUpstreamTls(I.config);
  if (!upstream_tls.ok()) return upstream_tls.status();
  I.probe_tls = *upstream_tls;
  I.tenants = TenantSet::Build(I.config.tenants, nullptr);
  if (!I.tenants->auth_required()) {
    spdlog::warn("router: no tenants configured: requests need no API key and reach every stream");
  }
  for (int i = 0; i < threads; ++i) {
    auto L = std::make_unique<Loop>(I.clock, I.config);
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
      {.address = I.config.admin.host, .port = I.config.admin.port},
      [this](const common::HttpRequest& r) -> common::HttpResponse {
        if (r.path == "/metrics") {
          return {200, "text/plain; version=0.0.4; charset=utf-8", MetricsText(), {}};
        }
        if (r.path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n", {}};
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
    net::co_spawn(lp->ioc, I.Accept(*lp), net::detached);
    net::co_spawn(lp->ioc, Sweep(*lp), net::detached);
    lp->thread = std::thread([lp] { lp->ioc.run(); });
  }
  if (I.config.probe_interval.count() > 0) {
    net::co_spawn(I.probe_ioc, I.ProbeLoop(), net::detached);
    I.probe_thread = std::thread([&I] { I.probe_ioc.run(); });
  }
  spdlog::info("router: {} loop(s) on {}:{}{}, admin on {}:{}", threads, I.config.listen.host,
               I.port, I.loops[0]->tls ? " (TLS)" : "", I.config.admin.host, I.admin->port());
  return absl::OkStatus();
}

void Router::Stop() {
  if (!impl_) return;
  Impl& I = *impl_;
  I.probe_ioc.stop();
  if (I.probe_thread.joinable()) I.probe_thread.join();
  for (auto& L : I.loops) L->ioc.stop();
  for (auto& L : I.loops) {
    if (L->thread.joinable()) L->thread.join();
  }
  if (I.admin) I.admin->Stop();
}

uint16_t Router::port() const { return impl_->port; }
uint16_t Router::admin_port() const { return impl_->admin ? impl_->admin->port() : 0; }

absl::Status Router::SetRoutes(std::shared_ptr<const RouteTable> table) {
  {
    std::lock_guard<std::mutex> lock(impl_->routes_mu);
    const RouteTable* held = impl_->routes.get();
    if (held != nullptr &&
        (table->epoch() < held->epoch() ||
         (table->epoch() == held->epoch() && table->version() < held->version()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale route snapshot: version ", table->version(), " epoch ", table->epoch(),
          " is older than the held version ", held->version(), " epoch ", held->epoch()));
    }
    impl_->routes = std::move(table);
  }
  impl_->routes_gen.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

std::shared_ptr<const RouteTable> Router::routes() const {
  std::lock_guard<std::mutex> lock(impl_->routes_mu);
  return impl_->routes;
}

absl::Status Router::Reload(const RouterConfig& config) {
  Impl& I = *impl_;
  auto tls = I.MakeTls(config);
  if (!tls.ok()) return tls.status();
  if (I.loops.empty()) return absl::FailedPreconditionError("router not started");
  if (static_cast<bool>(*tls) != static_cast<bool>(I.loops[0]->tls)) {
    return absl::InvalidArgumentError("tls: turning TLS on or off needs a restart");
  }
  auto upstream_tls = I.MakeUpstreamTls(config);
  if (!upstream_tls.ok()) return upstream_tls.status();
  if (config.upstream_server_name != I.config.upstream_server_name ||
      static_cast<bool>(*upstream_tls) != static_cast<bool>(I.loops[0]->upstream_tls)) {
    return absl::InvalidArgumentError(
        "upstream_tls: turning it on or off, or a new server_name, needs a restart");
  }
  {
    std::lock_guard<std::mutex> lock(I.routes_mu);
    I.probe_tls = *upstream_tls;
  }
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
  std::lock_guard<std::mutex> lock(impl_->suspects_mu);
  return std::exchange(impl_->suspects, {});
}

// ---------------------------------------------------------------------------
// Loop-local state

void Router::Impl::RefreshRoutes(Loop& L) {
  uint64_t gen = routes_gen.load(std::memory_order_acquire);
  if (gen == L.routes_gen) return;
  std::lock_guard<std::mutex> lock(routes_mu);
  L.routes = routes;
  L.routes_gen = gen;
}

UpstreamState& Router::Impl::Upstream(Loop& L, const router::Upstream& u) {
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

void Router::Impl::ConnectionFailed(Loop& L, UpstreamState& up) {
  up.UpstreamHealth::ConnectionFailed(clock.Now());
  up.idle.clear();
  Inc(L.stats.ejections);
  std::lock_guard<std::mutex> lock(suspects_mu);
  if (suspects.size() < 1024) suspects.push_back(up.node);
}

void Router::Impl::SetHealth(Loop& L, const std::string& address, Health h) {
  auto it = L.upstreams.find(address);
  if (it == L.upstreams.end()) return;
  UpstreamState& up = *it->second;
  up.SetHealth(h);
  if (h == Health::kUp) return;
  // Down or hung: requests waiting on it are re-sent to their standby now.
  for (UpConn& c : up.waiting) {
    c.hung_cancel = true;
    error_code ec;
    c.s.cancel(ec);
  }
  up.idle.clear();
}

// ---------------------------------------------------------------------------
// Accept and serve

awaitable<void> Router::Impl::Accept(Loop& L) {
  for (;;) {
    error_code ec;
    Socket sock = co_await L.acceptor->async_accept(L.ioc.get_executor(), Redirect(ec));
    if (ec) {
      if (ec == net::error::operation_aborted) co_return;
      spdlog::warn("router: accept: {}", ec.message());
      continue;
    }
    Inc(L.stats.connections);
    sock.set_option(tcp::no_delay(true), ec);
    std::string peer_ip = sock.remote_endpoint(ec).address().to_string();
    if (!L.tls) {
      net::co_spawn(
          L.ioc,
          [this, &L, s = std::move(sock),
           peer_ip = std::move(peer_ip)]() mutable -> awaitable<void> {
            Deadline d(L, s);
            co_await Serve(L, s, d, std::move(peer_ip));
          },
          net::detached);
    } else {
      net::co_spawn(
          L.ioc,
          [this, &L, ctx = L.tls, s = beast::ssl_stream<Socket>(std::move(sock), *L.tls),
           peer_ip = std::move(peer_ip)]() mutable -> awaitable<void> {
            Deadline d(L, beast::get_lowest_layer(s));
            error_code hec;
            d.Arm(config.limits.header_timeout);
            co_await s.async_handshake(ssl::stream_base::server, Redirect(hec));
            if (hec) {
              Inc(L.stats.tls_handshake_failures);
              co_return;
            }
            co_await Serve(L, s, d, std::move(peer_ip));
            d.Arm(milliseconds(1000));
            co_await s.async_shutdown(Redirect(hec));
          },
          net::detached);
    }
  }
}

// What one client connection keeps from one request to the next.
struct Router::Impl::ClientConn {
  beast::flat_buffer buf;  // bytes read from the client, not yet parsed
  std::string peer_ip;
  KeyCache key_cache;  // the last API key's tenant
  // Keep their capacity: no allocation per request.
  std::string head;     // the head sent upstream
  std::string pending;  // the answer for the client, before it is written
  // The request's and the response's header fields are allocated from here
  // (an arena per request over this storage, spilling to the heap).
  alignas(std::max_align_t) std::array<char, 2048> field_storage;
  std::pmr::memory_resource* fields = nullptr;  // the current request's arena
};

template <class Stream>
awaitable<void> Router::Impl::Serve(Loop& L, Stream& client, Deadline& lowest,
                                    std::string peer_ip) {
  ClientConn cc;
  cc.peer_ip = std::move(peer_ip);
  beast::flat_buffer& buf = cc.buf;
  for (bool first = true;; first = false) {
    error_code ec;
    if (!first && buf.size() == 0) {
      // Between requests: the idle timeout. The head itself then gets the
      // (shorter) header timeout, against slowloris.
      lowest.Arm(config.limits.idle_timeout);
      size_t n = co_await client.async_read_some(buf.prepare(4096), Redirect(ec));
      if (ec) co_return;
      buf.commit(n);
    }
    std::pmr::monotonic_buffer_resource arena(cc.field_storage.data(), cc.field_storage.size());
    cc.fields = &arena;
    RequestParser<http::buffer_body> p(std::piecewise_construct, std::make_tuple(),
                                       std::make_tuple(Fields::allocator_type(&arena)));
    p.header_limit(static_cast<uint32_t>(config.limits.max_header_bytes));
    p.body_limit(config.limits.max_body_bytes);
    lowest.Arm(config.limits.header_timeout);
    while (!ec && !p.is_header_done()) {
      if (ParseBuffered(buf, p, ec)) continue;
      size_t got = co_await client.async_read_some(buf.prepare(kReadAhead), Redirect(ec));
      AfterRead(buf, p, got, ec);
    }
    if (ec) {
      if (ec == http::error::end_of_stream || lowest.expired() || ec == net::error::eof ||
          ec == net::error::connection_reset || ec == net::error::operation_aborted ||
          buf.size() == 0) {
        co_return;  // closed, reset or silent: nothing to answer
      }
      Reason r = ec == http::error::header_limit ? Reason::kHeaderTooLarge
                 : ec == http::error::body_limit ? Reason::kBodyTooLarge
                                                 : Reason::kBadRequest;
      Inc(L.stats.router_answers[static_cast<size_t>(r)]);
      std::string detail =
          r == Reason::kBodyTooLarge
              ? absl::StrCat("Content-Length over ", config.limits.max_body_bytes, " bytes")
          : r == Reason::kHeaderTooLarge
              ? absl::StrCat("request head over ", config.limits.max_header_bytes, " bytes")
              : absl::StrCat("malformed request: ", ec.message());
      std::string out = ErrorResponse(r, detail, "", 0, /*keep_alive=*/false);
      lowest.Arm(milliseconds(1000));
      co_await net::async_write(client, net::buffer(out), Redirect(ec));
      co_return;
    }
    bool keep = co_await Handle(L, client, lowest, cc, p);
    if (!keep) co_return;
    // A large chunked answer grew them: an idle connection keeps no more.
    if (cc.pending.capacity() > 4096) std::string().swap(cc.pending);
  }
}

struct Router::Impl::Forwarded {
  bool started = false;        // the response head went to the client
  bool client_gone = false;    // the client vanished; close quietly
  bool body_consumed = false;  // the request body was streamed and cannot be re-sent
  bool retryable = false;      // failed before the response started
  bool timeout = false;
  bool hung = false;          // cancelled because the prober judged the upstream hung
  bool close_client = false;  // the response could not be completed
  std::string why;
};

template <class Stream>
awaitable<bool> Router::Impl::Handle(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                                     RequestParser<http::buffer_body>& p) {
  beast::flat_buffer& buf = cc.buf;
  Inc(L.stats.requests);
  auto& req = p.get();
  bool keep_alive = req.keep_alive();
  std::string stream_id;
  error_code ec;

  // Every early answer goes through here: counted, written, done.
  auto answer = [&](Reason r, std::string detail, int retry_after = 0) -> awaitable<bool> {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    // An unread request body would be taken for the next request: close.
    bool keep = keep_alive && p.is_done();
    std::string out = ErrorResponse(r, detail, stream_id, retry_after, keep);
    error_code wec;
    lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(out), Redirect(wec));
    co_return keep && !wec;
  };

  size_t fields = 0;
  for (auto it = req.begin(); it != req.end(); ++it) ++fields;
  if (fields > config.limits.max_headers) {
    keep_alive = false;
    co_return co_await answer(
        Reason::kTooManyHeaders,
        absl::StrCat(fields, " header fields; the limit is ", config.limits.max_headers));
  }

  auto refuse = [&](Refusal r) { return answer(r.reason, std::move(r.detail), r.retry_after_s); };

  // Tenant.
  Identity who = Identify(*L.tenants, ApiKey(req), &cc.key_cache);
  if (!who.tenant) co_return co_await refuse(std::move(*who.refusal));
  std::shared_ptr<Tenant> tenant = std::move(who.tenant);

  // Route.
  auto hv = req["x-gpuha-stream"];
  auto target = req.target();
  StreamRef ref = ExtractStream(std::string_view(hv.data(), hv.size()),
                                std::string_view(target.data(), target.size()));
  if (ref.bad) {
    co_return co_await answer(Reason::kBadStream,
                              "stream id must be 1-128 of [A-Za-z0-9._:-], and the header and "
                              "path must agree");
  }
  stream_id = ref.stream;
  RefreshRoutes(L);
  std::shared_ptr<const RouteTable> routes = L.routes;  // this request's version
  UpstreamOrder<UpstreamState> order;
  const RouteEntry* e = nullptr;  // the stream's route, if it names one
  const TimePoint now = clock.Now();
  if (!stream_id.empty()) {
    e = routes ? routes->Find(stream_id) : nullptr;
    // Another tenant's stream is "unknown": its existence does not leak.
    if (e == nullptr || (L.tenants->auth_required() && e->tenant != tenant->name)) {
      co_return co_await answer(Reason::kUnknownStream, "no such stream");
    }
    if (e->primary.empty()) {
      co_return co_await answer(Reason::kNoCapacity,
                                "the stream is not placed: the cluster is over capacity", 1);
    }
    UpstreamState* primary = &Upstream(L, e->primary);
    UpstreamState* standby = e->standby.empty() ? nullptr : &Upstream(L, e->standby);
    bool stuck = L.sticky.Stuck(stream_id, e->primary.address, e->standby.address,
                                primary->usable(now), now);
    order = StreamOrder(primary, standby, stuck, now);
  } else {
    const std::vector<router::Upstream>& nodes =
        routes ? routes->TenantNodes(tenant->name) : std::vector<router::Upstream>{};
    if (nodes.empty()) {
      co_return co_await answer(Reason::kNoCapacity, "the tenant has no active node", 1);
    }
    // Least loaded first (in this loop), round-robin among equals.
    size_t start = L.round_robin++ % nodes.size();
    for (size_t i = 0; i < nodes.size(); ++i)
      order.push_back(&Upstream(L, nodes[(start + i) % nodes.size()]));
    LeastLoaded(order, now);
  }
  DropUnfit(order, now);
  if (order.empty()) {
    co_return co_await answer(Reason::kNoUpstream, "every upstream of the stream is down or hung",
                              1);
  }

  // Tenant limits.
  if (std::optional<Refusal> r = CheckRate(*tenant, now)) co_return co_await refuse(std::move(*r));
  QuotaSlot quota(*tenant);
  if (quota.over()) co_return co_await refuse(QuotaSlot::Refused());

  // Body: buffered up to the retry buffer, so it can be re-sent.
  if (req[http::field::expect] == "100-continue" && !p.is_done()) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(kContinue), Redirect(ec));
    if (ec) co_return false;
  }
  std::string body;
  std::unique_ptr<Chunk> chunk;
  while (!p.is_done() && body.size() < config.limits.retry_buffer_bytes) {
    if (!chunk) chunk = std::make_unique<Chunk>(L);
    req.body().data = chunk->get();
    req.body().size = kChunk;
    lowest.Arm(config.limits.body_timeout);
    co_await ReadSome(client, buf, p, ec);
    if (ec) {
      if (ec == http::error::body_limit) {
        keep_alive = false;
        co_return co_await answer(
            Reason::kBodyTooLarge,
            absl::StrCat("body over ", config.limits.max_body_bytes, " bytes"));
      }
      Inc(L.stats.client_aborts);
      co_return false;  // the client went away mid-body
    }
    body.append(chunk->get(), kChunk - req.body().size);
  }
  bool complete = p.is_done();
  Framing framing = Framing::kNone;
  uint64_t length = 0;
  if (complete) {
    if (!body.empty() || p.content_length() || p.chunked()) {
      framing = Framing::kLength;
      length = body.size();
    }
  } else if (p.content_length()) {
    framing = Framing::kLength;
    length = *p.content_length();
  } else {
    framing = Framing::kChunked;
  }

  L.retry_budget.Deposit(L.now);
  struct InFlight {
    std::atomic<int64_t>& n;
    explicit InFlight(std::atomic<int64_t>& c) : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~InFlight() { n.fetch_sub(1, std::memory_order_relaxed); }
  } in_flight(L.stats.in_flight);
  Forwarded f;
  std::string last_failure;
  bool any_timeout = false;
  for (size_t i = 0; i < order.size(); ++i) {
    UpstreamState& up = *order[i];
    if (i > 0) {
      if (f.body_consumed) break;
      if (!L.retry_budget.TryWithdraw(L.now)) {
        co_return co_await answer(Reason::kRetryBudget,
                                  absl::StrCat("retry budget exhausted after: ", last_failure), 1);
      }
      Inc(L.stats.retries);
      if (f.hung) Inc(L.stats.hung_resends);
    }
    cc.head.clear();
    AppendUpstreamHead(req, ref.target, up.address, tenant->name, stream_id, cc.peer_ip, framing,
                       length, &cc.head);
    f = Forwarded{};
    co_await Forward(L, client, lowest, cc, p, up, body, complete, framing, keep_alive, f);
    if (!f.retryable) break;
    last_failure = absl::StrCat(up.node, ": ", f.why);
    any_timeout = any_timeout || f.timeout;
    if (i == 0 && e != nullptr && order.size() > 1) {
      L.sticky.Stick(stream_id, e->primary.address, e->standby.address, clock.Now());
    }
  }
  if (f.client_gone) {
    Inc(L.stats.client_aborts);
    co_return false;
  }
  if (f.started) co_return keep_alive && !f.close_client;
  if (f.body_consumed) {
    keep_alive = false;
    co_return co_await answer(
        Reason::kNotReplayable,
        absl::StrCat("the request body was streamed past the ", config.limits.retry_buffer_bytes,
                     "-byte retry buffer and the upstream failed (", last_failure,
                     "); not retried"));
  }
  co_return co_await answer(any_timeout ? Reason::kUpstreamTimeout : Reason::kUpstreamFailed,
                            absl::StrCat("every upstream failed; last: ", last_failure));
}

template <class Stream>
awaitable<void> Router::Impl::Forward(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                                      RequestParser<http::buffer_body>& p, UpstreamState& up,
                                      const std::string& body, bool body_complete,
                                      Framing up_framing, bool keep_alive, Forwarded& out) {
  beast::flat_buffer& client_buf = cc.buf;
  const std::string& head = cc.head;
  error_code ec;
  std::unique_ptr<UpConn> conn;
  bool pooled = false;
  up.in_flight++;
  struct Dec {
    int64_t* v;
    ~Dec() { --*v; }
  } dec{&up.in_flight};

  auto fail = [&](const std::string& why, bool connection_level) {
    out.retryable = true;
    out.why = why;
    if (connection_level) ConnectionFailed(L, up);
  };

  auto& method_req = p.get();
  bool head_request = method_req.method() == http::verb::head;
  std::optional<ResponseParser<http::buffer_body>> rp;
  for (int attempt = 0;; ++attempt) {
    pooled = false;
    conn.reset();
    if (!up.idle.empty()) {
      conn = std::move(up.idle.back());
      up.idle.pop_back();
      pooled = true;
      Inc(L.stats.upstream_reuses);
    } else {
      conn = std::make_unique<UpConn>(L, L.ioc.get_executor());
      conn->deadline.Arm(config.limits.connect_timeout);
      co_await conn->s.async_connect(up.endpoint, Redirect(ec));
      Inc(L.stats.upstream_connects);
      if (ec) {
        fail(conn->deadline.expired() ? "connect timeout" : "connect: " + ec.message(), true);
        co_return;
      }
      conn->s.set_option(tcp::no_delay(true), ec);
      if (L.upstream_tls) {
        conn->tls_ctx = L.upstream_tls;
        conn->tls = std::make_unique<ssl::stream<Socket&>>(conn->s, *conn->tls_ctx);
        PrepareUpstreamTls(*conn->tls, UpstreamTlsName(up.endpoint.address().to_string()));
        co_await conn->tls->async_handshake(ssl::stream_base::client, Redirect(ec));
        if (ec) {
          fail(
              conn->deadline.expired() ? "TLS handshake timeout" : "TLS handshake: " + ec.message(),
              true);
          co_return;
        }
      }
    }
    // A pooled connection the upstream has meanwhile closed fails on write
    // or at once on read with nothing received: not the upstream's failure.
    // Re-send once on a fresh connection, if the body can be re-sent.
    // Not once the upstream has been seen failing (ejected or judged down):
    // then the stale-looking connection is its death, and the standby is next.
    const bool may_resend = pooled && attempt == 0 && body_complete;
    // Head and buffered body in one write.
    std::array<net::const_buffer, 4> bufs;
    size_t nb = 0;
    std::string chunk_head;
    bufs[nb++] = net::buffer(head);
    if (!body.empty()) {
      if (up_framing == Framing::kChunked) {
        AppendChunkHeader(body.size(), &chunk_head);
        bufs[nb++] = net::buffer(chunk_head);
        bufs[nb++] = net::buffer(body);
        bufs[nb++] = net::buffer("\r\n", 2);
      } else {
        bufs[nb++] = net::buffer(body);
      }
    }
    conn->deadline.Arm(config.limits.body_timeout);
    co_await conn->Write(std::span<const net::const_buffer>(bufs.data(), nb), ec);
    if (ec) {
      if (may_resend && up.usable(clock.Now())) {
        Inc(L.stats.stale_resends);
        continue;
      }
      fail("write: " + ec.message(), true);
      co_return;
    }

    // The rest of a large body streams through; from here it cannot be re-sent.
    if (!body_complete) {
      out.body_consumed = true;
      auto& req = p.get();
      Chunk chunk(L);
      while (!p.is_done()) {
        req.body().data = chunk.get();
        req.body().size = kChunk;
        lowest.Arm(config.limits.body_timeout);
        co_await ReadSome(client, client_buf, p, ec);
        if (ec) {
          out.client_gone = true;  // also covers body_limit mid-stream: close
          co_return;
        }
        size_t n = kChunk - req.body().size;
        if (n == 0) continue;
        std::string ch;
        std::vector<net::const_buffer> wb;
        if (up_framing == Framing::kChunked) {
          AppendChunkHeader(n, &ch);
          wb = {net::buffer(ch), net::buffer(chunk.get(), n), net::buffer("\r\n", 2)};
        } else {
          wb = {net::buffer(chunk.get(), n)};
        }
        conn->deadline.Arm(config.limits.body_timeout);
        co_await conn->Write(wb, ec);
        if (ec) {
          out.retryable = true;
          out.why = "write: " + ec.message();
          ConnectionFailed(L, up);
          co_return;
        }
      }
      if (up_framing == Framing::kChunked) {
        co_await conn->Write(net::buffer("0\r\n\r\n", 5), ec);
        if (ec) {
          fail("write: " + ec.message(), true);
          co_return;
        }
      }
    }

    // The response head: the window in which a failure is still retryable.
    for (;;) {
      rp.emplace(std::piecewise_construct, std::make_tuple(),
                 std::make_tuple(Fields::allocator_type(cc.fields)));
      rp->body_limit(std::numeric_limits<uint64_t>::max());
      if (head_request) rp->skip(true);
      conn->deadline.Arm(config.limits.response_timeout);
      up.waiting.push_back(*conn);
      while (!ec && !rp->is_header_done()) {
        if (ParseBuffered(conn->buf, *rp, ec)) continue;
        size_t got = co_await conn->async_read_some(conn->buf.prepare(kReadAhead), Redirect(ec));
        AfterRead(conn->buf, *rp, got, ec);
      }
      conn->waiting_hook.unlink();
      if (ec) break;
      int status = rp->get().result_int();
      if (status / 100 != 1 || status == 101) break;  // skip interim 1xx answers
    }
    if (!ec) break;
    if (conn->hung_cancel) {
      out.hung = true;
      fail("hung", false);  // the prober judged it; already marked
    } else if (conn->deadline.expired()) {
      out.timeout = true;
      fail(absl::StrCat("no response within ", config.limits.response_timeout.count(), " ms"),
           true);
    } else if (may_resend && up.usable(clock.Now()) && conn->buf.size() == 0 &&
               (ec == http::error::end_of_stream || ec == net::error::connection_reset)) {
      Inc(L.stats.stale_resends);
      continue;
    } else {
      fail("read: " + ec.message(), true);
    }
    co_return;
  }
  if (rp->get().result_int() == 101) {
    fail("protocol upgrades are not proxied", false);
    out.retryable = false;
    co_return;
  }

  // Relay the response. From the first byte on, the client owns the outcome.
  up.Answered();
  auto& res = rp->get();
  int status = res.result_int();
  Inc(L.stats.upstream_class[std::min(5, status / 100)]);
  Framing down = Framing::kNone;
  uint64_t len = 0;
  bool upstream_reusable = rp->keep_alive();
  if (head_request || status == 204 || status == 304) {
    if (rp->content_length()) {
      down = Framing::kLength;
      len = *rp->content_length();
    }
  } else if (rp->chunked()) {
    down = Framing::kChunked;
  } else if (rp->content_length()) {
    down = Framing::kLength;
    len = *rp->content_length();
  } else {
    down = Framing::kChunked;  // body until close: re-framed for keep-alive
    upstream_reusable = false;
  }
  bool client_keep = keep_alive;
  if (down == Framing::kChunked && method_req.version() < 11) {
    // HTTP/1.0 clients know no chunking: the body ends when we close.
    down = Framing::kNone;
    client_keep = false;
    out.close_client = true;
  }
  std::string& pending = cc.pending;
  pending.clear();
  AppendClientHead(res, down, len, client_keep, &pending);
  bool head_only = head_request || status == 204 || status == 304;
  bool ok = true;
  Chunk chunk(L);
  if (!head_only && down == Framing::kLength && rp->content_length()) {
    // A Content-Length body is relayed as raw bytes: no parser and no copy
    // into an intermediate string. The head and the body bytes that came
    // with it leave in one gather write; the rest goes socket to socket
    // through one pooled 64 KiB buffer.
    uint64_t remaining = len;
    size_t first = static_cast<size_t>(std::min<uint64_t>(remaining, conn->buf.size()));
    std::array<net::const_buffer, 2> parts = {net::buffer(pending),
                                              net::buffer(conn->buf.data().data(), first)};
    lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(client, parts, Redirect(ec));
    out.started = true;
    if (ec) {
      out.client_gone = true;
      co_return;
    }
    conn->buf.consume(first);
    remaining -= first;
    while (remaining > 0) {
      conn->deadline.Arm(config.limits.response_timeout);
      size_t n = co_await conn->async_read_some(
          net::buffer(chunk.get(), static_cast<size_t>(std::min<uint64_t>(remaining, kChunk))),
          Redirect(ec));
      if (ec) {
        ok = false;
        break;
      }
      remaining -= n;
      lowest.Arm(config.limits.body_timeout);
      co_await net::async_write(client, net::buffer(chunk.get(), n), Redirect(ec));
      if (ec) {
        out.client_gone = true;
        co_return;
      }
    }
    pending.clear();
  } else {
    while (!head_only && !rp->is_done()) {
      res.body().data = chunk.get();
      res.body().size = kChunk;
      conn->deadline.Arm(config.limits.response_timeout);
      co_await ReadSome(*conn, conn->buf, *rp, ec);
      if (ec == http::error::end_of_stream && !rp->content_length() && !rp->chunked()) {
        ec = {};  // body delimited by close: done
        break;
      }
      if (ec) {
        ok = false;
        break;
      }
      size_t n = kChunk - res.body().size;
      if (n == 0) continue;
      if (down == Framing::kChunked) {
        AppendChunkHeader(n, &pending);
        pending.append(chunk.get(), n);
        pending.append("\r\n");
      } else {
        pending.append(chunk.get(), n);
      }
      if (pending.size() >= kChunk || rp->is_done()) {
        lowest.Arm(config.limits.body_timeout);
        co_await net::async_write(client, net::buffer(pending), Redirect(ec));
        out.started = true;
        pending.clear();
        if (ec) {
          out.client_gone = true;
          co_return;
        }
      }
    }
    if (ok && down == Framing::kChunked && !head_only) pending.append("0\r\n\r\n");
    if (!pending.empty()) {
      lowest.Arm(config.limits.body_timeout);
      co_await net::async_write(client, net::buffer(pending), Redirect(ec));
      out.started = true;
      if (ec) {
        out.client_gone = true;
        co_return;
      }
    }
  }
  out.started = true;
  if (!ok) {
    // The upstream broke mid-response: the only honest signal left is to
    // close the client connection before the body completes.
    Inc(L.stats.upstream_aborts);
    out.close_client = true;
    ConnectionFailed(L, up);
    co_return;
  }
  if (upstream_reusable && up.idle.size() < kMaxIdlePerUpstream && up.health() == Health::kUp) {
    conn->deadline.Disarm();
    up.idle.push_back(std::move(conn));
  }
}

// ---------------------------------------------------------------------------
// Prober: a GET to every upstream every probe_interval on one kept-alive
// connection each. No answer within hang_after: hung. Refused: down.

void Router::Impl::Broadcast(const std::string& address, Health h) {
  for (auto& L : loops) {
    net::post(L->ioc, [this, lp = L.get(), address, h] { SetHealth(*lp, address, h); });
  }
}

awaitable<void> Router::Impl::Probe(std::string address) {
  auto hp = common::ParseHostPort(address, "upstream");
  error_code ec;
  if (!hp.ok()) co_return;
  auto a = net::ip::make_address(hp->host, ec);
  if (ec) co_return;
  tcp::endpoint ep(a, hp->port);
  auto ex = co_await net::this_coro::executor;
  std::unique_ptr<beast::tcp_stream> s;
  std::shared_ptr<ssl::context> tls_ctx;
  std::unique_ptr<ssl::stream<beast::tcp_stream&>> tls;  // over *s with upstream_tls
  auto close = [&] {
    tls.reset();
    s.reset();
  };
  beast::flat_buffer buf;
  std::string request = absl::StrCat("GET ", config.probe_path, " HTTP/1.1\r\nHost: ", address,
                                     "\r\nUser-Agent: gpuha-router-probe\r\n\r\n");
  Timer tick(ex);
  auto set = [&](Health h) {
    Health& cur = probe_state[address];
    if (cur == h) return;
    cur = h;
    if (h == Health::kHung) probe_hangs++;
    if (h == Health::kDown) probe_downs++;
    spdlog::warn("router: upstream {} is {}", address,
                 h == Health::kUp     ? "up"
                 : h == Health::kDown ? "down (refused)"
                                      : "hung (no answer)");
    Broadcast(address, h);
  };
  for (;;) {
    if (!probe_wanted.count(address)) {  // no longer in the routes
      // Its verdict goes with it: an upstream that returns to the routes
      // starts clean (its next probe starts from "up" and is only broadcast
      // when it differs).
      if (probe_state[address] != Health::kUp) Broadcast(address, Health::kUp);
      probe_state.erase(address);
      co_return;
    }
    auto started = Clock::now();
    if (!s) {
      s = std::make_unique<beast::tcp_stream>(ex);
      s->expires_after(config.hang_after);
      co_await s->async_connect(ep, Redirect(ec));
      {
        std::lock_guard<std::mutex> lock(routes_mu);
        tls_ctx = probe_tls;
      }
      if (!ec && tls_ctx) {
        tls = std::make_unique<ssl::stream<beast::tcp_stream&>>(*s, *tls_ctx);
        PrepareUpstreamTls(*tls, UpstreamTlsName(hp->host));
        co_await tls->async_handshake(ssl::stream_base::client, Redirect(ec));
        if (ec && ec != beast::error::timeout) {
          spdlog::warn("router: probe of {}: TLS handshake: {}", address, ec.message());
        }
      }
      if (ec) {
        close();
        set(ec == beast::error::timeout ? Health::kHung : Health::kDown);
      }
    }
    if (s) {
      s->expires_after(config.hang_after -
                       std::chrono::duration_cast<milliseconds>(Clock::now() - started));
      // (Plain if/else: GCC 12 mishandles co_await on a conditional expression.)
      if (tls) {
        co_await net::async_write(*tls, net::buffer(request), Redirect(ec));
      } else {
        co_await net::async_write(*s, net::buffer(request), Redirect(ec));
      }
      http::response_parser<http::string_body> rp;
      rp.body_limit(64 * 1024);
      if (!ec) {
        if (tls) {
          co_await http::async_read(*tls, buf, rp, Redirect(ec));
        } else {
          co_await http::async_read(*s, buf, rp, Redirect(ec));
        }
      }
      probes++;
      if (ec) {
        // A probe connection the upstream closed is not a verdict; a silent
        // one is.
        bool silent = ec == beast::error::timeout;
        close();
        buf.clear();
        if (silent) set(Health::kHung);
      } else {
        set(Health::kUp);  // any answer at all: the server is alive
        if (!rp.keep_alive()) close();
      }
    }
    tick.expires_at(started + config.probe_interval);
    co_await tick.async_wait(Redirect(ec));
  }
}

awaitable<void> Router::Impl::ProbeLoop() {
  auto ex = co_await net::this_coro::executor;
  Timer t(ex);
  for (;;) {
    // One scan of the routes per tick; each probe checks the set, not the table.
    probe_wanted.clear();
    {
      std::lock_guard<std::mutex> lock(routes_mu);
      if (routes) {
        for (const auto& u : routes->upstreams()) probe_wanted.insert(u.address);
      }
    }
    for (const std::string& a : probe_wanted) {
      // probe_state holds exactly the addresses with a running probe.
      if (probe_state.emplace(a, Health::kUp).second) net::co_spawn(ex, Probe(a), net::detached);
    }
    t.expires_after(milliseconds(100));
    error_code ec;
    co_await t.async_wait(Redirect(ec));
  }
}

// ---------------------------------------------------------------------------
// Metrics

std::string Router::MetricsText() const { return impl_->Metrics(); }

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
  p.Family("gpuha_router_probes_total", "counter", "Upstream liveness probes answered or failed.");
  p.Sample("gpuha_router_probes_total", {}, double(probes.load()));
  p.Family("gpuha_router_probe_verdicts_total", "counter", "Upstreams judged hung or down.");
  p.Sample("gpuha_router_probe_verdicts_total", {{"verdict", "hung"}}, double(probe_hangs.load()));
  p.Sample("gpuha_router_probe_verdicts_total", {{"verdict", "down"}}, double(probe_downs.load()));
  std::shared_ptr<const RouteTable> t;
  {
    std::lock_guard<std::mutex> lock(routes_mu);
    t = routes;
  }
  p.Family("gpuha_router_route_version", "gauge", "Route table version in use.");
  p.Sample("gpuha_router_route_version", {}, double(t ? t->version() : 0));
  p.Family("gpuha_router_routes", "gauge", "Streams in the route table.");
  p.Sample("gpuha_router_routes", {}, double(t ? t->size() : 0));
  return p.str();
}

}  // namespace gpuha::router
