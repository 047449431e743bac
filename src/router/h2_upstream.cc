#include "router/h2_upstream.h"

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/net_util.h"
#include "router/tls_contexts.h"

namespace gpuha::router {

class H2UpConn : public std::enable_shared_from_this<H2UpConn> {
 public:
  H2UpConn(Loop& L, UpstreamState& up) : s(L.ioc.get_executor()), deadline(L, s), L_(L), up_(up) {}
  ~H2UpConn() {
    if (session_ != nullptr) nghttp2_session_del(session_);
  }

  // After the TCP connect: the client session and its SETTINGS.
  void Begin() {
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, OnHeader);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, OnData);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, OnFrame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, OnClose);
    nghttp2_option* opt = nullptr;
    nghttp2_option_new(&opt);
    nghttp2_option_set_max_continuations(opt, 8);
    // Until the upstream's SETTINGS come, take it to allow 100 streams (the
    // RFC's recommended floor), not unlimited.
    nghttp2_option_set_peer_max_concurrent_streams(opt, 100);
    nghttp2_session_client_new2(&session_, cb, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
    };
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
    nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, 16 << 20);
  }

  bool HasRoom() const {
    return !dead_ && !goaway_ &&
           calls_.size() < nghttp2_session_get_remote_settings(
                               session_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  }
  bool usable() const { return !dead_ && !goaway_; }
  size_t load() const { return calls_.size(); }

  int32_t Submit(const H2HeaderViews& headers, H2Call& call) {
    H2NvList nv = H2Nv(headers);
    nghttp2_data_provider dp;
    dp.source.ptr = nullptr;
    dp.read_callback = ReadBody;
    int32_t id = nghttp2_submit_request(session_, nullptr, nv.data(), nv.size(), &dp, nullptr);
    if (id < 0) return id;
    calls_[id] = &call;
    Flush();
    return id;
  }

  // The call leaves before its stream closed (deadline, verdict, or its
  // coroutine destroyed): the upstream stream is reset.
  void Abandon(int32_t id) {
    if (calls_.erase(id) == 0 || dead_) return;
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    Flush();
  }

  // A streaming call's body grew, or ended: its DATA may go on.
  void Resume(int32_t id) {
    if (dead_ || calls_.count(id) == 0) return;
    nghttp2_session_resume_data(session_, id);
    Flush();
  }

  void Flush() {
    if (writing_ || dead_) return;
    out_.clear();
    for (;;) {
      const uint8_t* p = nullptr;
      ssize_t n = nghttp2_session_mem_send(session_, &p);
      if (n <= 0) break;
      out_.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    }
    if (out_.empty()) {
      if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) {
        Fail("the upstream ended the connection (GOAWAY)", false);
      }
      return;
    }
    writing_ = true;
    auto written = [self = shared_from_this()](error_code ec, size_t) {
      self->writing_ = false;
      if (ec) {
        self->Fail("write: " + ec.message(), true);
        return;
      }
      self->Flush();
    };
    if (tls) {
      net::async_write(*tls, net::buffer(out_), std::move(written));
    } else {
      net::async_write(s, net::buffer(out_), std::move(written));
    }
  }

  // `self` keeps the connection while it reads.
  awaitable<void> ReadLoop(std::shared_ptr<H2UpConn> self) {
    (void)self;
    std::array<char, 16384> buf;
    for (;;) {
      error_code ec;
      size_t n = co_await Read(net::buffer(buf), ec);
      if (dead_) co_return;
      if (ec) {
        Fail(ec == net::error::eof ? std::string("the upstream closed the connection")
                                   : "read: " + ec.message(),
             true);
        co_return;
      }
      ssize_t rv =
          nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(buf.data()), n);
      if (rv < 0) {
        Fail(absl::StrCat("HTTP/2 from the upstream: ", nghttp2_strerror(static_cast<int>(rv))),
             true);
        co_return;
      }
      Flush();
      if (dead_) co_return;
    }
  }

  // Every call on the connection fails (and may go to the standby); the
  // connection leaves the pool. `upstream_fault`: counted against the
  // upstream (outlier ejection), as a refused or reset HTTP/1.1 connection is.
  void Fail(const std::string& why, bool upstream_fault) {
    if (dead_) return;
    dead_ = true;
    auto keep = shared_from_this();  // the pool may hold the last reference
    const bool had_calls = !calls_.empty();
    for (auto& [id, call] : calls_) {
      call->done = true;
      call->failed = true;
      call->why = why;
      call->wake.cancel();
    }
    calls_.clear();
    error_code ec;
    s.close(ec);
    auto& pool = up_.h2;
    pool.erase(std::remove(pool.begin(), pool.end(), shared_from_this()), pool.end());
    if (upstream_fault && had_calls) ConnectionFailed(L_, up_);
  }

  // A read on whichever of the two carries the connection: a plain
  // function that hands back the operation's awaitable (as UpConn's).
  awaitable<size_t> Read(net::mutable_buffer b, error_code& ec) {
    return tls ? tls->async_read_some(b, Redirect(ec)) : s.async_read_some(b, Redirect(ec));
  }

  // Starts TLS on the connected socket (upstream_tls): the upstream's
  // certificate checked as for HTTP/1.1 upstreams, and HTTP/2 chosen by
  // ALPN, which gRPC over TLS requires. "" or why it failed.
  awaitable<std::string> StartTls(const std::shared_ptr<ssl::context>& ctx,
                                  const std::string& name) {
    tls_ctx = ctx;
    tls = std::make_unique<ssl::stream<Socket&>>(s, *tls_ctx);
    PrepareUpstreamTls(*tls, name);
    static constexpr unsigned char kH2[] = {2, 'h', '2'};
    SSL_set_alpn_protos(tls->native_handle(), kH2, sizeof(kH2));
    error_code ec;
    co_await tls->async_handshake(ssl::stream_base::client, Redirect(ec));
    if (ec) co_return "TLS handshake: " + ec.message();
    const unsigned char* proto = nullptr;
    unsigned len = 0;
    SSL_get0_alpn_selected(tls->native_handle(), &proto, &len);
    if (len != 2 || std::memcmp(proto, "h2", 2) != 0) {
      co_return "TLS: the upstream's gRPC port did not choose HTTP/2 by ALPN (h2)";
    }
    co_return "";
  }

  Socket s;
  Deadline deadline;
  // TLS over `s` when upstream_tls is configured (declared after the
  // socket: destroyed before it).
  std::shared_ptr<ssl::context> tls_ctx;
  std::unique_ptr<ssl::stream<Socket&>> tls;

 private:
  H2Call* Find(int32_t id) {
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : it->second;
  }
  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    auto* self = static_cast<H2UpConn*>(user);
    H2Call* call = self->Find(frame->hd.stream_id);
    if (call == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
    H2Headers& to = frame->headers.cat == NGHTTP2_HCAT_HEADERS && !call->headers.empty()
                        ? call->trailers
                        : call->headers;
    if (to.size() >= 128) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (to.empty()) to.reserve(8);
    to.emplace_back(std::string(reinterpret_cast<const char*>(name), namelen),
                    std::string(reinterpret_cast<const char*>(value), valuelen));
    return 0;
  }
  static int OnData(nghttp2_session* session, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* user) {
    auto* self = static_cast<H2UpConn*>(user);
    H2Call* call = self->Find(id);
    if (call == nullptr || call->response_too_large) return 0;
    if (call->data.size() + len > call->max_response_bytes) {
      // No callback error resets a stream here (nghttp2 ignores it): the
      // stream is reset by hand, and the call fails as too large.
      call->response_too_large = true;
      call->why = absl::StrCat("response over ", call->max_response_bytes, " bytes");
      std::string().swap(call->data);
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
      return 0;
    }
    call->data.append(reinterpret_cast<const char*>(data), len);
    if (call->streaming) call->wake.cancel();  // its caller reads answers as they come
    return 0;
  }
  static int OnFrame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    auto* self = static_cast<H2UpConn*>(user);
    // Streams past last_stream_id are closed REFUSED_STREAM by nghttp2;
    // the rest finish. No new call is sent here.
    if (frame->hd.type == NGHTTP2_GOAWAY) self->goaway_ = true;
    return 0;
  }
  static int OnClose(nghttp2_session*, int32_t id, uint32_t error_code, void* user) {
    auto* self = static_cast<H2UpConn*>(user);
    H2Call* call = self->Find(id);
    if (call == nullptr) return 0;
    self->calls_.erase(id);
    call->done = true;
    call->answered_at = self->L_.clock.Now();
    if (error_code != NGHTTP2_NO_ERROR) {
      call->failed = true;
      call->refused = error_code == NGHTTP2_REFUSED_STREAM;
      if (call->why.empty()) {
        call->why = absl::StrCat("stream reset (", nghttp2_http2_strerror(error_code), ")");
      }
    }
    call->wake.cancel();
    return 0;
  }
  static ssize_t ReadBody(nghttp2_session*, int32_t id, uint8_t* buf, size_t length,
                          uint32_t* flags, nghttp2_data_source*, void* user) {
    auto* self = static_cast<H2UpConn*>(user);
    H2Call* call = self->Find(id);
    if (call == nullptr) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    size_t n = std::min(length, call->body->size() - call->body_sent);
    if (n == 0 && !call->body_done) return NGHTTP2_ERR_DEFERRED;  // more comes (H2Resume)
    std::memcpy(buf, call->body->data() + call->body_sent, n);
    call->body_sent += n;
    if (call->body_sent == call->body->size() && call->body_done) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return static_cast<ssize_t>(n);
  }

  Loop& L_;
  UpstreamState& up_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, H2Call*> calls_;
  std::string out_;
  bool writing_ = false;
  bool dead_ = false;
  bool goaway_ = false;
};

H2Call::~H2Call() {
  if (conn && stream_id >= 0) conn->Abandon(stream_id);
}

void H2Call::Cancel() {
  hung_cancel = true;
  wake.cancel();
}

void H2Call::ClientGone() {
  client_gone = true;
  wake.cancel();
}

void DropH2(UpstreamState& up) {
  std::vector<std::shared_ptr<H2UpConn>> conns;
  conns.swap(up.h2);
  for (auto& c : conns) c->Fail("the upstream's connections were dropped", false);
}

namespace {

// The call's stream opened on `conn`. False: nghttp2 refused it (call.why).
bool Submit(const std::shared_ptr<H2UpConn>& conn, const H2HeaderViews& headers, H2Call& call) {
  call.conn = conn;
  call.stream_id = conn->Submit(headers, call);
  if (call.stream_id < 0) {
    call.failed = true;
    call.why = absl::StrCat("HTTP/2: ", nghttp2_strerror(call.stream_id));
    return false;
  }
  return true;
}

}  // namespace

std::optional<bool> H2StartPooled(Loop& L, UpstreamState& up, const H2HeaderViews& headers,
                                  H2Call& call) {
  call.max_response_bytes = L.config.limits.max_body_bytes;
  // A connection with room, else a new one while the pool may grow, else
  // the least loaded (nghttp2 queues the call until the upstream allows it).
  std::shared_ptr<H2UpConn> conn;
  for (auto& c : up.h2) {
    if (c->HasRoom()) {
      conn = c;
      break;
    }
  }
  if (!conn && up.h2.size() >= kMaxH2ConnsPerUpstream) {
    for (auto& c : up.h2) {
      if (c->usable() && (!conn || c->load() < conn->load())) conn = c;
    }
  }
  if (!conn) return std::nullopt;
  Inc(L.stats.upstream_reuses);
  return Submit(conn, headers, call);
}

awaitable<bool> H2Start(Loop& L, UpstreamState& up, const H2HeaderViews& headers, H2Call& call) {
  if (std::optional<bool> started = H2StartPooled(L, up, headers, call)) co_return *started;
  const RouterConfig& config = L.config;
  error_code ec;
  auto conn = std::make_shared<H2UpConn>(L, up);
  conn->deadline.Arm(config.limits.connect_timeout);
  co_await conn->s.async_connect(up.grpc_endpoint, Redirect(ec));
  conn->deadline.Disarm();
  Inc(L.stats.upstream_connects);
  if (ec) {
    call.failed = call.connect_failed = true;
    call.why = conn->deadline.expired() ? "connect timeout" : "connect: " + ec.message();
    if (!common::OutOfDescriptors(ec)) ConnectionFailed(L, up);
    co_return false;
  }
  conn->s.set_option(tcp::no_delay(true), ec);
  if (L.upstream_tls && config.upstream_tls_grpc) {
    conn->deadline.Arm(config.limits.connect_timeout);
    std::string why = co_await conn->StartTls(
        L.upstream_tls, UpstreamTlsName(config, up.grpc_endpoint.address().to_string()));
    conn->deadline.Disarm();
    if (!why.empty()) {
      call.failed = call.connect_failed = true;
      call.why = conn->deadline.expired() ? "TLS handshake timeout" : why;
      ConnectionFailed(L, up);
      co_return false;
    }
  }
  conn->Begin();
  up.h2.push_back(conn);
  net::co_spawn(L.ioc, conn->ReadLoop(conn), net::detached);
  co_return Submit(conn, headers, call);
}

void H2Resume(H2Call& call) {
  if (call.conn && call.stream_id >= 0) call.conn->Resume(call.stream_id);
}

void H2Abandon(H2Call& call) {
  if (call.conn && call.stream_id >= 0) call.conn->Abandon(call.stream_id);
  call.stream_id = -1;
}

awaitable<void> H2Send(Loop& L, UpstreamState& up, const H2HeaderViews& headers,
                       const std::string& body, Clock::time_point deadline, H2Call& call) {
  call.body = &body;
  up.in_flight++;
  struct Dec {
    int64_t* v;
    ~Dec() { --*v; }
  } dec{&up.in_flight};
  // A pooled connection's call starts without a coroutine frame of its own.
  std::optional<bool> started = H2StartPooled(L, up, headers, call);
  if (!started) started = co_await H2Start(L, up, headers, call);
  if (!*started) co_return;
  call.waiting_since = L.clock.Now();
  call.expect = {};
  call.hung_cancel = false;
  up.waiting.push_back(call);
  error_code ec;
  while (!call.done && !call.hung_cancel && !call.client_gone) {
    call.wake.expires_at(deadline);
    co_await call.wake.async_wait(Redirect(ec));
    if (!ec) {
      call.timed_out = !call.done;
      break;
    }
  }
  call.waiting_hook.unlink();
  if (!call.done) {
    call.failed = true;
    call.why = call.hung_cancel   ? "hung"
               : call.client_gone ? "the client left"
                                  : "no response before the deadline";
  }
  H2Abandon(call);
}

}  // namespace gpuha::router
