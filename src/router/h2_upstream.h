// H2Upstream: HTTP/2 connections (h2c, or h2 over TLS with upstream_tls) to
// one upstream's gRPC port, shared by every call a loop sends there: each
// connection multiplexes up to the
// upstream's SETTINGS_MAX_CONCURRENT_STREAMS calls, and a new one is opened
// (up to kMaxH2ConnsPerUpstream) when those are full, as Envoy's HTTP/2
// connection pool does. nghttp2 is the codec, as on the client side.
//
//   H2Call call(L, up);
//   co_await H2Send(L, up, headers, body, deadline, call);
//   if (call.failed) ... retryable: call.why, call.refused ...
//
// A call waits in `up.waiting` for its response, so the prober's hung
// verdict and the sweep's stall verdict (JudgeProgress) cancel it for the
// standby as they do an HTTP/1.1 request. A whole response (headers, data
// and trailers) is collected before the caller relays it: a unary call's
// failure before its end is always retryable.
//
// Internal to the router. Thread-safety: a loop's upstreams live on it.
#pragma once

#include <nghttp2/nghttp2.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/h2_server.h"
#include "router/loop.h"

namespace gpuha::router {

constexpr size_t kMaxH2ConnsPerUpstream = 4;

class H2UpConn;

// One call on an upstream, from its request to the end of its response.
struct H2Call : Waiting {
  explicit H2Call(Loop& L) : wake(L.ioc) {}
  ~H2Call() override;
  void Cancel() override;  // the hung or stall verdict: ends the wait for the standby
  // The client left (reset its stream, or its connection ended): the wait
  // ends and the upstream's stream is reset.
  void ClientGone();

  // The response.
  H2Headers headers;   // ":status" among them
  H2Headers trailers;  // grpc-status, grpc-message and the rest
  std::string data;
  bool done = false;       // the stream closed
  bool failed = false;     // ended without a whole response
  bool refused = false;    // never processed (REFUSED_STREAM, or beyond a GOAWAY's last stream)
  bool timed_out = false;  // the deadline passed first
  bool connect_failed = false;
  bool client_gone = false;
  bool response_too_large = false;  // over max_response_bytes: reset, not retried
  // When the stream closed. The caller reports the answer (UpstreamAnswered)
  // as of then, once it has read its status: calls sent while this one's
  // coroutine was queued began after it (the stall verdict's "outpaced" rule).
  TimePoint answered_at{};
  std::string why;

  // A streaming call: its body grows as the caller appends to it (then
  // H2Resume), and ends when it sets body_done; its answer's data is read
  // as it comes (`wake` is cancelled on each DATA frame too).
  bool streaming = false;
  bool body_done = true;

  // Internal: the connection and stream it runs on.
  Timer wake;
  std::shared_ptr<H2UpConn> conn;
  int32_t stream_id = -1;
  const std::string* body = nullptr;
  size_t body_sent = 0;
  size_t max_response_bytes = 0;
};

// Connects (or takes a pooled connection) and sends the request's headers;
// its body follows from call.body. False: the call failed (call.why).
awaitable<bool> H2Start(Loop& L, UpstreamState& up, const H2HeaderViews& headers, H2Call& call);
// H2Start on a pooled connection, with no coroutine frame: nullopt when
// none can take the call (H2Start then connects).
std::optional<bool> H2StartPooled(Loop& L, UpstreamState& up, const H2HeaderViews& headers,
                                  H2Call& call);
// A streaming call's body grew, or ended (body_done).
void H2Resume(H2Call& call);
// The call's stream ends here and is reset upstream, unless it closed.
void H2Abandon(H2Call& call);

// Sends one request (pseudo-headers first) with a whole body and waits for
// the whole response, at most until `deadline` (steady clock).
awaitable<void> H2Send(Loop& L, UpstreamState& up, const H2HeaderViews& headers,
                       const std::string& body, Clock::time_point deadline, H2Call& call);

// DropH2 (loop.h): the upstream's pooled HTTP/2 connections, dropped (a
// moved address, an ejection): calls on them fail and go to the standby.

}  // namespace gpuha::router
