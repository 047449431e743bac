#include "router/client_conn.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/ssl.hpp>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "router/exchange.h"
#include "router/h2_rest.h"
#include "router/h2_server.h"
#include "router/pipeline.h"

namespace gpuha::router {

namespace {

// What an answer still awaited when the drain's timeout passed ends with.
constexpr const char* kDrainExpired =
    "the router is stopping: its drain_timeout passed with this answer still open";

// One HTTP request at the codec's edge of the pipeline (router/pipeline.h):
// its client, its parser, and how its answer is written and ends.
template <class Stream>
struct HttpCall {
  HttpCall(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
           RequestParser<http::buffer_body>& p)
      : L(L),
        client(client),
        lowest(lowest),
        cc(cc),
        p(p),
        pipe(L),
        // A draining router answers this one and closes: the client hears
        // it in the answer (Connection: close) and sends its next request
        // elsewhere.
        keep_alive(p.get().keep_alive() && !L.shared.draining.load(std::memory_order_relaxed)) {}

  // A router-made answer: counted, written. Whether the connection goes on.
  awaitable<bool> Answer(Reason r, std::string detail, int retry_after = 0) {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    pipe.Answering(ReasonStatus(r));
    pipe.Release();
    // An unread request body would be taken for the next request: close.
    bool keep = keep_alive && p.is_done();
    std::string out = ErrorResponse(r, detail, pipe.stream_id(), retry_after, keep);
    error_code wec;
    lowest.Arm(L.config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(out), Redirect(wec));
    co_return keep && !wec;
  }
  awaitable<bool> Refuse(Refusal r) {
    return Answer(r.reason, std::move(r.detail), r.retry_after_s);
  }
  // The last events of a token stream already begun (by value: the
  // coroutine runs after the caller's temporaries are gone).
  awaitable<bool> EndStream(std::string events, bool error) {
    if (error) Inc(L.stats.sse_error_events);
    pipe.Release();
    std::string& out = cc.pending;
    out.clear();
    FrameForClient(client_down, events, &out);
    if (client_down == Framing::kChunked) out.append("0\r\n\r\n");
    error_code wec;
    lowest.Arm(L.config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(out), Redirect(wec));
    co_return keep_alive && !wec && client_down == Framing::kChunked;
  }
  // The body to send in place of the client's (complete, so its length is
  // its size).
  void ReplaceBody(std::string b) {
    body = std::move(b);
    length = body.size();
  }
  // A token stream whose rest cannot be had ends with an error event: the
  // client's parser reports it, instead of taking a cut answer for a whole one.
  awaitable<bool> Cut(std::string why) {
    spdlog::warn("router: stream {}: answer ended with an error event after {} tokens: {}",
                 pipe.stream_id(), sse->tokens(), why);
    return EndStream(SseContinuity::ErrorEvent(why), true);
  }

  Loop& L;
  Stream& client;
  Deadline& lowest;
  ClientConn& cc;
  RequestParser<http::buffer_body>& p;
  Pipeline pipe;
  bool keep_alive;
  // The request body, buffered up to the retry buffer so it can be re-sent.
  std::string body;
  bool complete = false;  // the whole body is in `body`
  Framing framing = Framing::kNone;
  uint64_t length = 0;
  std::chrono::milliseconds expect{};  // X-Gpuha-Expect-Ms
  // An LLM route's request is followed: if its answer is a token stream
  // and the upstream fails mid-answer, the rest is asked of the next.
  std::optional<SseContinuity> sse;
  Framing client_down = Framing::kNone;  // of a token stream begun
};

// The head's checks and the pipeline's admission; the refusal to answer,
// if any. Not a coroutine: no frame on the request path.
template <class Stream>
std::optional<Refusal> AdmitHttp(HttpCall<Stream>& h) {
  const RouterConfig& config = h.L.config;
  auto& req = h.p.get();
  size_t fields = 0;
  for (auto it = req.begin(); it != req.end(); ++it) ++fields;
  if (fields > config.limits.max_headers) {
    h.keep_alive = false;
    return Refusal{Reason::kTooManyHeaders, absl::StrCat(fields, " header fields; the limit is ",
                                                         config.limits.max_headers)};
  }
  // A head whose framing or form the router will not forward.
  if (std::optional<HeadProblem> bad = CheckHead(req)) {
    h.keep_alive = false;
    return Refusal{bad->reason, std::move(bad->detail)};
  }
  if (std::optional<HeadProblem> bad = ReadExpectation(req, &h.expect)) {
    return Refusal{bad->reason, std::move(bad->detail)};
  }
  // Every decision reads the normalized target, and the upstream receives
  // it: "//streams/a", "/./streams/a" and "/streams/b/../a" are all stream a.
  auto target = req.target();
  std::optional<std::string> normal =
      NormalizeTarget(std::string_view(target.data(), target.size()));
  if (!normal) {
    h.keep_alive = false;
    return Refusal{Reason::kBadRequest,
                   "the request target cannot be normalized (not origin or absolute form, a "
                   "bad %-escape, or '..' above the root)"};
  }
  auto hv = req["x-gpuha-stream"];
  return h.pipe.Admit({.api_key = ApiKey(req),
                       .stream_header = std::string_view(hv.data(), hv.size()),
                       .target = *normal,
                       .key_cache = &h.cc.key_cache});
}

// The body's framing upstream, once what can be buffered of it is.
template <class Stream>
void FrameBody(HttpCall<Stream>& h) {
  h.complete = h.p.is_done();
  if (h.complete) {
    if (!h.body.empty() || h.p.content_length() || h.p.chunked()) {
      h.framing = Framing::kLength;
      h.length = h.body.size();
    }
  } else if (h.p.content_length()) {
    h.framing = Framing::kLength;
    h.length = *h.p.content_length();
  } else {
    h.framing = Framing::kChunked;
  }
}

// The body, buffered up to the retry buffer (the rest streams through the
// first attempt). An answer if it broke.
template <class Stream>
awaitable<std::optional<bool>> ReadBody(HttpCall<Stream>& h) {
  const RouterConfig& config = h.L.config;
  auto& req = h.p.get();
  error_code ec;
  if (req[http::field::expect] == "100-continue") {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    h.lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(h.client, net::buffer(kContinue), Redirect(ec));
    if (ec) co_return false;
  }
  Chunk chunk(h.L);
  while (!h.p.is_done() && h.body.size() < config.limits.retry_buffer_bytes) {
    req.body().data = chunk.get();
    req.body().size = kChunk;
    h.lowest.Arm(config.limits.body_timeout);
    co_await ReadSome(h.client, h.cc.buf, h.p, ec);
    if (ec) {
      if (ec == http::error::body_limit) {
        h.keep_alive = false;
        co_return co_await h.Answer(
            Reason::kBodyTooLarge,
            absl::StrCat("body over ", config.limits.max_body_bytes, " bytes"));
      }
      if (ec.category() == http::make_error_code(http::error::bad_chunk).category() &&
          ec != http::error::partial_message && ec != http::error::end_of_stream) {
        h.keep_alive = false;  // a bad chunk size, say: answered, then closed
        co_return co_await h.Answer(Reason::kBadRequest,
                                    absl::StrCat("malformed body: ", ec.message()));
      }
      Inc(h.L.stats.client_aborts);
      co_return false;  // the client went away mid-body
    }
    h.body.append(chunk.get(), kChunk - req.body().size);
  }
  co_return std::nullopt;
}

// An LLM route's POST is followed (SseContinuity): when its answer cannot
// be continued, the token stream still ends with an error event that says why.
template <class Stream>
void FollowLlm(HttpCall<Stream>& h) {
  const RouterConfig& config = h.L.config;
  auto& req = h.p.get();
  if (req.method() != http::verb::post) return;
  const LlmRoute* lr = FindLlmRoute(config.llm, h.pipe.target());
  if (lr == nullptr) return;
  std::optional<LlmCall> call;
  std::string why;
  auto off = req["x-gpuha-continue"];
  if (!config.llm.continuation || !lr->continuation) {
    why = "continuation is off for this route (llm.continuation, llm.routes)";
  } else if (absl::EqualsIgnoreCase(absl::string_view(off.data(), off.size()), "off")) {
    why = "continuation is off for this request (X-Gpuha-Continue: off)";
  } else if (!h.complete) {
    why = absl::StrCat("the request body is over the ", config.limits.retry_buffer_bytes,
                       "-byte retry buffer");
  } else if (absl::StatusOr<LlmCall> c = ReadLlmCall(lr->api, h.body); c.ok()) {
    call = std::move(*c);
  } else {
    why = std::string(c.status().message());
  }
  TokenIdContinuation ids{
      .ask = config.llm.token_ids && h.body.size() <= kTokenIdsMaxRequestBytes,
      .completions_path =
          lr->api == LlmApi::kChat ? CompletionsRouteFor(config.llm, *lr) : std::string(),
      .off_because = config.llm.token_ids
                         ? absl::StrCat("the request body is over ", kTokenIdsMaxRequestBytes,
                                        " bytes: its prompt's IDs would be too many")
                         : "llm.token_ids is off"};
  h.sse.emplace(lr->api, std::move(call), std::move(why), config.llm.max_text_bytes,
                std::move(ids));
  // The request asks for token IDs (return_token_ids) where the client's
  // did not.
  if (std::optional<std::string> b = h.sse->UpstreamBody()) h.ReplaceBody(std::move(*b));
}

// The return_token_ids the router added taken out of the request: `up`
// refused it (a 400), now or before.
template <class Stream>
void StopAskingForIds(HttpCall<Stream>& h, const UpstreamState& up, const char* how) {
  if (std::optional<std::string> b =
          h.sse->StopAskingForIds(absl::StrCat(up.node, " refused return_token_ids", how))) {
    h.ReplaceBody(std::move(*b));
  }
}

// Where an attempt goes: the request's target; for a chat continued on its
// token IDs, the completions route, with the request's query (made in
// `storage`: the common path copies nothing).
template <class Stream>
std::string_view AttemptTarget(HttpCall<Stream>& h, bool continuing, std::string* storage) {
  const std::string_view t = h.pipe.target();
  if (!continuing || h.sse->continuation_path().empty()) return t;
  *storage = h.sse->continuation_path();
  if (size_t query = t.find('?'); query != std::string_view::npos) storage->append(t.substr(query));
  return *storage;
}

// A token stream broke mid-answer on the current upstream: its end, an
// error event, or nullopt when the rest is to be asked of the next one
// (whose request is then `*continuation_body`).
template <class Stream>
awaitable<std::optional<bool>> AfterBrokenAnswer(HttpCall<Stream>& h, const ExchangeResult& f,
                                                 bool was_continuing,
                                                 std::string* continuation_body) {
  const RouterConfig& config = h.L.config;
  SseContinuity& sse = *h.sse;
  if (!was_continuing) h.client_down = f.down;
  h.pipe.Lived();
  h.pipe.Failed({.why = f.why, .hung = f.hung});
  const std::string& last = h.pipe.last_failure();
  if (std::optional<std::string> end = sse.OnlyTheEndIsMissing()) {
    co_return co_await h.EndStream(*end, false);
  }
  if (h.L.shared.drain_expired.load(std::memory_order_relaxed)) {
    co_return co_await h.Cut(kDrainExpired);
  }
  if (std::optional<std::string> why = sse.CannotContinue()) {
    co_return co_await h.Cut(absl::StrCat(*why, "; the answer broke: ", last));
  }
  if (sse.continuations() >= config.llm.max_continuations) {
    co_return co_await h.Cut(absl::StrCat("continued ", sse.continuations(),
                                          " times already (llm.max_continuations); ", last));
  }
  if (!h.pipe.HasNext()) {
    co_return co_await h.Cut(absl::StrCat("no standby to continue the answer on; ", last));
  }
  // A standby known to refuse return_token_ids is asked by text.
  if (h.pipe.upcoming().refuses_token_ids) StopAskingForIds(h, h.pipe.upcoming(), " before");
  *continuation_body = sse.BeginContinuation();
  spdlog::info("router: stream {}: answer broke after {} tokens ({}); continuing it on {} {}",
               h.pipe.stream_id(), sse.tokens(), last, h.pipe.upcoming().node, sse.How());
  co_return std::nullopt;
}

// How a request ends once no attempt is left: its answer relayed, the
// token stream's end, or the router's answer.
template <class Stream>
awaitable<bool> Ended(HttpCall<Stream>& h, const ExchangeResult& f, bool continuing,
                      const std::optional<Refusal>& refused) {
  const RouterConfig& config = h.L.config;
  const std::string& last = h.pipe.last_failure();
  if (refused && continuing) {
    co_return co_await h.Cut(absl::StrCat("the retry budget is spent; the answer broke: ", last));
  }
  if (refused) co_return co_await h.Refuse(*refused);
  if (f.client_gone) {
    Inc(h.L.stats.client_aborts);
    co_return false;
  }
  if (continuing) {
    // Not started: failed before its head, or answered what cannot follow
    // (a protocol upgrade): the client's open answer still needs its end.
    if (f.retryable || !f.started) {
      co_return co_await h.Cut(
          absl::StrCat("the standby failed before continuing the answer: ", last));
    }
    co_return h.keep_alive && !f.close_client;
  }
  if (f.started) co_return h.keep_alive && !f.close_client;
  if (f.body_consumed) {
    h.keep_alive = false;
    co_return co_await h.Answer(
        Reason::kNotReplayable,
        absl::StrCat("the request body was streamed past the ", config.limits.retry_buffer_bytes,
                     "-byte retry buffer and the upstream failed (", last, "); not retried"));
  }
  co_return co_await h.Refuse(h.pipe.Exhausted());
}

// One request through the pipeline: admitted, its body read, followed if
// an LLM route's, and tried on the pipeline's upstreams through Exchange
// until one answers. One coroutine frame on the common path (a request
// whose body came with its head, answered by its first upstream).
template <class Stream>
awaitable<bool> Handle(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                       RequestParser<http::buffer_body>& p) {
  const RouterConfig& config = L.config;
  HttpCall<Stream> h(L, client, lowest, cc, p);
  if (std::optional<Refusal> r = AdmitHttp(h)) co_return co_await h.Refuse(std::move(*r));
  if (!p.is_done()) {
    if (std::optional<bool> broke = co_await ReadBody(h)) co_return *broke;
  }
  FrameBody(h);
  FollowLlm(h);
  ExchangeResult f;
  // The client's answer began on an earlier upstream and broke: the next
  // one is asked for the rest (continuation_body).
  bool continuing = false;
  std::string continuation_body;
  // Sent again without the return_token_ids it answered 400 to.
  const UpstreamState* sent_without_ids = nullptr;
  std::optional<Refusal> refused;
  for (;;) {
    if (h.pipe.attempts() > 0 && f.body_consumed) break;
    UpstreamState* next = h.pipe.Next(&refused);
    if (next == nullptr) break;
    UpstreamState& up = *next;
    // An upstream that refused return_token_ids before gets the request as
    // the client sent it.
    if (!continuing && h.sse && up.refuses_token_ids) StopAskingForIds(h, up, " before");
    const bool token_ids_added = !continuing && h.sse && h.sse->added_ids();
    const std::string& send = continuing ? continuation_body : h.body;
    const Framing send_framing = continuing ? Framing::kLength : h.framing;
    cc.head.clear();
    std::string target;
    AppendUpstreamHead(p.get(), AttemptTarget(h, continuing, &target), up.address,
                       h.pipe.tenant_name(), h.pipe.stream_id(), cc.peer_ip, send_framing,
                       continuing ? send.size() : h.length, &cc.head);
    f = ExchangeResult{};
    const bool retry_5xx = config.retry_5xx && h.pipe.HasNext() && h.complete && !continuing;
    if (continuing) {
      Inc(L.stats.sse_continuations);
      if (h.sse->by_token_ids()) Inc(L.stats.sse_token_id_continuations);
    }
    co_await Exchange(
        L, client, lowest, cc, p, up,
        {send, h.complete || continuing, send_framing, h.keep_alive, retry_5xx, token_ids_added,
         h.expect, h.sse ? &*h.sse : nullptr, continuing, h.client_down, &h.pipe},
        f);
    if (f.refused_token_ids) {
      // The same upstream, the request as the client sent it.
      spdlog::info("router: stream {}: {} answered 400 to return_token_ids; sent again without it",
                   h.pipe.stream_id(), up.node);
      StopAskingForIds(h, up, " (400)");
      sent_without_ids = &up;
      h.pipe.SameAgain();
      continue;
    }
    // Taken without the field: the upstream refuses it, and is asked no
    // more. A 400 again was the client's request, not the field.
    if (std::exchange(sent_without_ids, nullptr) == &up && f.status != 0 && f.status != 400) {
      up.refuses_token_ids = true;
    }
    if (f.status != 0) h.pipe.Answering(f.status);
    if (f.streamed) h.pipe.Streaming();
    if (f.sse_broken) {
      const bool was_continuing = continuing;
      continuing = true;
      std::optional<bool> end =
          co_await AfterBrokenAnswer(h, f, was_continuing, &continuation_body);
      if (end) co_return *end;
      continue;
    }
    if (!f.retryable) break;
    if (!continuing && L.shared.drain_expired.load(std::memory_order_relaxed)) {
      h.keep_alive = false;
      co_return co_await h.Answer(Reason::kDraining, kDrainExpired);
    }
    h.pipe.Failed({.why = f.why,
                   .hung = f.hung,
                   .answered = f.upstream_5xx,
                   .server_error = f.upstream_5xx,
                   .timeout = f.timeout});
  }
  if (f.started && !continuing && !f.client_gone) co_return h.keep_alive && !f.close_client;
  co_return co_await Ended(h, f, continuing, refused);
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
  co_return co_await Handle(L, client, lowest, cc, p);
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
