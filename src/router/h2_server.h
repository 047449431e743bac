// H2Server: the server side of one client's HTTP/2 connection, without I/O
// (in the manner of nghttp2's own mem_recv/mem_send): the connection feeds
// it the bytes it reads and writes what Drain() hands back. nghttp2 is the
// codec (Debian's libnghttp2: the framing, HPACK, flow control and the
// protocol's state machine are what a proxy must not get wrong, and it is
// the codec Envoy and curl use). What this class adds is the router's
// limits and its defences:
//   - SETTINGS: concurrent streams, frame size, windows, header list size;
//     a stream over the concurrent limit is refused (REFUSED_STREAM);
//   - a request's header list over max_header_list_bytes (or over
//     max_headers fields) is answered RESOURCE_EXHAUSTED; four times over,
//     as an HPACK bomb decodes, the connection ends (ENHANCE_YOUR_CALM);
//   - a body over max_request_bytes is answered RESOURCE_EXHAUSTED;
//   - rapid reset (CVE-2023-44487): RST_STREAMs over a token bucket end
//     the connection, and every reset stream cancels the work it began;
//   - CONTINUATION floods: a header block in more than max_continuations
//     frames ends the connection.
// Thread-safety: none; one loop owns a connection.
#pragma once

#include <nghttp2/nghttp2.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "router/grpc.h"

namespace gpuha::router {

using H2Headers = std::vector<std::pair<std::string, std::string>>;

// Headers the router sends and does not keep (a call's request upstream):
// views into what the call holds, copied once, by nghttp2, into its frame.
using H2HeaderViews = absl::InlinedVector<std::pair<std::string_view, std::string_view>, 16>;
using H2NvList = absl::InlinedVector<nghttp2_nv, 16>;
H2NvList H2Nv(const H2HeaderViews& h);

// The first value of `name` (lower case) in `h`, or empty.
std::string_view H2Find(const H2Headers& h, std::string_view name);

// nghttp2's name/value view of `h` (valid while `h` lives and is unchanged).
std::vector<nghttp2_nv> H2Nv(const H2Headers& h);

// The HTTP/2 connection preface a client sends first (h2c prior knowledge).
inline constexpr std::string_view kH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct H2Limits {
  uint32_t max_concurrent_streams = 128;
  uint32_t max_frame_size = 16384;
  int32_t stream_window = 1 << 20;
  int32_t connection_window = 16 << 20;
  size_t max_header_list_bytes = 16384;  // RFC 9113 6.5.2: names + values + 32 per field
  size_t max_headers = 100;
  size_t max_request_bytes = 1 << 20;  // a request's body
  uint64_t reset_burst = 200;          // RST_STREAMs taken at once...
  uint64_t reset_rate = 100;           // ...and per second after that
  size_t max_continuations = 8;
  // Request bytes held at once on a connection, not yet released: the
  // connection's flow-control window, so only a client that breaks flow
  // control reaches it (the connection then ends, ENHANCE_YOUR_CALM).
  size_t max_buffered_bytes = 16 << 20;
  // A stream's answer bytes not yet taken by its client (its window shut):
  // past this, the stream's released request bytes go back to the client's
  // window only as it reads its answers, so a client that never reads
  // cannot make the router hold its answers without bound.
  size_t max_unsent_answer_bytes = 1 << 20;
};

struct H2Stream {
  int32_t id = 0;
  H2Headers headers;  // the request's, pseudo-headers first
  size_t header_bytes = 0;
  size_t header_fields = 0;
  bool headers_over = false;  // over the header limits: answered RESOURCE_EXHAUSTED
  std::string body;
  bool body_over = false;
  bool complete = false;  // END_STREAM received
  // Set by whoever works on the stream: called if the stream closes before
  // it is answered (the client reset it, or the connection ended).
  std::function<void()> on_close;
  // A streaming call (StartStreaming): its body is read as it comes, and
  // `on_data` is called after each DATA frame and at the request's end.
  bool streaming = false;
  std::function<void()> on_data;
  size_t held = 0;  // request bytes received and not released (Release)
  // Released request bytes whose window waits for the client to read its
  // answers (H2Limits::max_unsent_answer_bytes).
  size_t owed = 0;
  // The response being sent.
  std::string out_body;
  size_t out_sent = 0;
  H2Headers out_trailers;
  bool responded = false;
  bool out_open = false;  // a streamed response whose end is not yet given
  // Answer bytes not yet taken by nghttp2 (the client's window holds them).
  size_t unsent() const { return out_body.size() - out_sent; }

  // The first value of `name` (lower case), or empty.
  std::string_view Header(std::string_view name) const { return H2Find(headers, name); }
  // A gRPC call (content-type application/grpc...), as against REST or SSE;
  // known even when its headers were over the limits and dropped.
  bool grpc = false;
  bool Grpc() const { return grpc; }
};

class H2Server {
 public:
  // `on_request` is called once per stream whose request is complete (END_STREAM),
  // from within Feed().
  using OnRequest = std::function<void(H2Stream&)>;
  // `on_headers`, when set, is called once a request's headers are whole and
  // more (a body) follows; it may answer at once, and the stream's request
  // is then not handed to `on_request`.
  H2Server(const H2Limits& limits, OnRequest on_request, OnRequest on_headers = nullptr);
  ~H2Server();
  H2Server(const H2Server&) = delete;
  H2Server& operator=(const H2Server&) = delete;

  // Takes bytes read from the client. An error ends the connection: drain
  // what is queued (a GOAWAY that says why), then close.
  absl::Status Feed(const char* data, size_t n);
  // Appends what is to be written to the client.
  void Drain(std::string* out);
  // Neither side has more to say: close after the last write.
  bool Done() const;

  // A response: headers (":status" first), a body, and trailers (none: the
  // body ends the stream).
  void Respond(int32_t id, const H2Headers& headers, std::string body, H2Headers trailers);
  // A gRPC Trailers-Only response: one HEADERS frame with :status 200,
  // grpc-status and grpc-message, which ends the stream.
  // `label`, when given, goes along as x-gpuha-error (the router's reason,
  // as HTTP/1.1 answers carry it in X-Gpuha-Error).
  void RespondGrpcError(int32_t id, GrpcCode code, std::string_view message,
                        std::string_view label = {});
  // Ends one stream now (RST_STREAM with `error_code`): an answer that
  // broke partway must not reach its client as if it were whole.
  void Reset(int32_t id, uint32_t error_code);
  // Ends the connection now: GOAWAY with `error_code`, streams dropped.
  void GoAway(uint32_t error_code);
  // A graceful end in two steps, as nghttp2 and Envoy do it: a GOAWAY that
  // says no new stream will be taken soon (the highest stream id), then,
  // a round trip later, the GOAWAY naming the last stream taken. Streams
  // open finish; the connection ends when the last one does (Done).
  void ShutdownNotice();
  void GoAwayGraceful();

  // A streaming call: from now on its body is handed over as it comes
  // (on_data; the caller takes it with Consume), not at its end.
  void StartStreaming(int32_t id);
  // Drops the first `n` bytes of a streaming call's body (taken by the
  // caller, who still holds them: they stay counted until Release).
  void Consume(int32_t id, size_t n);
  // The router is done with `n` of the stream's request bytes: they leave
  // the connection's budget and go back to the client's flow-control
  // windows (WINDOW_UPDATE). A unary call's body is released when it is
  // handed over whole; a streaming call's messages as they are answered.
  // While the stream's unsent answer is over max_unsent_answer_bytes, the
  // window is given back only as the client reads (at the next Drain).
  void Release(int32_t id, size_t n);
  // The stream's client has more of its answers unread than
  // max_unsent_answer_bytes: take no more of its messages until it reads
  // (on_data is called when it has).
  bool AnswerBacklogged(int32_t id);
  // A streamed response: headers now, then bytes as they come (SendData),
  // then the trailers that end it (Finish).
  void RespondStreaming(int32_t id, const H2Headers& headers);
  void SendData(int32_t id, std::string_view bytes);
  void Finish(int32_t id, H2Headers trailers);

  // Work on every open stream hears that its client is gone (on_close).
  void AbortStreams();

  H2Stream* Find(int32_t id);
  const H2Limits& limits() const { return limits_; }
  size_t open_streams() const { return streams_.size(); }
  // Streams whose client has not ended its request (no END_STREAM yet).
  size_t awaiting_request() const { return awaiting_request_; }
  // Grows with each request's headers and body bytes: a client that moves
  // its requests on, as against one that only sends PINGs or SETTINGS.
  uint64_t request_progress() const { return request_progress_; }
  uint64_t requests() const { return requests_; }
  uint64_t resets_received() const { return resets_; }
  // Why the connection ended on its own, for the log.
  const std::string& why() const { return why_; }

 private:
  static int OnBeginHeaders(nghttp2_session*, const nghttp2_frame*, void*);
  static int OnHeader(nghttp2_session*, const nghttp2_frame*, const uint8_t*, size_t,
                      const uint8_t*, size_t, uint8_t, void*);
  static int OnData(nghttp2_session*, uint8_t, int32_t, const uint8_t*, size_t, void*);
  static int OnFrame(nghttp2_session*, const nghttp2_frame*, void*);
  static int OnClose(nghttp2_session*, int32_t, uint32_t, void*);
  // Gives the owed window back to streams whose clients have read their
  // answers down to max_unsent_answer_bytes.
  void GiveBackOwed();
  static ssize_t ReadBody(nghttp2_session*, int32_t, uint8_t*, size_t, uint32_t*,
                          nghttp2_data_source*, void*);

  H2Limits limits_;
  OnRequest on_request_;
  OnRequest on_headers_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<H2Stream>> streams_;
  uint64_t request_progress_ = 0;
  size_t awaiting_request_ = 0;  // of streams_, those not complete (read on every client read)
  uint64_t requests_ = 0;
  uint64_t resets_ = 0;
  size_t buffered_ = 0;                // request body bytes held in streams not yet ended
  std::unordered_set<int32_t> owing_;  // streams with owed window (H2Stream::owed)
  std::string why_;
};

}  // namespace gpuha::router
