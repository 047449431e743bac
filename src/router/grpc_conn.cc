// The router's HTTP/2 client side: one client connection (H2Server over the
// socket) and each gRPC call on it, routed and failed over as an HTTP/1.1
// request is (client_conn.cc), with gRPC statuses for the router's own
// answers.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "router/client_conn.h"
#include "router/h2_upstream.h"

namespace gpuha::router {
namespace {

// What a client connection's reader, writer and calls share.
struct H2ClientConn {
  H2ClientConn(Loop& L, const H2Limits& limits, H2Server::OnRequest on_request,
               H2Server::OnRequest on_headers)
      : h2(limits, std::move(on_request), std::move(on_headers)), wake(L.ioc), writer_done(L.ioc) {}
  H2Server h2;
  Timer wake;         // the writer waits on it for bytes to send
  Timer writer_done;  // the reader waits on it for the writer to end
  bool closed = false;
  bool writer_running = false;
  int calls = 0;  // calls being worked on (a reset stream's call ends soon after)
  std::string peer_ip;
  KeyCache key_cache;
  // Wakes the writer: the session has something to send.
  void Kick() { wake.cancel(); }
};

constexpr std::string_view kModelStreamInfer = "/inference.GRPCInferenceService/ModelStreamInfer";

H2Limits LimitsOf(const RouterConfig& c) {
  H2Limits l;
  l.max_concurrent_streams = c.limits.h2_max_concurrent_streams;
  l.max_header_list_bytes = c.limits.max_header_bytes;
  l.max_headers = c.limits.max_headers;
  // A call's request is re-sent whole to the standby: it is held whole.
  l.max_request_bytes = c.limits.retry_buffer_bytes;
  return l;
}

bool Forwardable(std::string_view name) {
  if (name.empty() || name[0] == ':') return false;
  for (std::string_view drop : {"authorization", "x-api-key", "te", "grpc-timeout", "host",
                                "x-gpuha-tenant", "x-forwarded-for"}) {
    if (name == drop) return false;
  }
  return !IsHopByHop(name);
}

bool Relayable(std::string_view name) { return name == ":status" || !IsHopByHop(name); }

// One gRPC call, from its whole request to its whole answer.
awaitable<void> HandleCall(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  struct Count {
    int& n;
    ~Count() { --n; }
  } count{conn->calls};  // counted when it was spawned
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.requests);
  Inc(L.stats.grpc_calls);
  const TimePoint started = L.clock.Now();
  const H2Headers request = std::move(s->headers);
  const std::string body = std::move(s->body);
  std::string tenant_name;
  int status_for_latency = 200;
  int attempts = 0;
  struct Observe {
    Loop& L;
    std::string& tenant;
    int& status;
    int& attempts;
    TimePoint started;
    ~Observe() {
      const common::Duration took = L.clock.Now() - started;
      L.latency.Observe(tenant, status, took);
      if (attempts > 0) L.requests.Request(attempts, took);
    }
  } observe{L, tenant_name, status_for_latency, attempts, started};

  auto answer = [&](Reason r, const std::string& detail) {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    status_for_latency = ReasonStatus(r);
    if (conn->closed) return;
    conn->h2.RespondGrpcError(id, ReasonGrpcCode(r), detail);
    conn->Kick();
  };
  const std::string_view content_type = H2Find(request, "content-type");
  const std::string path(H2Find(request, ":path"));
  if (content_type.substr(0, 16) != "application/grpc") {
    // HTTP/2 carries gRPC here; REST goes over HTTP/1.1 on the same port.
    Inc(L.stats.router_answers[static_cast<size_t>(Reason::kNotImplemented)]);
    status_for_latency = 415;
    conn->h2.Respond(id, {{":status", "415"}, {"content-type", "application/json"}},
                     ErrorBody(Reason::kNotImplemented,
                               "HTTP/2 here carries gRPC (content-type application/grpc); send "
                               "the REST protocol over HTTP/1.1 on this port",
                               ""),
                     {});
    conn->Kick();
    co_return;
  }
  if (H2Find(request, ":method") != "POST" || path.empty() || path[0] != '/') {
    answer(Reason::kBadRequest, "a gRPC call is a POST to /package.Service/Method");
    co_return;
  }
  std::chrono::milliseconds timeout = config.limits.response_timeout;
  bool client_deadline = false;
  if (std::string_view t = H2Find(request, "grpc-timeout"); !t.empty()) {
    absl::StatusOr<std::chrono::milliseconds> parsed = ParseGrpcTimeout(t);
    if (!parsed.ok()) {
      answer(Reason::kBadRequest, std::string(parsed.status().message()));
      co_return;
    }
    // Up to a day: a longer one is no deadline in practice, and a steady
    // clock's time point holds only about 292 years of nanoseconds.
    timeout = std::min<std::chrono::milliseconds>(*parsed, std::chrono::hours(24));
    client_deadline = true;
  }
  const Clock::time_point deadline = Clock::now() + timeout;

  // Tenant, by the call's metadata.
  Identity who =
      Identify(*L.tenants, ApiKeyOf(H2Find(request, "authorization"), H2Find(request, "x-api-key")),
               &conn->key_cache);
  if (!who.tenant) {
    answer(who.refusal->reason, who.refusal->detail);
    co_return;
  }
  std::shared_ptr<Tenant> tenant = std::move(who.tenant);
  tenant_name = tenant->name;

  // Stream, by the x-gpuha-stream metadata.
  StreamRef ref = ExtractStream(H2Find(request, "x-gpuha-stream"), path);
  if (ref.bad) {
    answer(Reason::kBadStream, "x-gpuha-stream must be 1-128 of [A-Za-z0-9._:-]");
    co_return;
  }
  if (ref.stream.empty()) ref.stream = tenant->default_stream;
  if (ref.stream.empty()) {
    answer(Reason::kNoStream, "the call names no stream: send x-gpuha-stream metadata");
    co_return;
  }
  const std::string stream_id = ref.stream;
  RefreshRoutes(L);
  std::shared_ptr<const RouteTable> routes = L.routes;
  UpstreamOrder<UpstreamState> order;
  const RouteEntry* e = nullptr;
  if (std::optional<Refusal> r =
          ChooseUpstreams(L, routes.get(), *tenant, stream_id, L.clock.Now(), &order, &e)) {
    answer(r->reason, r->detail);
    co_return;
  }
  if (std::optional<Refusal> r = CheckRate(*tenant, L.clock.Now())) {
    answer(r->reason, r->detail);
    co_return;
  }
  QuotaSlot quota(*tenant);
  if (quota.over()) {
    answer(Reason::kOverQuota, QuotaSlot::Refused().detail);
    co_return;
  }
  // Each upstream's gRPC address comes with the route (its HTTP one keys
  // the upstream's policy state, which both protocols share).
  for (UpstreamState* up : order) {
    const Upstream& u = up->address == e->primary.address ? e->primary : e->standby;
    if (u.grpc_address == up->grpc_address) continue;
    DropH2(*up);
    up->grpc_address = u.grpc_address;
    up->grpc_endpoint = {};
    if (auto hp = common::ParseHostPort(u.grpc_address, "grpc"); hp.ok()) {
      error_code ec;
      auto a = net::ip::make_address(hp->host, ec);
      if (!ec) up->grpc_endpoint = tcp::endpoint(a, hp->port);
    }
  }

  L.retry_budget.Deposit(L.now);
  struct InFlight {
    std::atomic<int64_t>& n;
    explicit InFlight(std::atomic<int64_t>& c) : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~InFlight() { n.fetch_sub(1, std::memory_order_relaxed); }
  } in_flight(L.stats.in_flight);
  std::string last_failure;
  bool hung = false, unavailable = false;
  for (size_t i = 0; i < order.size(); ++i) {
    UpstreamState& up = *order[i];
    if (i > 0) {
      if (!L.retry_budget.TryWithdraw(L.now)) {
        answer(Reason::kRetryBudget, absl::StrCat("retry budget exhausted after: ", last_failure));
        co_return;
      }
      Inc(L.stats.retries);
      if (hung) Inc(L.stats.hung_resends);
      if (unavailable) Inc(L.stats.retries_5xx);
    }
    hung = unavailable = false;
    if (up.grpc_endpoint.port() == 0) {
      last_failure =
          absl::StrCat(up.node, ": serves no gRPC (the route gives it no IP:PORT for gRPC)");
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    H2Headers out = {{":method", "POST"},
                     {":scheme", "http"},
                     {":authority", up.grpc_address},
                     {":path", path},
                     {"te", "trailers"}};
    if (client_deadline) out.emplace_back("grpc-timeout", FormatGrpcTimeout(left));
    for (const auto& [n, v] : request) {
      if (Forwardable(n)) out.emplace_back(n, v);
    }
    out.emplace_back("x-gpuha-tenant", tenant->name);
    out.emplace_back("x-forwarded-for", conn->peer_ip);
    attempts = static_cast<int>(i + 1);
    H2Call call(L);
    // The client's reset (or its connection's end) ends the call here and
    // upstream. The hook goes with the call, however this frame ends.
    H2Stream* cs = conn->h2.Find(id);
    if (cs == nullptr) co_return;
    cs->on_close = [&call] { call.ClientGone(); };
    struct Unhook {
      H2ClientConn& c;
      int32_t id;
      ~Unhook() {
        if (H2Stream* s = c.h2.Find(id)) s->on_close = nullptr;
      }
    } unhook{*conn, id};
    co_await H2Send(L, up, out, body, std::min(deadline, now + config.limits.response_timeout),
                    call);
    if (call.client_gone || conn->closed) {
      Inc(L.stats.client_aborts);
      co_return;
    }
    if (call.response_too_large) {
      answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
      co_return;
    }
    if (call.failed) {
      last_failure = absl::StrCat(up.node, ": ", call.why);
      hung = call.hung_cancel;
      if (call.timed_out && client_deadline && Clock::now() >= deadline) break;
      if (i == 0 && order.size() > 1) {
        L.sticky.Stick(stream_id, e->primary.address, e->standby.address, L.clock.Now());
      }
      continue;
    }
    const std::string_view status = H2Find(call.headers, ":status");
    if (status != "200") {
      UpstreamAnswered(L, up, true, call.answered_at, call.answered_at - call.waiting_since);
      last_failure = absl::StrCat(up.node, ": answered HTTP status ", std::string(status));
      continue;
    }
    // A Trailers-Only answer carries its status in the headers.
    std::string_view grpc_status = H2Find(call.trailers, "grpc-status");
    if (grpc_status.empty()) grpc_status = H2Find(call.headers, "grpc-status");
    Inc(L.stats.upstream_class[2]);
    const bool server_error =
        grpc_status == "2" || grpc_status == "13" || grpc_status == "14" || grpc_status == "15";
    UpstreamAnswered(L, up, server_error, call.answered_at, call.answered_at - call.waiting_since);
    // UNAVAILABLE is gRPC's "safe to retry", and CANCELLED from an upstream
    // (the router cancelled nothing) is a server going away: the standby is
    // asked, as a 503 is re-sent.
    if ((grpc_status == "14" || grpc_status == "1") && config.retry_5xx && i + 1 < order.size()) {
      unavailable = true;
      last_failure = absl::StrCat(
          up.node, ": UNAVAILABLE: ", std::string(H2Find(call.trailers, "grpc-message")),
          std::string(H2Find(call.headers, "grpc-message")));
      continue;
    }
    H2Headers head;
    for (auto& [n, v] : call.headers) {
      if (Relayable(n)) head.emplace_back(std::move(n), std::move(v));
    }
    H2Headers trailers;
    for (auto& [n, v] : call.trailers) {
      if (!IsHopByHop(n)) trailers.emplace_back(std::move(n), std::move(v));
    }
    conn->h2.Respond(id, head, std::move(call.data), std::move(trailers));
    conn->Kick();
    co_return;
  }
  if (client_deadline && Clock::now() >= deadline) {
    Inc(L.stats.router_answers[static_cast<size_t>(Reason::kUpstreamTimeout)]);
    status_for_latency = ReasonStatus(Reason::kUpstreamTimeout);
    conn->h2.RespondGrpcError(id, GrpcCode::kDeadlineExceeded,
                              absl::StrCat("grpc-timeout passed; last: ", last_failure));
    conn->Kick();
    co_return;
  }
  answer(Reason::kUpstreamFailed, absl::StrCat("every upstream failed; last: ", last_failure));
}

// Writes what the session has to send, until the connection closes.
template <class Stream>
awaitable<void> Writer(Loop& L, Stream& client, std::shared_ptr<H2ClientConn> conn) {
  // Its own deadline: the reader's (idle, or a call's response time) is
  // not the writer's, and each must not overwrite the other's.
  Deadline write_deadline(L, beast::get_lowest_layer(client));
  std::string out;
  error_code ec;
  while (!conn->closed) {
    out.clear();
    conn->h2.Drain(&out);
    if (out.empty()) {
      if (conn->h2.Done()) break;
      conn->wake.expires_at(Clock::time_point::max());
      co_await conn->wake.async_wait(Redirect(ec));
      continue;
    }
    write_deadline.Arm(L.config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(out), Redirect(ec));
    write_deadline.Disarm();
    if (ec) break;
  }
  conn->closed = true;
  conn->writer_running = false;
  conn->writer_done.cancel();
  error_code cec;
  beast::get_lowest_layer(client).cancel(cec);  // the reader stops too
}

}  // namespace

template <class Stream>
awaitable<void> ServeH2(Loop& L, Stream& client, Deadline& lowest, const std::string& peer_ip,
                        beast::flat_buffer& buf) {
  const RouterConfig& config = L.config;
  Inc(L.stats.h2_connections);
  std::shared_ptr<H2ClientConn> conn;
  std::weak_ptr<H2ClientConn> weak;
  conn = std::make_shared<H2ClientConn>(
      L, LimitsOf(config),
      [&L, &weak](H2Stream& s) {
        auto c = weak.lock();
        if (!c) return;
        // Calls being worked on are bounded: a client that resets streams as
        // fast as it opens them (rapid reset) leaves their calls behind only
        // until each hears of its reset.
        if (c->calls >= 2 * static_cast<int>(L.config.limits.h2_max_concurrent_streams)) {
          Inc(L.stats.h2_protocol_errors);
          c->h2.GoAway(NGHTTP2_ENHANCE_YOUR_CALM);
          c->Kick();
          return;
        }
        ++c->calls;
        net::co_spawn(L.ioc, HandleCall(L, c, s.id), net::detached);
      },
      [&L, &weak](H2Stream& s) {
        // A streaming call would wait here for the end of a request that
        // ends only when the client is done: it is refused at once, and
        // says why (its failover is not built yet).
        auto c = weak.lock();
        if (!c || s.Header(":path") != kModelStreamInfer) return;
        Inc(L.stats.router_answers[static_cast<size_t>(Reason::kNotImplemented)]);
        c->h2.RespondGrpcError(s.id, GrpcCode::kUnimplemented,
                               "gpuha router: streaming calls (ModelStreamInfer) are not proxied "
                               "yet; send ModelInfer calls");
      });
  weak = conn;
  conn->peer_ip = peer_ip;
  conn->writer_running = true;
  net::co_spawn(L.ioc, Writer(L, client, conn), net::detached);
  error_code ec;
  bool failed = false;
  for (;;) {
    if (buf.size() > 0) {
      auto data = buf.data();
      absl::Status st = conn->h2.Feed(static_cast<const char*>(data.data()), data.size());
      buf.consume(buf.size());
      if (!st.ok()) {
        failed = true;
        Inc(L.stats.h2_protocol_errors);
        spdlog::info("router: HTTP/2 client {}: {}", peer_ip, st.message());
      }
      conn->Kick();
      if (failed) break;
    }
    if (conn->closed || conn->h2.Done()) break;
    // Between calls the idle timeout; a call in flight keeps the connection.
    lowest.Arm(conn->h2.open_streams() > 0 ? config.limits.response_timeout
                                           : config.limits.idle_timeout);
    size_t n = co_await client.async_read_some(buf.prepare(kReadAhead), Redirect(ec));
    if (ec) break;
    buf.commit(n);
  }
  L.stats.h2_resets.fetch_add(conn->h2.resets_received(), std::memory_order_relaxed);
  // A protocol error's GOAWAY goes out before the close (bounded).
  if (failed && !conn->closed) {
    lowest.Arm(milliseconds(1000));
    while (conn->writer_running && !conn->closed) {
      conn->writer_done.expires_after(milliseconds(50));
      co_await conn->writer_done.async_wait(Redirect(ec));
      if (conn->h2.Done()) break;
    }
  }
  conn->closed = true;
  conn->h2.AbortStreams();  // calls in flight hear their client is gone
  conn->Kick();
  error_code cec;
  beast::get_lowest_layer(client).cancel(cec);
  while (conn->writer_running) {
    conn->writer_done.expires_at(Clock::time_point::max());
    co_await conn->writer_done.async_wait(Redirect(ec));
  }
}

template awaitable<void> ServeH2<Socket>(Loop&, Socket&, Deadline&, const std::string&,
                                         beast::flat_buffer&);
template awaitable<void> ServeH2<beast::ssl_stream<Socket>>(Loop&, beast::ssl_stream<Socket>&,
                                                            Deadline&, const std::string&,
                                                            beast::flat_buffer&);

}  // namespace gpuha::router
