#include "router/client_conn.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "router/exchange.h"
#include "router/h2_rest.h"
#include "router/h2_server.h"

namespace gpuha::router {

std::optional<Refusal> ChooseUpstreams(Loop& L, const RouteTable* routes, const Tenant& tenant,
                                       const std::string& stream_id, TimePoint now,
                                       UpstreamOrder<UpstreamState>* order,
                                       const RouteEntry** entry) {
  const RouteEntry* e = routes ? routes->Find(stream_id) : nullptr;
  if (e == nullptr || (L.tenants->auth_required() && e->tenant != tenant.name)) {
    return Refusal{Reason::kUnknownStream, "no such stream"};
  }
  if (e->primary.empty()) {
    return Refusal{Reason::kNoCapacity, "the stream is not placed: the cluster is over capacity",
                   1};
  }
  *entry = e;
  UpstreamState* primary = &FindUpstream(L, e->primary);
  UpstreamState* standby = e->standby.empty() ? nullptr : &FindUpstream(L, e->standby);
  for (UpstreamState* up : {primary, standby}) {
    if (up != nullptr && up->named && up->dns_generation != L.shared.dns->generation()) {
      LookUpName(L, *up);
    }
  }
  bool stuck =
      L.sticky.Stuck(stream_id, e->primary.address, e->standby.address, primary->usable(now), now);
  *order = StreamOrder(primary, standby, stuck, now);
  DropUnfit(*order, now);
  if (order->empty()) {
    // Never silent: a name that does not resolve says so.
    if (!primary->resolvable && (standby == nullptr || !standby->resolvable)) {
      return Refusal{Reason::kUpstreamUnresolved,
                     standby == nullptr
                         ? absl::StrCat("upstream ", e->primary.address, " does not resolve")
                         : absl::StrCat("upstreams ", e->primary.address, " and ",
                                        e->standby.address, " do not resolve")};
    }
    return Refusal{Reason::kNoUpstream, "every upstream of the stream is down or hung", 1};
  }
  return std::nullopt;
}

namespace {

// What an answer still awaited when the drain's timeout passed ends with.
constexpr const char* kDrainExpired =
    "the router is stopping: its drain_timeout passed with this answer still open";

template <class Stream>
awaitable<bool> Handle(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                       RequestParser<http::buffer_body>& p) {
  const RouterConfig& config = L.config;
  beast::flat_buffer& buf = cc.buf;
  Inc(L.stats.requests);
  auto& req = p.get();
  // A draining router answers this one and closes: the client hears it in
  // the answer (Connection: close) and sends its next request elsewhere.
  bool keep_alive = req.keep_alive() && !L.shared.draining.load(std::memory_order_relaxed);
  std::string stream_id;
  error_code ec;

  // Every early answer goes through here: counted, written, done.
  auto answer = [&](Reason r, std::string detail, int retry_after = 0) -> awaitable<bool> {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    cc.status = ReasonStatus(r);
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

  // A head whose framing or form the router will not forward.
  if (std::optional<HeadProblem> bad = CheckHead(req)) {
    keep_alive = false;
    co_return co_await answer(bad->reason, std::move(bad->detail));
  }
  std::chrono::milliseconds expect{};
  if (std::optional<HeadProblem> bad = ReadExpectation(req, &expect)) {
    co_return co_await answer(bad->reason, std::move(bad->detail));
  }

  // Tenant.
  Identity who = Identify(*L.tenants, ApiKey(req), &cc.key_cache);
  if (!who.tenant) co_return co_await refuse(std::move(*who.refusal));
  std::shared_ptr<Tenant> tenant = std::move(who.tenant);
  cc.tenant = tenant->name;

  // Route.
  // Every decision below reads the normalized target, and the upstream
  // receives it: "//streams/a", "/./streams/a" and "/streams/b/../a" are
  // all stream a.
  auto hv = req["x-gpuha-stream"];
  auto target = req.target();
  std::optional<std::string> normal =
      NormalizeTarget(std::string_view(target.data(), target.size()));
  if (!normal) {
    keep_alive = false;
    co_return co_await answer(Reason::kBadRequest,
                              "the request target cannot be normalized (not origin or absolute "
                              "form, a bad %-escape, or '..' above the root)");
  }
  StreamRef ref = ExtractStream(std::string_view(hv.data(), hv.size()), *normal);
  if (ref.bad) {
    co_return co_await answer(Reason::kBadStream,
                              "stream id must be 1-128 of [A-Za-z0-9._:-], and the header and "
                              "path must agree");
  }
  if (ref.stream.empty()) ref.stream = tenant->default_stream;
  if (ref.stream.empty()) {
    co_return co_await answer(Reason::kNoStream,
                              "the request names no stream: use /streams/ID/... or the "
                              "X-Gpuha-Stream header");
  }
  stream_id = ref.stream;
  RefreshRoutes(L);
  std::shared_ptr<const RouteTable> routes = L.routes;  // this request's version
  UpstreamOrder<UpstreamState> order;
  const RouteEntry* e = nullptr;  // the stream's route, if it names one
  const TimePoint now = L.clock.Now();
  if (std::optional<Refusal> r =
          ChooseUpstreams(L, routes.get(), *tenant, stream_id, now, &order, &e)) {
    co_return co_await refuse(std::move(*r));
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
      if (ec.category() == http::make_error_code(http::error::bad_chunk).category() &&
          ec != http::error::partial_message && ec != http::error::end_of_stream) {
        keep_alive = false;  // a bad chunk size, say: answered, then closed
        co_return co_await answer(Reason::kBadRequest,
                                  absl::StrCat("malformed body: ", ec.message()));
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

  // An LLM route's request is followed (SseContinuity): if its answer is a
  // token stream and the upstream fails mid-answer, the rest is asked of
  // the standby and the client's stream goes on. When that cannot be, the
  // stream still ends with an error event that says why.
  std::optional<SseContinuity> sse;
  if (req.method() == http::verb::post) {
    if (const LlmRoute* lr = FindLlmRoute(config.llm, ref.target)) {
      std::optional<LlmCall> call;
      std::string why;
      auto off = req["x-gpuha-continue"];
      if (!config.llm.continuation || !lr->continuation) {
        why = "continuation is off for this route (llm.continuation, llm.routes)";
      } else if (absl::EqualsIgnoreCase(absl::string_view(off.data(), off.size()), "off")) {
        why = "continuation is off for this request (X-Gpuha-Continue: off)";
      } else if (!complete) {
        why = absl::StrCat("the request body is over the ", config.limits.retry_buffer_bytes,
                           "-byte retry buffer");
      } else if (absl::StatusOr<LlmCall> c = ReadLlmCall(lr->api, body); c.ok()) {
        call = std::move(*c);
      } else {
        why = std::string(c.status().message());
      }
      sse.emplace(lr->api, std::move(call), std::move(why), config.llm.max_text_bytes);
    }
  }
  // A token stream whose rest cannot be had ends with an error event: the
  // client's parser reports it, instead of taking a cut answer for a whole one.
  Framing client_down = Framing::kNone;
  // By value: the coroutine runs after the caller's temporaries are gone.
  auto end_stream = [&](std::string events, bool error) -> awaitable<bool> {
    if (error) Inc(L.stats.sse_error_events);
    std::string& out = cc.pending;
    out.clear();
    FrameForClient(client_down, events, &out);
    if (client_down == Framing::kChunked) out.append("0\r\n\r\n");
    error_code wec;
    lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(out), Redirect(wec));
    co_return keep_alive && !wec && client_down == Framing::kChunked;
  };
  auto cut = [&](std::string why) {
    spdlog::warn("router: stream {}: answer ended with an error event after {} tokens: {}",
                 stream_id, sse->tokens(), why);
    return end_stream(SseContinuity::ErrorEvent(why), true);
  };

  L.retry_budget.Deposit(L.now);
  InFlight in_flight(L.stats.in_flight);
  ExchangeResult f;
  std::string last_failure;
  bool any_timeout = false;
  // The client's answer began on an earlier upstream and broke: the next
  // one is asked for the rest (continuation_body).
  bool continuing = false;
  std::string continuation_body;
  std::shared_ptr<const RouteTable> continuation_routes;  // keeps the chosen entries alive
  // The upstreams after order[i] anew, from the routes and health of now
  // (those tried stay tried): a standby may have been fenced, or be back.
  // False, and the order untouched: the routes of now refuse the stream.
  auto rechoose_after = [&](size_t i) {
    RefreshRoutes(L);
    std::shared_ptr<const RouteTable> now = L.routes;
    UpstreamOrder<UpstreamState> now_order;
    const RouteEntry* now_entry = nullptr;
    if (ChooseUpstreams(L, now.get(), *tenant, stream_id, L.clock.Now(), &now_order, &now_entry)) {
      return false;
    }
    continuation_routes = std::move(now);
    order.resize(i + 1);
    for (UpstreamState* u : now_order) {
      if (std::find(order.begin(), order.end(), u) == order.end()) order.push_back(u);
    }
    return true;
  };
  for (size_t i = 0; i < order.size(); ++i) {
    UpstreamState& up = *order[i];
    if (i > 0) {
      if (f.body_consumed) break;
      if (!MayResend(L, f.hung)) {
        if (continuing) {
          co_return co_await cut(
              absl::StrCat("the retry budget is spent; the answer broke: ", last_failure));
        }
        co_return co_await answer(Reason::kRetryBudget,
                                  absl::StrCat("retry budget exhausted after: ", last_failure), 1);
      }
      Inc(L.stats.retries);
      if (f.hung) Inc(L.stats.hung_resends);
      if (f.upstream_5xx) Inc(L.stats.retries_5xx);
    }
    const std::string& send = continuing ? continuation_body : body;
    const Framing send_framing = continuing ? Framing::kLength : framing;
    cc.head.clear();
    AppendUpstreamHead(req, ref.target, up.address, tenant->name, stream_id, cc.peer_ip,
                       send_framing, continuing ? send.size() : length, &cc.head);
    f = ExchangeResult{};
    const bool retry_5xx = config.retry_5xx && i + 1 < order.size() && complete && !continuing;
    if (continuing) Inc(L.stats.sse_continuations);
    cc.attempts = static_cast<int>(i + 1);
    co_await Exchange(L, client, lowest, cc, p, up,
                      {send, complete || continuing, send_framing, keep_alive, retry_5xx, expect,
                       sse ? &*sse : nullptr, continuing, client_down},
                      f);
    if (f.sse_broken) {
      last_failure = absl::StrCat(up.node, ": ", f.why);
      if (!continuing) client_down = f.down;
      continuing = true;
      if (std::optional<std::string> end = sse->OnlyTheEndIsMissing()) {
        co_return co_await end_stream(*end, false);
      }
      if (L.shared.drain_expired.load(std::memory_order_relaxed)) {
        co_return co_await cut(kDrainExpired);
      }
      if (std::optional<std::string> why = sse->CannotContinue()) {
        co_return co_await cut(absl::StrCat(*why, "; the answer broke: ", last_failure));
      }
      if (sse->continuations() >= config.llm.max_continuations) {
        co_return co_await cut(absl::StrCat("continued ", sse->continuations(),
                                            " times already (llm.max_continuations); ",
                                            last_failure));
      }
      // An answer lasts seconds: where it goes on is chosen again, from the
      // routes and health of now. A standby that was down when the answer
      // began may be back, and the controller may have moved the stream.
      if (!rechoose_after(i)) order.resize(i + 1);
      if (i + 1 >= order.size()) {
        co_return co_await cut(
            absl::StrCat("no standby to continue the answer on; ", last_failure));
      }
      continuation_body = sse->BeginContinuation();
      if (i == 0 && e != nullptr && !e->standby.empty()) {
        L.sticky.Stick(stream_id, e->primary.address, e->standby.address, L.clock.Now());
      }
      spdlog::info("router: stream {}: answer broke after {} tokens ({}); continuing it on {}",
                   stream_id, sse->tokens(), last_failure, order[i + 1]->node);
      continue;
    }
    if (continuing) {
      if (f.retryable) {
        last_failure = absl::StrCat(up.node, ": ", f.why);
        continue;
      }
      break;
    }
    if (!f.retryable) break;
    if (L.shared.drain_expired.load(std::memory_order_relaxed)) {
      keep_alive = false;
      co_return co_await answer(Reason::kDraining, kDrainExpired);
    }
    last_failure = absl::StrCat(up.node, ": ", f.why);
    any_timeout = any_timeout || f.timeout;
    if (i == 0 && e != nullptr && order.size() > 1) {
      L.sticky.Stick(stream_id, e->primary.address, e->standby.address, L.clock.Now());
    }
    // The routes moved while it waited (its standby fenced meanwhile, an
    // XID flood's second node; or, admitted with its primary alone, a
    // standby given since): it goes where its route points now, as a gRPC
    // call goes (CallCtx::Rechoose), whether or not its admission left it
    // a next upstream (the XID-flood chaos flake: a request on its last
    // upstream, fenced, answered 502 while its moved route pointed at a
    // node that served). Not after a 5xx, whose answer was set aside for
    // the next upstream (retry_5xx) and is relayed if none is left; and
    // where the routes of now refuse the stream, the order it was admitted
    // with is kept.
    if (!f.upstream_5xx) {
      RefreshRoutes(L);
      if (L.routes != (continuation_routes ? continuation_routes : routes)) rechoose_after(i);
    }
  }
  if (f.client_gone) {
    Inc(L.stats.client_aborts);
    co_return false;
  }
  if (continuing) {
    // Not started: failed before its head, or answered what cannot follow
    // (a protocol upgrade): the client's open answer still needs its end.
    if (f.retryable || !f.started) {
      co_return co_await cut(
          absl::StrCat("the standby failed before continuing the answer: ", last_failure));
    }
    co_return keep_alive && !f.close_client;
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

}  // namespace

template <class Stream>
awaitable<bool> ServeRequest(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc) {
  const RouterConfig& config = L.config;
  beast::flat_buffer& buf = cc.buf;
  error_code ec;
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
      co_return false;  // closed, reset or silent: nothing to answer
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
    co_return false;
  }
  const TimePoint started = L.clock.Now();
  cc.tenant.clear();
  cc.status = 0;
  cc.attempts = 0;
  cc.streamed = false;
  bool keep = co_await Handle(L, client, lowest, cc, p);
  const common::Duration took = L.clock.Now() - started;
  if (!cc.streamed) L.latency.Observe(cc.tenant, cc.status, took);
  if (cc.attempts > 0) L.requests.Request(cc.attempts, took);
  co_return keep;
}

namespace {

template <class Stream>
awaitable<void> Serve(Loop& L, Stream& client, Deadline& lowest, std::string peer_ip,
                      bool h2 = false) {
  const RouterConfig& config = L.config;
  ClientConn cc;
  cc.peer_ip = std::move(peer_ip);
  beast::flat_buffer& buf = cc.buf;
  if (h2) {
    co_await ServeH2(L, client, lowest, cc.peer_ip, buf);
    co_return;
  }
  // h2c with prior knowledge: the connection preface, where an HTTP/1.1
  // request line would be.
  lowest.Arm(config.limits.header_timeout);
  for (;;) {
    error_code ec;
    size_t n = co_await client.async_read_some(buf.prepare(4096), Redirect(ec));
    if (ec) co_return;
    buf.commit(n);
    std::string_view got(static_cast<const char*>(buf.data().data()), buf.size());
    const size_t k = std::min(got.size(), kH2Preface.size());
    if (got.substr(0, k) != kH2Preface.substr(0, k)) break;  // HTTP/1.1
    if (k == kH2Preface.size()) {
      co_await ServeH2(L, client, lowest, cc.peer_ip, buf);
      co_return;
    }
  }
  for (bool first = true;; first = false) {
    error_code ec;
    if (!first && buf.size() == 0) {
      // Between requests: the idle timeout. The head itself then gets the
      // (shorter) header timeout, against slowloris.
      lowest.Arm(config.limits.idle_timeout);
      L.idle_clients.insert(&lowest);
      size_t n = co_await client.async_read_some(buf.prepare(4096), Redirect(ec));
      L.idle_clients.erase(&lowest);
      if (ec) co_return;
      buf.commit(n);
    }
    if (!co_await ServeRequest(L, client, lowest, cc)) co_return;
    // A large chunked answer grew them: an idle connection keeps no more.
    if (cc.pending.capacity() > 4096) std::string().swap(cc.pending);
  }
}

}  // namespace

awaitable<void> Accept(Loop& L) {
  for (;;) {
    error_code ec;
    Socket sock = co_await L.acceptor->async_accept(L.ioc.get_executor(), Redirect(ec));
    if (ec) {
      if (ec == net::error::operation_aborted || !L.acceptor->is_open()) co_return;
      // Out of descriptors: pause accepting (common::kAcceptPause); open
      // connections are served meanwhile. Logged once per run of failures.
      if (common::OutOfDescriptors(ec)) {
        Inc(L.stats.accept_pauses);
        if (!L.accept_paused) spdlog::error("router: accept: {}; pausing accepts", ec.message());
        L.accept_paused = true;
        net::steady_timer pause(L.ioc, common::kAcceptPause);
        co_await pause.async_wait(Redirect(ec));
        continue;
      }
      spdlog::warn("router: accept: {}", ec.message());
      continue;
    }
    if (L.accept_paused) spdlog::info("router: accepting again");
    L.accept_paused = false;
    Inc(L.stats.connections);
    // Counted open from here to its coroutine's end (a drain waits for 0).
    auto open = std::make_shared<InFlight>(L.stats.open_connections);
    sock.set_option(tcp::no_delay(true), ec);
    std::string peer_ip = sock.remote_endpoint(ec).address().to_string();
    if (!L.tls) {
      net::co_spawn(
          L.ioc,
          [&L, open, s = std::move(sock),
           peer_ip = std::move(peer_ip)]() mutable -> awaitable<void> {
            Deadline d(L, s);
            co_await Serve(L, s, d, std::move(peer_ip));
          },
          net::detached);
    } else {
      net::co_spawn(
          L.ioc,
          [&L, open, ctx = L.tls, s = beast::ssl_stream<Socket>(std::move(sock), *L.tls),
           peer_ip = std::move(peer_ip)]() mutable -> awaitable<void> {
            Deadline d(L, beast::get_lowest_layer(s));
            error_code hec;
            d.Arm(L.config.limits.header_timeout);
            co_await s.async_handshake(ssl::stream_base::server, Redirect(hec));
            if (hec) {
              Inc(L.stats.tls_handshake_failures);
              co_return;
            }
            // ALPN chose the protocol (tls_contexts.cc offers h2 first).
            const unsigned char* alpn = nullptr;
            unsigned alpn_len = 0;
            SSL_get0_alpn_selected(s.native_handle(), &alpn, &alpn_len);
            const bool h2 = alpn_len == 2 && alpn[0] == 'h' && alpn[1] == '2';
            co_await Serve(L, s, d, std::move(peer_ip), h2);
            d.Arm(milliseconds(1000));
            co_await s.async_shutdown(Redirect(hec));
          },
          net::detached);
    }
  }
}

template awaitable<bool> ServeRequest<H2RestStream>(Loop&, H2RestStream&, Deadline&, ClientConn&);

}  // namespace gpuha::router
