// The router's HTTP/2 client side: one client connection (H2Server over the
// socket) and each gRPC call on it, routed and failed over as an HTTP/1.1
// request is (client_conn.cc), with gRPC statuses for the router's own
// answers.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>

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
      : h2(limits, std::move(on_request), std::move(on_headers)),
        wake(L.ioc),
        writer_done(L.ioc),
        limits_(L.config.limits) {}
  H2Server h2;
  Timer wake;         // the writer waits on it for bytes to send
  Timer writer_done;  // the reader waits on it for the writer to end
  bool closed = false;
  bool writer_running = false;
  int calls = 0;  // calls being worked on (a reset stream's call ends soon after)
  std::string peer_ip;
  KeyCache key_cache;
  Deadline* reader = nullptr;  // the reader's, while it reads
  // Wakes the writer: the session has something to send.
  void Kick() { wake.cancel(); }
  // The connection's read deadline, as Envoy splits its idle timeouts:
  // none while a call is worked on (each bounds itself: response_timeout
  // an attempt, its grpc-timeout, a stream's idle_timeout), so a client
  // that waits in silence for an answer that takes two upstreams, or
  // pauses its stream, keeps its connection; body_timeout while a stream
  // awaits the rest of its client's request; idle_timeout between calls
  // (an answered stream not yet closed is between calls).
  void ArmReader() {
    if (reader == nullptr || closed) return;
    if (calls > 0) {
      reader->Disarm();
    } else {
      reader->Arm(h2.awaiting_request() > 0 ? limits_.body_timeout : limits_.idle_timeout);
    }
  }

 private:
  const RouterLimits& limits_;
};

// A call being worked on, counted from its spawning to its end.
struct CallCount {
  H2ClientConn& conn;
  ~CallCount() {
    --conn.calls;
    conn.ArmReader();
  }
};

constexpr std::string_view kModelStreamInfer = "/inference.GRPCInferenceService/ModelStreamInfer";

H2Limits LimitsOf(const RouterConfig& c) {
  H2Limits l;
  l.max_concurrent_streams = c.limits.h2_max_concurrent_streams;
  l.max_header_list_bytes = c.limits.max_header_bytes;
  l.max_headers = c.limits.max_headers;
  // A call's request is re-sent whole to the standby: it is held whole,
  // and its stream's window takes it whole (bytes go back to the window
  // only when the router is done with them). The connection's window is
  // the budget of bytes held at once.
  l.max_request_bytes = c.limits.retry_buffer_bytes;
  l.stream_window = static_cast<int32_t>(
      std::clamp<size_t>(l.max_request_bytes, size_t{1} << 20, size_t{1} << 30));
  l.connection_window = static_cast<int32_t>(
      std::min<size_t>(std::max<size_t>(16u << 20, 4 * size_t(l.stream_window)), 1u << 30));
  l.max_buffered_bytes = static_cast<size_t>(l.connection_window);
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

// What one call (unary or streaming) is, once admitted: who, which stream,
// where, and by when. Its admission and its answers are shared by both.
struct CallCtx {
  CallCtx(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id)
      : L(L), conn(std::move(conn)), id(id), started(L.clock.Now()) {}
  ~CallCtx() {
    const common::Duration took = L.clock.Now() - started;
    L.latency.Observe(tenant ? tenant->name : std::string(), status_for_latency, took);
    if (attempts > 0) L.requests.Request(attempts, took);
  }
  CallCtx(const CallCtx&) = delete;
  CallCtx& operator=(const CallCtx&) = delete;

  // A router-made answer: counted, and sent as a Trailers-Only status (or,
  // for a streamed answer already begun, as its trailers).
  void Answer(Reason r, const std::string& detail) { Status(r, ReasonGrpcCode(r), detail); }
  void Status(Reason r, GrpcCode code, const std::string& detail) {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    status_for_latency = ReasonStatus(r);
    if (conn->closed) return;
    if (began) {
      conn->h2.Finish(id, {{"grpc-status", std::to_string(static_cast<int>(code))},
                           {"grpc-message", PercentEncodeGrpcMessage(detail)},
                           {"x-gpuha-error", ReasonLabel(r)}});
    } else {
      conn->h2.RespondGrpcError(id, code, detail, ReasonLabel(r));
    }
    conn->Kick();
  }
  // The request headers for `up`, with what is left of the client's deadline.
  H2Headers UpstreamHeaders(const UpstreamState& up) const {
    H2Headers out = {{":method", "POST"},
                     {":scheme", "http"},
                     {":authority", up.grpc_address},
                     {":path", path},
                     {"te", "trailers"}};
    if (client_deadline) {
      out.emplace_back("grpc-timeout",
                       FormatGrpcTimeout(std::chrono::duration_cast<std::chrono::milliseconds>(
                           deadline - Clock::now())));
    }
    for (const auto& [n, v] : request) {
      if (Forwardable(n)) out.emplace_back(n, v);
    }
    out.emplace_back("x-gpuha-tenant", tenant->name);
    out.emplace_back("x-forwarded-for", conn->peer_ip);
    return out;
  }
  // Before attempt `i` > 0: the retry budget pays for it. False: answered.
  bool MayRetry(size_t i, bool hung, bool unavailable) {
    if (i == 0) return true;
    if (!MayResend(L, hung)) {
      Answer(Reason::kRetryBudget, absl::StrCat("retry budget exhausted after: ", last_failure));
      return false;
    }
    Inc(L.stats.retries);
    if (hung) Inc(L.stats.hung_resends);
    if (unavailable) Inc(L.stats.retries_5xx);
    return true;
  }
  // Each upstream's gRPC address comes with the route (its HTTP one keys
  // the upstream's policy state, which both protocols share).
  void BindGrpc() {
    for (UpstreamState* up : order) {
      const Upstream& u = up->address == entry->primary.address ? entry->primary : entry->standby;
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
  }
  // The upstreams anew, from the routes as they are now, without `failed`:
  // for a stream that outlived the ones it was admitted with, or a call or
  // stream whose next upstream is of routes that moved since. False:
  // answered (the stream is gone, unplaced, or has nowhere else to go).
  bool Rechoose(const UpstreamState* failed) {
    RefreshRoutes(L);
    std::shared_ptr<const RouteTable> now = L.routes;
    UpstreamOrder<UpstreamState> fresh;
    const RouteEntry* e = nullptr;
    if (std::optional<Refusal> r =
            ChooseUpstreams(L, now.get(), *tenant, stream_id, L.clock.Now(), &fresh, &e)) {
      Answer(r->reason, absl::StrCat(r->detail, "; the stream broke: ", last_failure));
      return false;
    }
    routes = std::move(now);  // holds `e`
    entry = e;
    order.clear();
    for (UpstreamState* up : fresh) {
      if (up != failed) order.push_back(up);
    }
    if (order.empty()) {
      AllFailed();
      return false;
    }
    BindGrpc();
    return true;
  }
  // Routes newer than the ones its upstreams were chosen from.
  bool RoutesMoved() {
    RefreshRoutes(L);
    return L.routes != routes;
  }
  bool DeadlinePassed() const { return client_deadline && Clock::now() >= deadline; }
  // Every upstream failed: the deadline's status if it passed, else UNAVAILABLE.
  void AllFailed() {
    if (DeadlinePassed()) {
      Status(Reason::kUpstreamTimeout, GrpcCode::kDeadlineExceeded,
             absl::StrCat("grpc-timeout passed; last: ", last_failure));
    } else {
      Answer(Reason::kUpstreamFailed, absl::StrCat("every upstream failed; last: ", last_failure));
    }
  }

  Loop& L;
  std::shared_ptr<H2ClientConn> conn;
  int32_t id;
  TimePoint started;
  H2Headers request;
  std::string path;
  std::shared_ptr<Tenant> tenant;
  std::string stream_id;
  std::shared_ptr<const RouteTable> routes;
  UpstreamOrder<UpstreamState> order;
  const RouteEntry* entry = nullptr;
  bool client_deadline = false;
  Clock::time_point deadline;
  int status_for_latency = 200;
  int attempts = 0;
  bool began = false;  // a streamed answer's headers went to the client
  std::string last_failure;
};

// Admission, as an HTTP/1.1 request's (client_conn.cc): content type, the
// deadline, the tenant by key, the stream by metadata, its upstreams, the
// tenant's rate. False: answered.
bool Admit(CallCtx& c) {
  Loop& L = c.L;
  const H2Headers& request = c.request;
  c.path = std::string(H2Find(request, ":path"));
  if (H2Find(request, "content-type").substr(0, 16) != "application/grpc") {
    // HTTP/2 carries gRPC here; REST goes over HTTP/1.1 on the same port.
    Inc(L.stats.router_answers[static_cast<size_t>(Reason::kNotImplemented)]);
    c.status_for_latency = 415;
    c.conn->h2.Respond(c.id, {{":status", "415"}, {"content-type", "application/json"}},
                       ErrorBody(Reason::kNotImplemented,
                                 "HTTP/2 here carries gRPC (content-type application/grpc); send "
                                 "the REST protocol over HTTP/1.1 on this port",
                                 ""),
                       {});
    c.conn->Kick();
    return false;
  }
  if (H2Find(request, ":method") != "POST" || c.path.empty() || c.path[0] != '/') {
    c.Answer(Reason::kBadRequest, "a gRPC call is a POST to /package.Service/Method");
    return false;
  }
  std::chrono::milliseconds timeout{};
  if (std::string_view t = H2Find(request, "grpc-timeout"); !t.empty()) {
    absl::StatusOr<std::chrono::milliseconds> parsed = ParseGrpcTimeout(t);
    if (!parsed.ok()) {
      c.Answer(Reason::kBadRequest, std::string(parsed.status().message()));
      return false;
    }
    // Up to a day: a longer one is no deadline in practice, and a steady
    // clock's time point holds only about 292 years of nanoseconds.
    timeout = std::min<std::chrono::milliseconds>(*parsed, std::chrono::hours(24));
    c.client_deadline = true;
  }
  // Without the client's deadline, each attempt gets response_timeout.
  c.deadline = c.client_deadline ? Clock::now() + timeout : Clock::time_point::max();
  Identity who =
      Identify(*L.tenants, ApiKeyOf(H2Find(request, "authorization"), H2Find(request, "x-api-key")),
               &c.conn->key_cache);
  if (!who.tenant) {
    c.Answer(who.refusal->reason, who.refusal->detail);
    return false;
  }
  c.tenant = std::move(who.tenant);
  StreamRef ref = ExtractStream(H2Find(request, "x-gpuha-stream"), c.path);
  if (ref.bad) {
    c.Answer(Reason::kBadStream, "x-gpuha-stream must be 1-128 of [A-Za-z0-9._:-]");
    return false;
  }
  if (ref.stream.empty()) ref.stream = c.tenant->default_stream;
  if (ref.stream.empty()) {
    c.Answer(Reason::kNoStream, "the call names no stream: send x-gpuha-stream metadata");
    return false;
  }
  c.stream_id = ref.stream;
  RefreshRoutes(L);
  c.routes = L.routes;
  if (std::optional<Refusal> r = ChooseUpstreams(L, c.routes.get(), *c.tenant, c.stream_id,
                                                 L.clock.Now(), &c.order, &c.entry)) {
    c.Answer(r->reason, r->detail);
    return false;
  }
  if (std::optional<Refusal> r = CheckRate(*c.tenant, L.clock.Now())) {
    c.Answer(r->reason, r->detail);
    return false;
  }
  c.BindGrpc();
  L.retry_budget.Deposit(L.now);
  return true;
}

// The client's reset (or its connection's end) ends `call` here and
// upstream; the hook goes with the scope, however the frame ends.
class ClientHook {
 public:
  ClientHook(H2ClientConn& c, int32_t id, H2Call& call) : c_(c), id_(id) {
    if (H2Stream* s = c_.h2.Find(id_)) s->on_close = [&call] { call.ClientGone(); };
  }
  ~ClientHook() {
    if (H2Stream* s = c_.h2.Find(id_)) s->on_close = nullptr;
  }
  ClientHook(const ClientHook&) = delete;
  ClientHook& operator=(const ClientHook&) = delete;

 private:
  H2ClientConn& c_;
  int32_t id_;
};

// An upstream's gRPC status: in the trailers, or in the headers of a
// Trailers-Only answer.
std::string_view GrpcStatusOf(const H2Call& call) {
  std::string_view st = H2Find(call.trailers, "grpc-status");
  return st.empty() ? H2Find(call.headers, "grpc-status") : st;
}
bool ServerError(std::string_view grpc_status) {
  return grpc_status == "2" || grpc_status == "13" || grpc_status == "14" || grpc_status == "15";
}
// What the standby is asked after (with retry_5xx), as an HTTP 5xx is re-sent:
// a server's failure (UNKNOWN, INTERNAL, UNAVAILABLE, DATA_LOSS), and
// CANCELLED from an upstream (the router cancelled nothing): a server going
// away. A client's error (INVALID_ARGUMENT, NOT_FOUND) is the same anywhere.
bool RetryableStatus(std::string_view grpc_status) {
  return ServerError(grpc_status) || grpc_status == "1";
}
// What of an upstream's headers and trailers the client gets (copies: the
// call's own are read again after).
H2Headers RelayHeaders(const H2Headers& from) {
  H2Headers out;
  for (const auto& [n, v] : from) {
    if (Relayable(n)) out.emplace_back(n, v);
  }
  return out;
}
H2Headers RelayTrailers(const H2Headers& from) {
  H2Headers out;
  for (const auto& [n, v] : from) {
    if (!IsHopByHop(n)) out.emplace_back(n, v);
  }
  return out;
}

// The trailers that end a streamed answer: the upstream's, or, when it
// answered Trailers-Only, its status taken from its headers.
H2Headers EndingTrailers(const H2Call& call) {
  if (!H2Find(call.trailers, "grpc-status").empty()) return RelayTrailers(call.trailers);
  H2Headers out;
  for (const char* name : {"grpc-status", "grpc-message"}) {
    std::string_view v = H2Find(call.headers, name);
    if (!v.empty()) out.emplace_back(name, std::string(v));
  }
  return out;
}
// One unary gRPC call, from its whole request to its whole answer.
awaitable<void> HandleCall(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  CallCount count{*conn};  // counted when it was spawned
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.requests);
  Inc(L.stats.grpc_calls);
  CallCtx c(L, conn, id);
  c.request = std::move(s->headers);
  const std::string body = std::move(s->body);
  if (!Admit(c)) co_return;
  QuotaSlot quota(*c.tenant);
  if (quota.over()) {
    c.Answer(Reason::kOverQuota, QuotaSlot::Refused().detail);
    co_return;
  }
  InFlight in_flight(L.stats.in_flight);
  bool hung = false, unavailable = false;
  // Attempts are counted apart from the place in the order, which starts
  // again when the order is chosen anew.
  size_t attempt = 0;
  for (size_t i = 0; i < c.order.size(); ++i, ++attempt) {
    UpstreamState& up = *c.order[i];
    if (!c.MayRetry(attempt, hung, unavailable)) co_return;
    hung = unavailable = false;
    if (up.grpc_endpoint.port() == 0) {
      c.last_failure =
          absl::StrCat(up.node, ": serves no gRPC (the route gives it no IP:PORT for gRPC)");
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now >= c.deadline) break;
    c.attempts = static_cast<int>(attempt + 1);
    H2Call call(L);
    ClientHook hook(*conn, id, call);
    co_await H2Send(L, up, c.UpstreamHeaders(up), body,
                    std::min(c.deadline, now + config.limits.response_timeout), call);
    if (call.client_gone || conn->closed) {
      Inc(L.stats.client_aborts);
      co_return;
    }
    if (call.response_too_large) {
      c.Answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
      co_return;
    }
    if (call.failed) {
      c.last_failure = absl::StrCat(up.node, ": ", call.why);
      hung = call.hung_cancel;
      if (call.timed_out && c.DeadlinePassed()) break;
      if (i == 0 && c.order.size() > 1) {
        L.sticky.Stick(c.stream_id, c.entry->primary.address, c.entry->standby.address,
                       L.clock.Now());
      }
      // Its next upstream is of routes that moved since it was admitted (a
      // standby fenced meanwhile): where its route points now instead.
      if (i + 1 < c.order.size() && c.RoutesMoved()) {
        if (!c.Rechoose(&up)) co_return;
        i = static_cast<size_t>(-1);  // the loop's ++i: the fresh order's first
      }
      continue;
    }
    const std::string_view status = H2Find(call.headers, ":status");
    if (status != "200") {
      UpstreamAnswered(L, up, true, call.answered_at, call.answered_at - call.waiting_since);
      c.last_failure = absl::StrCat(up.node, ": answered HTTP status ", std::string(status));
      continue;
    }
    const std::string_view grpc_status = GrpcStatusOf(call);
    Inc(L.stats.upstream_class[2]);
    UpstreamAnswered(L, up, ServerError(grpc_status), call.answered_at,
                     call.answered_at - call.waiting_since);
    if (RetryableStatus(grpc_status) && config.retry_5xx && i + 1 < c.order.size()) {
      unavailable = true;
      c.last_failure = absl::StrCat(up.node, ": grpc-status ", std::string(grpc_status), ": ",
                                    std::string(H2Find(call.trailers, "grpc-message")),
                                    std::string(H2Find(call.headers, "grpc-message")));
      continue;
    }
    conn->h2.Respond(id, RelayHeaders(call.headers), std::move(call.data),
                     RelayTrailers(call.trailers));
    conn->Kick();
    co_return;
  }
  c.AllFailed();
}

// The length-prefixed messages of a gRPC body: the first whole one in `b`
// from `at` (its 5-byte prefix included), or 0 bytes while it is not whole.
size_t WholeMessage(std::string_view b) {
  if (b.size() < 5) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const size_t n = (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
  return b.size() >= 5 + n ? 5 + n : 0;
}

// A streaming call (ModelStreamInfer, not decoupled): each request message
// is held until its answer comes back (answers come one per request, in
// order). When the upstream fails, the call is opened on the standby and
// the unanswered messages are sent again in order: the client's stream goes
// on, and every request gets exactly one answer. A message's bytes go back
// to the client's flow-control window when it is answered, so a client
// that pipelines into a stuck upstream is held by its window. An upstream
// that answers more messages than it was sent is a decoupled model: its
// stream cannot be continued, and a failure ends it with UNAVAILABLE that
// says so.
awaitable<void> HandleStream(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id) {
  const RouterConfig& config = L.config;
  CallCount count{*conn};
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  Inc(L.stats.requests);
  Inc(L.stats.grpc_calls);
  Inc(L.stats.grpc_streams);
  CallCtx c(L, conn, id);
  c.request = s->headers;  // its body keeps coming
  if (!Admit(c)) co_return;
  QuotaSlot quota(*c.tenant);
  if (quota.over()) {
    c.Answer(Reason::kOverQuota, QuotaSlot::Refused().detail);
    co_return;
  }
  InFlight in_flight(L.stats.in_flight);
  conn->h2.StartStreaming(id);
  const size_t max_message = LimitsOf(config).max_request_bytes;
  std::deque<std::string> unanswered;     // sent upstream, no answer yet (oldest first)
  std::deque<Clock::time_point> sent_at;  // when each was (last) sent
  Clock::time_point last_answer{};        // the last answer of this stream
  Clock::time_point last_heard = Clock::now();  // the client's last bytes
  size_t heard = 0;                             // bytes of its body not yet taken, at the last look
  bool decoupled = false;
  bool client_done = false;
  bool hung = false, unavailable = false;
  // Attempts are counted apart from the place in the order: a stream that
  // lived on an upstream until it failed takes its upstreams anew.
  size_t attempt = 0;
  for (size_t i = 0; i < c.order.size(); ++i, ++attempt) {
    UpstreamState& up = *c.order[i];
    if (!c.MayRetry(attempt, hung, unavailable)) co_return;
    hung = unavailable = false;
    if (up.grpc_endpoint.port() == 0) {
      c.last_failure =
          absl::StrCat(up.node, ": serves no gRPC (the route gives it no IP:PORT for gRPC)");
      continue;
    }
    if (c.DeadlinePassed()) break;
    if (attempt > 0 && decoupled) {
      c.Answer(Reason::kUpstreamFailed,
               absl::StrCat("the model is decoupled (its answers are not one per request), so "
                            "its stream cannot be continued on the standby; the stream broke: ",
                            c.last_failure));
      co_return;
    }
    c.attempts = static_cast<int>(attempt + 1);
    // The upstream stream's body: the unanswered messages, then the next
    // (declared before the call, whose reads point into it).
    std::string out;
    for (const std::string& m : unanswered) out += m;
    H2Call call(L);
    call.streaming = true;
    call.body_done = false;
    call.body = &out;
    ClientHook hook(*conn, id, call);
    if (H2Stream* cs = conn->h2.Find(id)) {
      cs->on_data = [&call] { call.wake.cancel(); };
    }
    struct Unhook {
      H2ClientConn& c;
      int32_t id;
      ~Unhook() {
        if (H2Stream* s = c.h2.Find(id)) s->on_data = nullptr;
      }
    } unhook{*conn, id};
    up.in_flight++;
    struct Dec {
      int64_t* v;
      ~Dec() { --*v; }
    } dec{&up.in_flight};
    const bool started = co_await H2Start(L, up, c.UpstreamHeaders(up), call);
    if (call.client_gone || conn->closed) {
      Inc(L.stats.client_aborts);
      co_return;
    }
    if (!started) {
      c.last_failure = absl::StrCat(up.node, ": ", call.why);
      continue;
    }
    std::fill(sent_at.begin(), sent_at.end(), Clock::now());  // sent again now
    size_t parsed = 0;           // of call.data: answers relayed so far
    bool answered_here = false;  // this upstream answered one of this stream's messages
    bool error_answer = false;   // it answered one with an error (StreamAnswerIsError)
    // Whether a break here can go on elsewhere: to the next upstream, or
    // (a stream that lived here) to where its route points now.
    // (A decoupled model's stream is not continued; the next attempt says so.)
    auto can_continue = [&] { return i + 1 < c.order.size() || (answered_here && !decoupled); };
    bool check_overdue = false;
    error_code ec;
    for (;;) {
      // The client's new whole messages go upstream, and are held.
      H2Stream* cs = conn->h2.Find(id);
      if (cs == nullptr) {
        Inc(L.stats.client_aborts);
        co_return;  // the client left
      }
      size_t took = 0;
      std::string_view b(cs->body);
      for (;;) {
        std::string_view rest = b.substr(took);
        if (rest.size() >= 5) {
          const auto* p = reinterpret_cast<const unsigned char*>(rest.data());
          const size_t len =
              (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4];
          if (len + 5 > max_message) {
            c.Answer(Reason::kBodyTooLarge,
                     absl::StrCat("a stream message over ", max_message, " bytes"));
            co_return;
          }
        }
        size_t n = WholeMessage(rest);
        if (n == 0) break;
        unanswered.emplace_back(rest.substr(0, n));
        sent_at.push_back(Clock::now());
        if (call.body_sent > 64 * 1024) {  // keep the upstream body from growing
          out.erase(0, call.body_sent);
          call.body_sent = 0;
        }
        out += unanswered.back();
        took += n;
      }
      if (took > 0) {
        conn->h2.Consume(id, took);
        H2Resume(call);
      }
      if (took > 0 || cs->body.size() != heard) last_heard = Clock::now();
      heard = cs->body.size();
      if (cs->complete && !client_done) {
        if (!cs->body.empty()) {
          c.Answer(Reason::kBadRequest, "the stream ended inside a message");
          co_return;
        }
        client_done = true;
      }
      if (client_done && !call.body_done) {
        call.body_done = true;
        H2Resume(call);
      }
      // The upstream's whole answers go to the client, each retiring the
      // oldest unanswered request (whose bytes go back to the window).
      std::string_view d(call.data);
      while (size_t n = WholeMessage(d.substr(parsed))) {
        // An error answer while another upstream is left and the retry
        // budget pays for it: this one may be failing (a CUDA error, an
        // engine gone bad), and the stream goes on there with this message
        // unanswered, as an HTTP 500 is re-sent. From the last upstream the
        // error is relayed: the stream lives on.
        if (!unanswered.empty() && config.retry_5xx && i + 1 < c.order.size() && !decoupled &&
            L.retry_budget.Balance(L.now) >= 1 && StreamAnswerIsError(d.substr(parsed, n))) {
          error_answer = true;
          break;
        }
        if (!c.began) {
          conn->h2.RespondStreaming(id, RelayHeaders(call.headers));
          c.began = true;
        }
        conn->h2.SendData(id, d.substr(parsed, n));
        parsed += n;
        last_answer = Clock::now();
        if (unanswered.empty()) {
          decoupled = true;  // more answers than requests
        } else {
          UpstreamAnswered(
              L, up, false, L.clock.Now(),
              std::chrono::duration_cast<common::Duration>(last_answer - sent_at.front()));
          conn->h2.Release(id, unanswered.front().size());
          unanswered.pop_front();
          sent_at.pop_front();
          answered_here = true;
        }
        conn->Kick();
      }
      if (parsed > 64 * 1024) {
        call.data.erase(0, parsed);
        parsed = 0;
      }
      // Owed since the later of its sending and the last answer: answers
      // come in order, so one queued behind another is not late.
      const Clock::time_point owed_since =
          unanswered.empty() ? Clock::time_point() : std::max(sent_at.front(), last_answer);
      // Watched by the hung and stall verdicts while an answer is owed.
      if (unanswered.empty()) {
        call.waiting_hook.unlink();
      } else {
        call.waiting_since =
            L.clock.Now() - std::chrono::duration_cast<common::Duration>(Clock::now() - owed_since);
        call.expect = {};
        if (!call.waiting_hook.is_linked()) up.waiting.push_back(call);
      }
      if (call.client_gone || conn->closed) {
        Inc(L.stats.client_aborts);
        co_return;
      }
      if (call.done || call.hung_cancel || error_answer) break;
      // An answer owed past response_timeout: the upstream is taken for
      // stuck, as a unary call's would be. Judged after the events already
      // queued are taken in (the timer may fire beside them).
      const Clock::time_point overdue_at = unanswered.empty()
                                               ? Clock::time_point::max()
                                               : owed_since + config.limits.response_timeout;
      // Nothing owed, and neither side has said anything for idle_timeout
      // (Envoy's stream idle timeout), or body_timeout inside a message:
      // the stream ends, since the connection's read deadline leaves a
      // call being worked on alone.
      const bool mid_message = heard > 0;
      const milliseconds idle_for =
          mid_message ? config.limits.body_timeout : config.limits.idle_timeout;
      const Clock::time_point idle_at = unanswered.empty()
                                            ? std::max(last_heard, last_answer) + idle_for
                                            : Clock::time_point::max();
      if (check_overdue && Clock::now() >= idle_at) {
        c.Answer(Reason::kStreamIdle,
                 mid_message
                     ? absl::StrCat("the client stopped inside a message for body_timeout (",
                                    idle_for.count(), " ms)")
                     : absl::StrCat("the stream was idle for idle_timeout (", idle_for.count(),
                                    " ms): no message from the client, no answer owed"));
        co_return;
      }
      if (check_overdue && Clock::now() >= std::min(overdue_at, c.deadline)) {
        call.timed_out = true;
        break;
      }
      check_overdue = false;
      call.wake.expires_at(std::min({overdue_at, idle_at, c.deadline}));
      co_await call.wake.async_wait(Redirect(ec));
      if (!ec) check_overdue = true;  // the timer ran out: take in what came, then judge
    }
    call.waiting_hook.unlink();
    if (call.response_too_large) {
      c.Answer(Reason::kBodyTooLarge, absl::StrCat(up.node, ": ", call.why));
      co_return;
    }
    const std::string_view grpc_status = GrpcStatusOf(call);
    const bool retryable_status = RetryableStatus(grpc_status);
    if (!error_answer && call.done && !call.failed && H2Find(call.headers, ":status") == "200" &&
        !grpc_status.empty() && !(retryable_status && config.retry_5xx && can_continue()) &&
        (grpc_status != "0" || (unanswered.empty() && client_done))) {
      // Ended: whole, or with the upstream's own status, which is relayed.
      if (ServerError(grpc_status)) UpstreamAnswered(L, up, true, call.answered_at, std::nullopt);
      if (!c.began) {
        conn->h2.Respond(id, RelayHeaders(call.headers), "", EndingTrailers(call));
      } else {
        conn->h2.Finish(id, EndingTrailers(call));
      }
      conn->Kick();
      co_return;
    }
    // The stream broke with answers owed, ended early, or ended UNAVAILABLE.
    c.last_failure = absl::StrCat(
        up.node, ": ",
        error_answer           ? std::string("answered a message with an error")
        : call.hung_cancel     ? std::string("hung")
        : call.timed_out       ? (c.DeadlinePassed() ? std::string("grpc-timeout passed")
                                                     : std::string("an answer overdue"))
        : call.failed          ? call.why
        : !grpc_status.empty() ? absl::StrCat("grpc-status ", std::string(grpc_status), " ",
                                              std::string(H2Find(call.trailers, "grpc-message")),
                                              std::string(H2Find(call.headers, "grpc-message")))
                               : std::string("the stream ended without a status"));
    hung = call.hung_cancel;
    unavailable = retryable_status || error_answer;
    // An error answer is not held against the upstream (its ejection):
    // error_message cannot say whether the server or the request was bad,
    // and one tenant's bad frames must not take a server from the others.
    if (retryable_status && !error_answer) {
      UpstreamAnswered(L, up, ServerError(grpc_status), call.answered_at, std::nullopt);
    }
    if (call.timed_out && !c.DeadlinePassed()) ConnectionFailed(L, up);
    H2Abandon(call);
    if (c.DeadlinePassed()) break;
    if (i == 0 && c.order.size() > 1) {
      L.sticky.Stick(c.stream_id, c.entry->primary.address, c.entry->standby.address,
                     L.clock.Now());
    }
    // A stream that lived here (it was answered) and has no upstream left of
    // those it was admitted with: a camera's stream outlives many faults,
    // and the routes have moved on since it began. It goes on where its
    // route points now, paid for by the retry budget as any attempt is.
    // So does one whose next upstream is of routes that moved since (that
    // standby may be fenced by now: an XID flood's second node).
    const bool order_stale = i + 1 < c.order.size() && c.RoutesMoved();
    if ((i + 1 == c.order.size() && can_continue()) || order_stale) {
      if (!c.Rechoose(&up)) co_return;
      i = static_cast<size_t>(-1);  // the loop's ++i: the fresh order's first
    }
    if (i + 1 < c.order.size() && !decoupled) {
      Inc(L.stats.grpc_stream_continuations);
      spdlog::info(
          "router: stream {}: gRPC stream broke with {} answer(s) owed ({}); "
          "continuing it on {}",
          c.stream_id, unanswered.size(), c.last_failure, c.order[i + 1]->node);
    }
  }
  c.AllFailed();
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
        // A streaming call is worked on from its headers: its messages
        // come (and are answered) while the client's stream is open.
        auto c = weak.lock();
        if (!c || s.Header(":path") != kModelStreamInfer) return;
        if (c->calls >= 2 * static_cast<int>(L.config.limits.h2_max_concurrent_streams)) {
          Inc(L.stats.h2_protocol_errors);
          c->h2.GoAway(NGHTTP2_ENHANCE_YOUR_CALM);
          c->Kick();
          return;
        }
        ++c->calls;
        c->h2.StartStreaming(s.id);
        net::co_spawn(L.ioc, HandleStream(L, c, s.id), net::detached);
      });
  weak = conn;
  conn->peer_ip = peer_ip;
  conn->reader = &lowest;
  // The calls may outlive the reader, and its Deadline: they stop arming
  // it when it stops reading, or when its frame is destroyed unfinished
  // (the loop's io_context torn down with the connection in flight).
  struct Unreader {
    H2ClientConn& c;
    ~Unreader() {
      c.reader = nullptr;
      c.closed = true;
    }
  } unreader{*conn};
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
    conn->ArmReader();
    size_t n = co_await client.async_read_some(buf.prepare(kReadAhead), Redirect(ec));
    if (ec) break;
    buf.commit(n);
  }
  conn->reader = nullptr;  // a call's end must not lift the GOAWAY's bound below
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
