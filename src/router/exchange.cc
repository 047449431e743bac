#include "router/exchange.h"

#include <algorithm>
#include <array>
#include <limits>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "router/h2_rest.h"
#include "router/tls_contexts.h"

namespace gpuha::router {

RelayFraming DecideRelayFraming(bool head_request, int status, bool chunked,
                                std::optional<uint64_t> content_length, bool upstream_keep_alive,
                                unsigned client_version, bool client_keep_alive) {
  RelayFraming f;
  f.upstream_reusable = upstream_keep_alive;
  f.client_keep_alive = client_keep_alive;
  f.head_only = head_request || status == 204 || status == 304;
  if (f.head_only) {
    if (content_length) {
      f.down = Framing::kLength;
      f.length = *content_length;
    }
  } else if (chunked) {
    f.down = Framing::kChunked;
  } else if (content_length) {
    f.down = Framing::kLength;
    f.length = *content_length;
  } else {
    f.down = Framing::kChunked;  // body until close: re-framed for keep-alive
    f.upstream_reusable = false;
  }
  if (f.down == Framing::kChunked && client_version < 11) {
    // HTTP/1.0 clients know no chunking: the body ends when we close.
    f.down = Framing::kNone;
    f.client_keep_alive = false;
    f.close_client = true;
  }
  return f;
}

void FrameForClient(Framing down, std::string_view bytes, std::string* out) {
  if (down == Framing::kChunked) {
    AppendChunkHeader(bytes.size(), out);
    out->append(bytes);
    out->append("\r\n");
  } else {
    out->append(bytes);
  }
}

namespace {

template <class Message>
std::string_view ContentType(const Message& m) {
  auto v = m[http::field::content_type];
  return std::string_view(v.data(), v.size());
}

bool IsEventStream(std::string_view content_type) {
  std::string_view t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  return absl::EqualsIgnoreCase(absl::string_view(t.data(), t.size()), "text/event-stream");
}

// An LLM token stream, event by event: whole events only reach the client,
// each as soon as it arrives; tokens are timed for the stall verdict. On a
// break the connection is dropped and `out.sse_broken` set: the caller may
// continue the answer elsewhere.
template <class Stream>
awaitable<void> RelayEvents(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                            std::unique_ptr<UpConn>& conn, ResponseParser<http::buffer_body>& rp,
                            UpstreamState& up, const OutgoingRequest& req,
                            const RelayFraming& framing, ExchangeResult& out) {
  const RouterConfig& config = L.config;
  SseContinuity& sc = *req.sse;
  auto& res = rp.get();
  error_code ec;
  std::string& pending = cc.pending;
  const Framing down = req.continuation ? req.client_down : framing.down;
  out.down = down;
  // Closed after this answer when it says so (a drain, the client's ask).
  out.close_client = down == Framing::kNone || (!req.continuation && !framing.client_keep_alive);
  if (!req.continuation) {
    Inc(L.stats.sse_streams);
    out.streamed = true;
    pending.clear();
    AppendClientHead(res, down, framing.length, framing.client_keep_alive,
                     AdvertisedKeepAlive(config.limits.idle_timeout), &pending);
    lowest.Arm(config.limits.body_timeout);
    co_await net::async_write(client, net::buffer(pending), Redirect(ec));
    if (ec) {
      out.client_gone = true;
      co_return;
    }
  }
  out.started = true;
  // Watched by the sweep (JudgeProgress) from here: first for the first
  // token within the learned time to first token, then for each next one.
  TimePoint last = L.clock.Now();
  conn->waiting_since = last;
  conn->expect = up.first_token.Window();
  conn->hung_cancel = false;
  up.streaming.push_back(*conn);
  bool first = true;
  bool ok = true;
  Chunk chunk(L);
  std::string events;
  while (!rp.is_done()) {
    res.body().data = chunk.get();
    res.body().size = kChunk;
    conn->deadline.Arm(config.limits.response_timeout);
    // A Cancel (a verdict, or the drain's timeout) that came while this
    // read's completion was already queued, or while the client was being
    // written to, had no wait to end: it ends the stream here.
    if (!conn->hung_cancel) co_await ReadSome(*conn, conn->buf, rp, ec);
    if (!ec && conn->hung_cancel) ec = net::error::operation_aborted;
    if (ec == http::error::end_of_stream && !rp.chunked()) {
      ec = {};  // a body delimited by close: ended
      break;
    }
    if (ec) {
      ok = false;
      break;
    }
    size_t n = kChunk - res.body().size;
    if (n == 0) continue;
    events.clear();
    int tokens = sc.Feed(std::string_view(chunk.get(), n), &events);
    if (tokens > 0) {
      const TimePoint now = L.clock.Now();
      // Any token is the engine's progress: its streams interleave.
      if (first) {
        up.first_token.Learn(now - last);
      } else {
        up.tokens.Learn(now - last);  // as judged: the gap between reads
      }
      up.tokens.Progressed(now);
      first = false;
      last = now;
      conn->waiting_since = now;
      conn->expect = {};
      L.stats.sse_tokens.fetch_add(static_cast<uint64_t>(tokens), std::memory_order_relaxed);
    }
    if (sc.upstream_error()) {
      ok = false;
      break;
    }
    if (events.empty()) continue;
    pending.clear();
    FrameForClient(down, events, &pending);
    lowest.Arm(config.limits.body_timeout);
    conn->client_paused = true;  // its upstream's bytes wait on the client, not on the router
    co_await net::async_write(client, net::buffer(pending), Redirect(ec));
    conn->client_paused = false;
    if (ec) {
      out.client_gone = true;
      co_return;
    }
    // A slow client's write is not the upstream's silence.
    conn->waiting_since = std::max(conn->waiting_since, L.clock.Now());
  }
  conn->waiting_hook.unlink();
  if (ok && sc.done()) {
    if (req.pipe) req.pipe->Release();
    if (down == Framing::kChunked) {
      lowest.Arm(config.limits.body_timeout);
      co_await net::async_write(client, net::buffer("0\r\n\r\n", 5), Redirect(ec));
      if (ec) {
        out.client_gone = true;
        co_return;
      }
    }
    if (UpstreamReusable(framing.upstream_reusable, rp.is_done(), conn->buf.size())) {
      PoolIdle(L, up, std::move(conn), res);
    }
    co_return;
  }
  out.sse_broken = true;
  out.hung = conn->hung_cancel;
  if (sc.upstream_error()) {
    out.why = absl::StrCat("reported an error mid-answer: ", *sc.upstream_error());
  } else if (conn->hung_cancel) {
    out.why = absl::StrCat("hung or stalled mid-answer, after ", sc.tokens(), " tokens");
  } else if (conn->deadline.expired()) {
    out.timeout = true;
    out.why = absl::StrCat("no token within ", config.limits.response_timeout.count(), " ms");
  } else if (ok) {
    out.why = "ended the answer without [DONE]";
  } else {
    out.why = absl::StrCat("broke mid-answer: ", ec.message());
  }
  // A connection broken mid-answer is the upstream's failure; a verdict
  // already ejected it, and an answer ended early or an error event is
  // not a connection failure.
  if (!ok && !conn->hung_cancel && !sc.upstream_error()) ConnectionFailed(L, up);
}

}  // namespace

template <class Stream>
awaitable<void> Exchange(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                         RequestParser<http::buffer_body>& p, UpstreamState& up,
                         const OutgoingRequest& req, ExchangeResult& out) {
  const RouterConfig& config = L.config;
  const std::string& body = req.body;
  const bool body_complete = req.body_complete;
  const Framing up_framing = req.framing;
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
    conn = TakeIdle(L, up);
    if (conn) {
      pooled = true;
      Inc(L.stats.upstream_reuses);
    } else {
      conn = std::make_unique<UpConn>(L, L.ioc.get_executor());
      conn->deadline.Arm(config.limits.connect_timeout);
      co_await conn->s.async_connect(up.endpoint, Redirect(ec));
      Inc(L.stats.upstream_connects);
      if (ec) {
        // Out of descriptors is this router's trouble, not the upstream's:
        // the request fails, the upstream is not ejected.
        fail(conn->deadline.expired() ? "connect timeout" : "connect: " + ec.message(),
             !common::OutOfDescriptors(ec));
        co_return;
      }
      conn->s.set_option(tcp::no_delay(true), ec);
      if (L.upstream_tls) {
        conn->tls_ctx = L.upstream_tls;
        conn->tls = std::make_unique<ssl::stream<Socket&>>(conn->s, *conn->tls_ctx);
        PrepareUpstreamTls(*conn->tls, UpstreamTlsName(config, up.endpoint.address().to_string()));
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
      if (may_resend && up.usable(L.clock.Now())) {
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
      conn->waiting_since = L.clock.Now();
      conn->expect = req.expect;
      conn->hung_cancel = false;  // a pooled connection's earlier verdict is not this request's
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
    } else if (may_resend && up.usable(L.clock.Now()) && conn->buf.size() == 0 &&
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

  auto& res = rp->get();
  int status = res.result_int();
  {
    const TimePoint now = L.clock.Now();
    UpstreamAnswered(L, up, status >= 500, now, now - conn->waiting_since);
  }
  // A re-send to the standby for an answer of 500, 502, 503 or 504: a
  // server whose readiness says 200 while every inference fails (a broken
  // CUDA context) loses no request.
  if (req.retry_5xx && (status == 500 || status == 502 || status == 503 || status == 504)) {
    out.retryable = true;
    out.upstream_5xx = true;
    out.why = absl::StrCat("answered ", status);
    co_return;  // the connection closes with its unread body
  }
  // An upstream whose schema forbids fields it does not know (OpenAI's
  // own API does) refuses the return_token_ids the router added: the same
  // request without it follows (Handle).
  if (req.token_ids_added && status == 400) {
    out.retryable = true;
    out.refused_token_ids = true;
    out.why = "answered 400 to the return_token_ids the router added";
    co_return;  // the connection closes with its unread body
  }
  const bool event_stream = req.sse != nullptr && status == 200 && !head_request &&
                            !rp->content_length() && IsEventStream(ContentType(res));
  if (req.continuation && !event_stream) {
    // The client's answer has begun: only the rest of an event stream can follow it.
    out.retryable = true;
    out.why = status == 200 ? std::string("the continuation's answer is not an event stream")
                            : absl::StrCat("answered the continuation ", status);
    co_return;
  }
  // Relay the response. From the first byte on, the client owns the outcome.
  if (!req.continuation) {
    Inc(L.stats.upstream_class[std::min(5, status / 100)]);
    out.status = status;
  }
  const RelayFraming framing = DecideRelayFraming(
      head_request, status, rp->chunked(),
      rp->content_length() ? std::optional<uint64_t>(*rp->content_length()) : std::nullopt,
      rp->keep_alive(), method_req.version(),
      // Draining since the request came: its answer says Connection: close.
      req.keep_alive && !L.shared.draining.load(std::memory_order_relaxed));
  if (event_stream) {
    co_await RelayEvents(L, client, lowest, cc, conn, *rp, up, req, framing, out);
    co_return;
  }
  const Framing down = framing.down;
  const uint64_t len = framing.length;
  const bool head_only = framing.head_only;
  out.close_client = framing.close_client || !framing.client_keep_alive;
  std::string& pending = cc.pending;
  pending.clear();
  AppendClientHead(res, down, len, framing.client_keep_alive,
                   AdvertisedKeepAlive(config.limits.idle_timeout), &pending);
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
    if (first == remaining && req.pipe) req.pipe->Release();
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
      if (remaining == 0 && req.pipe) req.pipe->Release();
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
      // Out the moment nothing more is buffered: a streamed body (SSE on
      // any route, a long poll) reaches the client as it is produced.
      if (pending.size() >= kChunk || rp->is_done() || conn->buf.size() == 0) {
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
    if (ok && req.pipe) req.pipe->Release();
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
  // Relayed whole (a Content-Length body bypasses the parser, which is then
  // not done: `ok` is the answer's end here).
  if (UpstreamReusable(framing.upstream_reusable, /*answer_done=*/true, conn->buf.size())) {
    PoolIdle(L, up, std::move(conn), res);
  }
}
template awaitable<void> Exchange<Socket>(Loop&, Socket&, Deadline&, ClientConn&,
                                          RequestParser<http::buffer_body>&, UpstreamState&,
                                          const OutgoingRequest&, ExchangeResult&);
template awaitable<void> Exchange<beast::ssl_stream<Socket>>(Loop&, beast::ssl_stream<Socket>&,
                                                             Deadline&, ClientConn&,
                                                             RequestParser<http::buffer_body>&,
                                                             UpstreamState&, const OutgoingRequest&,
                                                             ExchangeResult&);

template awaitable<void> Exchange<H2RestStream>(Loop&, H2RestStream&, Deadline&, ClientConn&,
                                                RequestParser<http::buffer_body>&, UpstreamState&,
                                                const OutgoingRequest&, ExchangeResult&);

}  // namespace gpuha::router
