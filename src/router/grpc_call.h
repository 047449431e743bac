// The gRPC proxy's calls: what the client connection (grpc_conn.cc), its
// unary calls (grpc_call.cc) and its streaming calls (grpc_stream.cc)
// share. Internal to the router.
#pragma once

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "router/client_conn.h"
#include "router/h2_upstream.h"
#include "router/pipeline.h"

namespace gpuha::router::grpc_proxy {

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
  // A REST stream's client state (router/h2_rest.h): a spare one, or new.
  std::unique_ptr<ClientConn> TakeSpare() {
    if (spares_.empty()) return std::make_unique<ClientConn>();
    std::unique_ptr<ClientConn> c = std::move(spares_.back());
    spares_.pop_back();
    return c;
  }
  // Kept for the next stream as it is left: a few, none that grew large
  // (an idle HTTP/1.1 connection keeps no more than 4 KiB of answer either).
  void GiveBack(std::unique_ptr<ClientConn> c) {
    if (spares_.size() >= 4 || c->buf.capacity() > 16384) return;
    if (c->pending.capacity() > 4096) std::string().swap(c->pending);
    c->buf.clear();
    spares_.push_back(std::move(c));
  }
  // The connection's read deadline, as Envoy splits its idle timeouts:
  // none while a call is worked on (each bounds itself: response_timeout
  // an attempt, its grpc-timeout, a stream's idle_timeout), so a client
  // that waits in silence for an answer that takes two upstreams, or
  // pauses its stream, keeps its connection; body_timeout while a stream
  // awaits the rest of its client's request, counted from the request's
  // last bytes (a PING or a SETTINGS a second does not hold a body's
  // window for ever); idle_timeout between calls (an answered stream not
  // yet closed is between calls).
  void ArmReader() {
    if (reader == nullptr || closed) return;
    if (calls > 0 || h2.awaiting_request() == 0) {
      body_armed_ = false;
      if (calls > 0) {
        reader->Disarm();
      } else {
        reader->Arm(limits_.idle_timeout);
      }
      return;
    }
    if (body_armed_ && h2.request_progress() == progress_seen_) return;  // the same wait
    progress_seen_ = h2.request_progress();
    body_armed_ = true;
    reader->Arm(limits_.body_timeout);
  }

 private:
  const RouterLimits& limits_;
  std::vector<std::unique_ptr<ClientConn>> spares_;
  bool body_armed_ = false;     // the reader waits body_timeout...
  uint64_t progress_seen_ = 0;  // ...from this h2.request_progress()
};

// A call being worked on, counted from its spawning to its end.
struct CallCount {
  H2ClientConn& conn;
  ~CallCount() {
    --conn.calls;
    conn.ArmReader();
  }
};

inline constexpr std::string_view kModelStreamInfer =
    "/inference.GRPCInferenceService/ModelStreamInfer";

inline H2Limits LimitsOf(const RouterConfig& c) {
  H2Limits l;
  l.max_concurrent_streams = c.limits.h2_max_concurrent_streams;
  l.max_header_list_bytes = c.limits.max_header_bytes;
  l.max_headers = c.limits.max_headers;
  // A call's request is re-sent whole to the standby: it is held whole,
  // and its stream's window takes it whole (bytes go back to the window
  // only when the router is done with them), and a byte more: a body over
  // the limit must be able to cross it to be answered RESOURCE_EXHAUSTED
  // (a window of exactly the limit stalled it until body_timeout). The
  // connection's window is the budget of bytes held at once.
  l.max_request_bytes = c.limits.retry_buffer_bytes;
  l.stream_window = static_cast<int32_t>(
      std::clamp<size_t>(l.max_request_bytes + 1, size_t{1} << 20, size_t{0x7fffffff}));
  l.connection_window = static_cast<int32_t>(
      std::min<size_t>(std::max<size_t>(16u << 20, 4 * size_t(l.stream_window)), 1u << 30));
  l.max_buffered_bytes = static_cast<size_t>(l.connection_window);
  return l;
}

inline bool Forwardable(std::string_view name) {
  if (name.empty() || name[0] == ':') return false;
  for (std::string_view drop : {"authorization", "x-api-key", "te", "grpc-timeout", "host",
                                "x-gpuha-tenant", "x-forwarded-for"}) {
    if (name == drop) return false;
  }
  return !IsHopByHop(name);
}

inline bool Relayable(std::string_view name) { return name == ":status" || !IsHopByHop(name); }

// What one call (unary or streaming) is: its stream, its request and its
// deadline, and the pipeline (router/pipeline.h) that admits it, orders
// its upstreams and pays for each attempt.
struct CallCtx {
  CallCtx(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id)
      : L(L), conn(std::move(conn)), id(id), pipe(L) {
    pipe.Answering(200);
  }

  // A router-made answer: counted, and sent as a Trailers-Only status (or,
  // for a streamed answer already begun, as its trailers).
  void Answer(const Refusal& r) { Status(r.reason, ReasonGrpcCode(r.reason), r.detail); }
  void Answer(Reason r, const std::string& detail) { Status(r, ReasonGrpcCode(r), detail); }
  void Status(Reason r, GrpcCode code, const std::string& detail) {
    Inc(L.stats.router_answers[static_cast<size_t>(r)]);
    pipe.Answering(ReasonStatus(r));
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
  // The request headers for `up`, with what is left of the client's
  // deadline: views into the call, the upstream and the connection, which
  // outlive the attempt's start (nghttp2 copies them into its frame).
  H2HeaderViews UpstreamHeaders(const UpstreamState& up) {
    authority = up.grpc_address;  // the upstream's may be re-bound while this one connects
    H2HeaderViews out = {{":method", "POST"},
                         {":scheme", "http"},
                         {":authority", authority},
                         {":path", path},
                         {"te", "trailers"}};
    if (client_deadline) {
      timeout_header = FormatGrpcTimeout(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      out.emplace_back("grpc-timeout", timeout_header);
    }
    for (const auto& [n, v] : request) {
      if (Forwardable(n)) out.emplace_back(n, v);
    }
    out.emplace_back("x-gpuha-tenant", pipe.tenant_name());
    out.emplace_back("x-forwarded-for", conn->peer_ip);
    return out;
  }
  // Whether `up` can be called: its gRPC address comes with the route (its
  // HTTP one keys the upstream's policy state, which both protocols
  // share), re-bound only from the newest routes (a call admitted on older
  // ones must not bind it back). False, and the attempt failed, when the
  // route gives it none.
  bool ServesGrpc(UpstreamState& up) {
    const RouteEntry& e = pipe.entry();
    const Upstream* u = up.address == e.primary.address   ? &e.primary
                        : up.address == e.standby.address ? &e.standby
                                                          : nullptr;
    if (u != nullptr && u->grpc_address != up.grpc_address && pipe.RoutesCurrent()) {
      DropH2(up);
      up.grpc_address = u->grpc_address;
      up.grpc_endpoint = {};
      if (auto hp = common::ParseHostPort(u->grpc_address, "grpc"); hp.ok()) {
        error_code ec;
        auto a = net::ip::make_address(hp->host, ec);
        if (!ec) up.grpc_endpoint = tcp::endpoint(a, hp->port);
      }
    }
    if (up.grpc_endpoint.port() != 0) return true;
    pipe.Failed(
        {.why = "serves no gRPC (the route gives it no IP:PORT for gRPC)", .answered = true});
    return false;
  }
  bool DeadlinePassed() const { return client_deadline && Clock::now() >= deadline; }
  // No upstream is left: the retry budget's refusal, the deadline's status
  // if it passed, else the pipeline's answer.
  void AllFailed(const std::optional<Refusal>& refused) {
    if (refused) {
      Answer(*refused);
    } else if (DeadlinePassed()) {
      Status(Reason::kUpstreamTimeout, GrpcCode::kDeadlineExceeded,
             absl::StrCat("grpc-timeout passed; last: ", pipe.last_failure()));
    } else {
      Answer(pipe.Exhausted());
    }
  }

  Loop& L;
  std::shared_ptr<H2ClientConn> conn;
  int32_t id;
  Pipeline pipe;
  H2Headers request;
  std::string_view path;       // in `request`
  std::string timeout_header;  // the last attempt's grpc-timeout
  std::string authority;       // the last attempt's upstream gRPC address
  bool client_deadline = false;
  Clock::time_point deadline;
  bool began = false;  // a streamed answer's headers went to the client
};

// Admission, as an HTTP/1.1 request's: the call's form and deadline, then
// the pipeline's. False: answered.
bool Admit(CallCtx& c);

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
inline std::string_view GrpcStatusOf(const H2Call& call) {
  std::string_view st = H2Find(call.trailers, "grpc-status");
  return st.empty() ? H2Find(call.headers, "grpc-status") : st;
}
inline bool ServerError(std::string_view grpc_status) {
  return grpc_status == "2" || grpc_status == "13" || grpc_status == "14" || grpc_status == "15";
}
// What the standby is asked after (with retry_5xx), as an HTTP 5xx is re-sent:
// a server's failure (UNKNOWN, INTERNAL, UNAVAILABLE, DATA_LOSS), and
// CANCELLED from an upstream (the router cancelled nothing): a server going
// away. A client's error (INVALID_ARGUMENT, NOT_FOUND) is the same anywhere.
inline bool RetryableStatus(std::string_view grpc_status) {
  return ServerError(grpc_status) || grpc_status == "1";
}
// What of an upstream's headers and trailers the client gets (a unary
// call's are moved in; a stream's are copied, being read again after).
inline H2Headers RelayHeaders(H2Headers from) {
  std::erase_if(from, [](const auto& h) { return !Relayable(h.first); });
  return from;
}
inline H2Headers RelayTrailers(H2Headers from) {
  std::erase_if(from, [](const auto& h) { return IsHopByHop(h.first); });
  return from;
}

// The trailers that end a streamed answer: the upstream's, or, when it
// answered Trailers-Only, its status taken from its headers.
inline H2Headers EndingTrailers(const H2Call& call) {
  if (!H2Find(call.trailers, "grpc-status").empty()) return RelayTrailers(call.trailers);
  H2Headers out;
  for (const char* name : {"grpc-status", "grpc-message"}) {
    std::string_view v = H2Find(call.headers, name);
    if (!v.empty()) out.emplace_back(name, std::string(v));
  }
  return out;
}

// One unary gRPC call (grpc_call.cc), and one streaming call
// (grpc_stream.cc), each spawned by the connection once it is read.
awaitable<void> HandleCall(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id);
awaitable<void> HandleStream(Loop& L, std::shared_ptr<H2ClientConn> conn, int32_t id);

}  // namespace gpuha::router::grpc_proxy
