// Exchange: one attempt of one request on one upstream, in the manner of an
// Envoy upstream request. It takes a pooled connection (or connects, with TLS
// when configured), sends the head and the buffered body, streams the rest
// of a large body, awaits the response head and relays the response to the
// client. Until the response head arrives a failure is retryable and the
// caller may try the stream's standby; from the first byte relayed, the
// client owns the outcome, except for an LLM token stream, whose answer the
// caller may continue on the standby (sse_broken).
//
//   ExchangeResult out;
//   co_await Exchange(L, client, lowest, cc, parser, upstream, {body, complete, framing, keep},
//                     out);
//   if (out.retryable) ... next upstream
//
// Internal to the router. Thread-safety: runs on the loop that owns `up`.
#pragma once

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "router/client_conn.h"
#include "router/loop.h"
#include "router/pipeline.h"
#include "router/request.h"
#include "router/sse_relay.h"

namespace gpuha::router {

struct ExchangeResult {
  bool started = false;        // the response head went to the client
  bool client_gone = false;    // the client vanished; close quietly
  bool body_consumed = false;  // the request body was streamed and cannot be re-sent
  bool retryable = false;      // failed before the response started
  bool timeout = false;
  bool hung = false;          // cancelled: the upstream was judged hung or stalled
  bool upstream_5xx = false;  // answered 500/502/503/504, discarded for a re-send
  bool close_client = false;  // the response could not be completed
  // A token stream broke mid-answer (the upstream failed, stalled, or
  // ended it without [DONE]); the client's answer is open, and the rest
  // may be asked of the next upstream (SseContinuity).
  bool sse_broken = false;
  Framing down = Framing::kNone;   // the client's body framing, once started
  int status = 0;                  // the upstream's status relayed to the client (0: none)
  bool streamed = false;           // the answer relayed is a token stream (SSE)
  bool refused_token_ids = false;  // answered 400 to the return_token_ids the router added
  std::string why;
};

// What the attempt sends beyond the head in cc.head.
struct OutgoingRequest {
  const std::string& body;  // buffered (up to the retry buffer)
  bool body_complete;       // false: the rest streams from the client
  Framing framing;          // of the body to the upstream
  bool keep_alive;          // the client's
  // A 500, 502, 503 or 504 is discarded for the next upstream rather than
  // relayed (the first attempt of a request with a buffered body, when a
  // standby follows).
  bool retry_5xx = false;
  // The body carries return_token_ids the router added: a 400 is discarded
  // (out.refused_token_ids) for the same request without it.
  bool token_ids_added = false;
  // What the request declared it takes (X-Gpuha-Expect-Ms); 0: nothing.
  common::Duration expect{};
  // An LLM route's request: an event-stream answer is relayed event by
  // event through it, and followed.
  SseContinuity* sse = nullptr;
  // The rest of an answer already begun (sse set): the upstream's head is
  // not relayed, and only a 200 event stream is taken; the client's body
  // goes on in `client_down` framing.
  bool continuation = false;
  Framing client_down = Framing::kNone;
  // Told when the answer is whole, before its last bytes are written
  // (Pipeline::Release).
  Pipeline* pipe = nullptr;
};

// Events for the client in its body framing: a chunk, or raw bytes.
void FrameForClient(Framing down, std::string_view bytes, std::string* out);

// How a response goes back to the client, decided from its head alone.
struct RelayFraming {
  Framing down = Framing::kNone;   // the body's framing to the client
  uint64_t length = 0;             // with kLength
  bool head_only = false;          // HEAD, 204 or 304: no body follows
  bool upstream_reusable = false;  // the upstream connection may go back to the pool
  bool client_keep_alive = false;
  bool close_client = false;  // the body ends when the client connection closes
};
// A body delimited by the upstream closing is re-framed as chunked for
// keep-alive (and the upstream connection is not reused); an HTTP/1.0
// client, which knows no chunking, gets it delimited by close instead.
RelayFraming DecideRelayFraming(bool head_request, int status, bool chunked,
                                std::optional<uint64_t> content_length, bool upstream_keep_alive,
                                unsigned client_version, bool client_keep_alive);

template <class Stream>
awaitable<void> Exchange(Loop& L, Stream& client, Deadline& lowest, ClientConn& cc,
                         RequestParser<http::buffer_body>& p, UpstreamState& up,
                         const OutgoingRequest& req, ExchangeResult& out);

extern template awaitable<void> Exchange<Socket>(Loop&, Socket&, Deadline&, ClientConn&,
                                                 RequestParser<http::buffer_body>&, UpstreamState&,
                                                 const OutgoingRequest&, ExchangeResult&);
extern template awaitable<void> Exchange<beast::ssl_stream<Socket>>(
    Loop&, beast::ssl_stream<Socket>&, Deadline&, ClientConn&, RequestParser<http::buffer_body>&,
    UpstreamState&, const OutgoingRequest&, ExchangeResult&);

}  // namespace gpuha::router
