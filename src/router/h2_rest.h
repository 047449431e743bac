// REST and SSE over HTTP/2 (TLS by ALPN, or h2c with prior knowledge): an
// HTTP/2 stream that is not a gRPC call is served by the HTTP/1.1 request
// path (client_conn.cc's ServeRequest, exchange.cc), the one that admits,
// orders the upstreams, fails over, re-sends 5xx and continues token
// streams, so an HTTP/2 client gets every rule an HTTP/1.1 client gets.
// The codecs sit at the edge: H2RestStream is an HTTP/1.1 byte stream over
// one HTTP/2 stream. Its request is the HTTP/2 request written as HTTP/1.1
// (whole: an HTTP/2 request body is held up to limits.retry_buffer_bytes,
// as a unary gRPC call's is); what the pipeline writes back is parsed as
// an HTTP/1.1 response and sent on as HEADERS and DATA as it comes, so an
// SSE event reaches the client when its upstream sent it. An answer that
// breaks partway resets the stream (RST_STREAM), as closing the connection
// tells an HTTP/1.1 client.
//
// Internal to the router. Thread-safety: a stream lives on its loop.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "router/grpc_call.h"

namespace gpuha::router {

// The HTTP/2 request of `s` (its headers and whole body) as an HTTP/1.1
// request: `Host` from :authority, Content-Length from the body, cookies
// joined, and none of the fields that belong to one HTTP/1.1 connection
// (Connection, Keep-Alive, Transfer-Encoding, Upgrade, TE, Expect). An
// error names the field it cannot carry.
absl::StatusOr<std::string> Http1Request(const H2Stream& s);

// The request bytes live in the ClientConn's buffer before the pipeline
// runs; a read finds the stream's end.
class H2RestStream {
 public:
  using executor_type = Executor;
  H2RestStream(Loop& L, std::shared_ptr<grpc_proxy::H2ClientConn> conn, int32_t id, bool head);
  executor_type get_executor() const { return L_.ioc.get_executor(); }
  // The deadline the pipeline arms for this request (body_timeout while it
  // writes): its own, as each HTTP/2 stream must not cancel its connection.
  Deadline& deadline() { return deadline_; }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers&, Token&& token) {
    return net::async_initiate<Token, void(error_code, size_t)>(
        [ex = get_executor()](auto handler) {
          net::post(ex, [h = std::move(handler)]() mutable {
            std::move(h)(error_code(net::error::eof), size_t{0});
          });
        },
        token);
  }

  // Takes the pipeline's bytes at once (parsed, handed to the HTTP/2
  // session); completes once the stream's unsent answer is under its
  // bound (H2Limits::max_unsent_answer_bytes), so a client that reads
  // slowly slows its upstream's relay, as TCP does for HTTP/1.1.
  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    error_code ec;
    size_t n = 0;
    for (auto it = net::buffer_sequence_begin(buffers);
         it != net::buffer_sequence_end(buffers) && !ec; ++it) {
      net::const_buffer b(*it);
      ec = Take({static_cast<const char*>(b.data()), b.size()});
      if (!ec) n += b.size();
    }
    return net::async_initiate<Token, void(error_code, size_t)>(
        [this](auto handler, error_code ec, size_t n) {
          if (!ec && Backlogged()) {
            net::co_spawn(get_executor(), CompleteWhenRoom(this, std::move(handler), n),
                          net::detached);
            return;
          }
          net::post(get_executor(),
                    [h = std::move(handler), ec, n]() mutable { std::move(h)(ec, n); });
        },
        token, ec, n);
  }

  // The pipeline is done: a whole answer has ended its stream; any other
  // (none, or one cut partway) resets it.
  void End();

 private:
  error_code Take(std::string_view bytes);
  void SendHeaders();
  bool Gone() const;
  bool Backlogged() const;
  awaitable<error_code> WaitForRoom();
  template <class Handler>
  static awaitable<void> CompleteWhenRoom(H2RestStream* self, Handler h, size_t n) {
    error_code ec = co_await self->WaitForRoom();
    net::post(self->get_executor(),
              [h = std::move(h), ec, n]() mutable { std::move(h)(ec, ec ? 0 : n); });
  }

  Loop& L_;
  std::shared_ptr<grpc_proxy::H2ClientConn> conn_;
  const int32_t id_;
  Socket unused_;  // Deadline's cancel target: this stream has no socket of its own
  Deadline deadline_;
  Timer wait_;
  std::string in_;  // the pipeline's bytes not yet parsed
  http::response_parser<http::buffer_body> parser_;
  bool headers_sent_ = false;
  bool finished_ = false;
};

// Serves REST stream `id` of `conn` whose request is complete.
awaitable<void> HandleRest(Loop& L, std::shared_ptr<grpc_proxy::H2ClientConn> conn, int32_t id);

}  // namespace gpuha::router
