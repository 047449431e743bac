#include "router/h2_server.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "router/request.h"

namespace gpuha::router {

std::vector<nghttp2_nv> H2Nv(const H2Headers& h) {
  std::vector<nghttp2_nv> nv;
  nv.reserve(h.size());
  for (const auto& [name, value] : h) {
    nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                  reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                  value.size(), NGHTTP2_NV_FLAG_NONE});
  }
  return nv;
}

H2NvList H2Nv(const H2HeaderViews& h) {
  H2NvList nv;
  for (const auto& [name, value] : h) {
    nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                  reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                  value.size(), NGHTTP2_NV_FLAG_NONE});
  }
  return nv;
}

std::string_view H2Find(const H2Headers& h, std::string_view name) {
  for (const auto& [n, v] : h) {
    if (n == name) return v;
  }
  return {};
}

H2Server::H2Server(const H2Limits& limits, OnRequest on_request, OnRequest on_headers)
    : limits_(limits), on_request_(std::move(on_request)), on_headers_(std::move(on_headers)) {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, OnBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cb, OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, OnData);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, OnFrame);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, OnClose);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_stream_reset_rate_limit(opt, limits_.reset_burst, limits_.reset_rate);
  nghttp2_option_set_max_continuations(opt, limits_.max_continuations);
  // Our own HPACK encoder's table stays at the default 4 KiB whatever the
  // client offers; SETTINGS floods and unacknowledged PINGs are bounded by
  // nghttp2's defaults (max_settings 32, max_outbound_ack 1000).
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  // Flow control is ours: a request's bytes go back to the client's window
  // only once the router is done with them (Release), so a client that
  // pipelines into a slow or stuck upstream is held by its window, not by
  // the router's memory.
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_session_server_new2(&session_, cb, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, limits_.max_concurrent_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(limits_.stream_window)},
      {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, limits_.max_frame_size},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(limits_.max_header_list_bytes)},
      {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, 4096},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, limits_.connection_window);
}

H2Server::~H2Server() {
  AbortStreams();
  nghttp2_session_del(session_);
}

void H2Server::AbortStreams() {
  for (auto& [id, s] : streams_) {
    if (s->on_close) std::exchange(s->on_close, nullptr)();
  }
}

absl::Status H2Server::Feed(const char* data, size_t n) {
  ssize_t r = nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(data), n);
  if (r < 0) {
    if (why_.empty()) why_ = nghttp2_strerror(static_cast<int>(r));
    // nghttp2 leaves the GOAWAY of a fatal error to us: it says why.
    nghttp2_session_terminate_session(
        session_, r == NGHTTP2_ERR_CALLBACK_FAILURE || r == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
                      ? NGHTTP2_ENHANCE_YOUR_CALM
                      : NGHTTP2_PROTOCOL_ERROR);
    return absl::InvalidArgumentError(why_);
  }
  return absl::OkStatus();
}

void H2Server::Drain(std::string* out) {
  if (!owing_.empty()) GiveBackOwed();
  for (;;) {
    const uint8_t* p = nullptr;
    ssize_t n = nghttp2_session_mem_send(session_, &p);
    if (n <= 0) return;
    out->append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  }
}

bool H2Server::Done() const {
  return !nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_);
}

H2Stream* H2Server::Find(int32_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

void H2Server::Respond(int32_t id, const H2Headers& headers, std::string body, H2Headers trailers) {
  H2Stream* s = Find(id);
  if (s == nullptr || s->responded) return;
  s->responded = true;
  s->out_body = std::move(body);
  s->out_sent = 0;
  s->out_trailers = std::move(trailers);
  std::vector<nghttp2_nv> nv = H2Nv(headers);
  nghttp2_data_provider dp;
  dp.source.ptr = nullptr;
  dp.read_callback = ReadBody;
  const bool has_data = !s->out_body.empty() || !s->out_trailers.empty();
  nghttp2_submit_response(session_, id, nv.data(), nv.size(), has_data ? &dp : nullptr);
}

void H2Server::StartStreaming(int32_t id) {
  if (H2Stream* s = Find(id)) s->streaming = true;
}

void H2Server::Consume(int32_t id, size_t n) {
  H2Stream* s = Find(id);
  if (s == nullptr) return;
  s->body.erase(0, std::min(n, s->body.size()));
}

void H2Server::Release(int32_t id, size_t n) {
  H2Stream* s = Find(id);
  if (s == nullptr) return;
  n = std::min(n, s->held);
  s->held -= n;
  buffered_ -= n;
  if (s->unsent() > limits_.max_unsent_answer_bytes) {
    s->owed += n;
    owing_.insert(id);
    return;
  }
  nghttp2_session_consume(session_, id, n);
}

bool H2Server::AnswerBacklogged(int32_t id) {
  H2Stream* s = Find(id);
  return s != nullptr && s->unsent() > limits_.max_unsent_answer_bytes;
}

void H2Server::GiveBackOwed() {
  for (auto it = owing_.begin(); it != owing_.end();) {
    H2Stream* s = Find(*it);
    if (s == nullptr) {
      it = owing_.erase(it);
      continue;
    }
    if (s->unsent() > limits_.max_unsent_answer_bytes) {
      ++it;
      continue;
    }
    nghttp2_session_consume(session_, s->id, s->owed);
    s->owed = 0;
    it = owing_.erase(it);
    if (s->on_data) s->on_data();  // it may take messages again
  }
}

void H2Server::RespondStreaming(int32_t id, const H2Headers& headers) {
  H2Stream* s = Find(id);
  if (s == nullptr || s->responded) return;
  s->responded = true;
  s->out_open = true;
  std::vector<nghttp2_nv> nv = H2Nv(headers);
  nghttp2_data_provider dp;
  dp.source.ptr = nullptr;
  dp.read_callback = ReadBody;
  nghttp2_submit_response(session_, id, nv.data(), nv.size(), &dp);
}

void H2Server::SendData(int32_t id, std::string_view bytes) {
  H2Stream* s = Find(id);
  if (s == nullptr || !s->out_open) return;
  if (s->out_sent > 64 * 1024 || s->out_sent == s->out_body.size()) {  // drop what is sent
    s->out_body.erase(0, s->out_sent);
    s->out_sent = 0;
  }
  s->out_body.append(bytes);
  nghttp2_session_resume_data(session_, id);
}

void H2Server::Finish(int32_t id, H2Headers trailers) {
  H2Stream* s = Find(id);
  if (s == nullptr || !s->out_open) return;
  s->out_open = false;
  s->out_trailers = std::move(trailers);
  nghttp2_session_resume_data(session_, id);
}

void H2Server::Reset(int32_t id, uint32_t error_code) {
  if (Find(id) == nullptr) return;
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, error_code);
}

void H2Server::RespondGrpcError(int32_t id, GrpcCode code, std::string_view message,
                                std::string_view label) {
  H2Headers h = {{":status", "200"},
                 {"content-type", "application/grpc"},
                 {"grpc-status", std::to_string(static_cast<int>(code))},
                 {"grpc-message", PercentEncodeGrpcMessage(message)}};
  if (!label.empty()) h.push_back({"x-gpuha-error", std::string(label)});
  Respond(id, h, "", {});
}

void H2Server::ShutdownNotice() { nghttp2_submit_shutdown_notice(session_); }

void H2Server::GoAwayGraceful() {
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
}

void H2Server::GoAway(uint32_t error_code) {
  nghttp2_session_terminate_session(session_, error_code);
}

int H2Server::OnBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  auto* self = static_cast<H2Server*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto s = std::make_unique<H2Stream>();
  s->id = frame->hd.stream_id;
  s->headers.reserve(12);  // a gRPC call's usual count: one allocation, not five
  nghttp2_session_set_stream_user_data(session, s->id, s.get());
  self->streams_[s->id] = std::move(s);
  ++self->awaiting_request_;
  ++self->request_progress_;
  return 0;
}

int H2Server::OnHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                       size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  auto* self = static_cast<H2Server*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  auto* s =
      static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (s == nullptr) return 0;
  const bool trailer = frame->headers.cat == NGHTTP2_HCAT_HEADERS;
  // Noted even past the limits: a gRPC client over them is answered in gRPC.
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (!trailer && n == "content-type") s->grpc = v.substr(0, 16) == "application/grpc";
  s->header_bytes += namelen + valuelen + 32;
  ++s->header_fields;
  if (s->header_bytes > 4 * self->limits_.max_header_list_bytes ||
      s->header_fields > 4 * self->limits_.max_headers) {
    // Far over: an HPACK bomb being decoded. The connection ends.
    self->why_ = absl::StrCat("stream ", s->id, ": header list over ",
                              4 * self->limits_.max_header_list_bytes, " bytes or ",
                              4 * self->limits_.max_headers, " fields (HPACK bomb?)");
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (s->header_bytes > self->limits_.max_header_list_bytes ||
      s->header_fields > self->limits_.max_headers) {
    s->headers_over = true;
    s->headers.clear();
    s->headers.shrink_to_fit();
    return 0;
  }
  if (s->headers_over || trailer) return 0;  // request trailers are not forwarded
  s->headers.emplace_back(std::string(n), std::string(v));
  return 0;
}

int H2Server::OnData(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                     size_t len, void* user) {
  auto* self = static_cast<H2Server*>(user);
  auto* s = static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, stream_id));
  // A stream answered already (unless its streamed answer is still open),
  // or over a limit, keeps nothing; its bytes go back to the window at once.
  if (s == nullptr || s->body_over || s->headers_over || (s->responded && !s->out_open)) {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  if (!s->streaming && s->body.size() + len > self->limits_.max_request_bytes) {
    s->body_over = true;
    std::string().swap(s->body);
    self->Release(stream_id, s->held);
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  if (self->buffered_ + len > self->limits_.max_buffered_bytes) {
    self->why_ = absl::StrCat("over ", self->limits_.max_buffered_bytes,
                              " bytes of request bodies held at once");
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  s->body.append(reinterpret_cast<const char*>(data), len);
  self->request_progress_ += len;
  s->held += len;
  self->buffered_ += len;
  if (s->on_data) s->on_data();
  return 0;
}

int H2Server::OnFrame(nghttp2_session* session, const nghttp2_frame* frame, void* user) {
  auto* self = static_cast<H2Server*>(user);
  if (frame->hd.type == NGHTTP2_RST_STREAM) ++self->resets_;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
      !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM) && self->on_headers_) {
    auto* s =
        static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
    if (s != nullptr && !s->headers_over) self->on_headers_(*s);
    return 0;
  }
  if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
      !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    return 0;
  }
  auto* s =
      static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (s == nullptr || s->complete) return 0;
  s->complete = true;
  --self->awaiting_request_;
  ++self->request_progress_;
  if (s->streaming) {
    if (s->on_data) s->on_data();
    return 0;
  }
  self->Release(s->id, s->held);  // its body is the call's now
  if (s->responded) return 0;     // answered on its headers
  ++self->requests_;
  if (s->headers_over || s->body_over) {
    const std::string why =
        s->headers_over
            ? absl::StrCat("header list over ", self->limits_.max_header_list_bytes, " bytes or ",
                           self->limits_.max_headers, " fields")
            : absl::StrCat("request body over ", self->limits_.max_request_bytes, " bytes");
    if (s->Grpc()) {
      self->RespondGrpcError(s->id, GrpcCode::kResourceExhausted, why);
    } else {  // REST: the HTTP answer an HTTP/1.1 client gets
      const Reason r = s->headers_over ? Reason::kHeaderTooLarge : Reason::kBodyTooLarge;
      self->Respond(s->id,
                    {{":status", std::to_string(ReasonStatus(r))},
                     {"content-type", "application/json"},
                     {"x-gpuha-error", ReasonLabel(r)}},
                    ErrorBody(r, why, ""), {});
    }
  } else {
    self->on_request_(*s);
  }
  return 0;
}

int H2Server::OnClose(nghttp2_session* session, int32_t stream_id, uint32_t, void* user) {
  auto* self = static_cast<H2Server*>(user);
  auto it = self->streams_.find(stream_id);
  if (it == self->streams_.end()) return 0;
  std::unique_ptr<H2Stream> s = std::move(it->second);
  self->streams_.erase(it);
  if (!s->complete) --self->awaiting_request_;
  // What it held goes back to the connection's window (the stream's is gone).
  self->buffered_ -= s->held;
  if (s->held + s->owed > 0) nghttp2_session_consume_connection(session, s->held + s->owed);
  self->owing_.erase(stream_id);
  if (s->on_close) s->on_close();
  return 0;
}

ssize_t H2Server::ReadBody(nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
                           uint32_t* flags, nghttp2_data_source*, void*) {
  auto* s = static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (s == nullptr) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  size_t n = std::min(length, s->out_body.size() - s->out_sent);
  if (n == 0 && s->out_open) return NGHTTP2_ERR_DEFERRED;  // more comes (SendData)
  std::memcpy(buf, s->out_body.data() + s->out_sent, n);
  s->out_sent += n;
  if (s->out_sent == s->out_body.size() && !s->out_open) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!s->out_trailers.empty()) {
      *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      std::vector<nghttp2_nv> nv = H2Nv(s->out_trailers);
      nghttp2_submit_trailer(session, stream_id, nv.data(), nv.size());
    }
  }
  return static_cast<ssize_t>(n);
}

}  // namespace gpuha::router
