// The router's HTTP/2 client connection: its reader and its writer around
// an H2Server, spawning each gRPC call it reads (grpc_call.cc, unary;
// grpc_stream.cc, streaming), routed and failed over as an HTTP/1.1
// request is (client_conn.cc), and each REST or SSE request, which the
// HTTP/1.1 request path serves (h2_rest.cc).
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/ssl.hpp>

#include "common/log.h"
#include "router/grpc_call.h"
#include "router/h2_rest.h"

namespace gpuha::router {
namespace {

using grpc_proxy::CallCount;
using grpc_proxy::H2ClientConn;
using grpc_proxy::HandleCall;
using grpc_proxy::HandleStream;
using grpc_proxy::kModelStreamInfer;
using grpc_proxy::LimitsOf;

// Writes what the session has to send, until the connection closes.
template <class Stream>
awaitable<void> Writer(Loop& L, Stream& client, std::shared_ptr<H2ClientConn> conn) {
  // Its own deadline: the reader's (H2ClientConn::ArmReader) is not the
  // writer's, and each must not overwrite the other's.
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
        // Not gRPC: REST or SSE, served by the HTTP/1.1 request path.
        net::co_spawn(L.ioc, s.Grpc() ? HandleCall(L, c, s.id) : HandleRest(L, c, s.id),
                      net::detached);
      },
      [&L, &weak](H2Stream& s) {
        // A streaming call is worked on from its headers: its messages
        // come (and are answered) while the client's stream is open.
        auto c = weak.lock();
        if (!c || !s.Grpc() || s.Header(":path") != kModelStreamInfer) return;
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
  // A drain sends it GOAWAY (Router::Drain); one that began before it
  // connected tells it at once.
  L.h2_clients.insert(conn.get());
  struct Unlist {
    Loop& L;
    H2ClientConn* c;
    ~Unlist() { L.h2_clients.erase(c); }
  } unlist{L, conn.get()};
  if (L.shared.draining.load(std::memory_order_relaxed)) conn->h2.ShutdownNotice();
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
