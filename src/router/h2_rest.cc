#include "router/h2_rest.h"

#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace gpuha::router {
namespace {

// Fields of one HTTP/1.1 connection, never carried across (RFC 9113 8.2.2).
bool ConnectionSpecific(std::string_view lower_name) {
  for (std::string_view f :
       {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"}) {
    if (lower_name == f) return true;
  }
  return false;
}

bool CarriesLineBreak(std::string_view v) {
  return v.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

}  // namespace

absl::StatusOr<std::string> Http1Request(const H2Stream& s) {
  const std::string_view method = s.Header(":method");
  const std::string_view path = s.Header(":path");
  std::string_view host = s.Header(":authority");
  if (host.empty()) host = s.Header("host");
  if (method.empty() || path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(":method and an origin-form :path are required");
  }
  std::string out;
  size_t size = path.size() + host.size() + s.body.size() + 64;
  for (const auto& [name, value] : s.headers) size += name.size() + value.size() + 4;
  out.reserve(size);
  out.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ").append(host);
  out.append("\r\n");
  std::string cookies;
  for (const auto& [name, value] : s.headers) {
    if (name.empty() || name[0] == ':' || name == "host" || name == "content-length" ||
        name == "expect" || ConnectionSpecific(name)) {
      continue;
    }
    if (CarriesLineBreak(name) || CarriesLineBreak(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("header '", absl::CHexEscape(name), "': a line break or NUL in a field"));
    }
    if (name == "cookie") {  // HTTP/2 may split them (RFC 9113 8.2.3)
      cookies.append(cookies.empty() ? "" : "; ").append(value);
      continue;
    }
    out.append(name).append(": ").append(value).append("\r\n");
  }
  if (!cookies.empty()) out.append("cookie: ").append(cookies).append("\r\n");
  if (!s.body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    out.append("content-length: ").append(std::to_string(s.body.size())).append("\r\n");
  }
  out.append("\r\n").append(s.body);
  return out;
}

H2RestStream::H2RestStream(Loop& L, std::shared_ptr<grpc_proxy::H2ClientConn> conn, int32_t id,
                           bool head)
    : L_(L),
      conn_(std::move(conn)),
      id_(id),
      unused_(L.ioc.get_executor()),
      deadline_(L, unused_),
      wait_(L.ioc.get_executor()) {
  parser_.eager(true);
  parser_.header_limit(1 << 20);  // the pipeline's own heads
  // Not boost::none: Boost 1.74 compares a Content-Length with it as "greater".
  parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_.skip(head);
}

bool H2RestStream::Gone() const { return conn_->closed || conn_->h2.Find(id_) == nullptr; }

bool H2RestStream::Backlogged() const {
  const H2Stream* s = conn_->h2.Find(id_);
  return s != nullptr && s->unsent() > conn_->h2.limits().max_unsent_answer_bytes;
}

void H2RestStream::SendHeaders() {
  const auto& res = parser_.get();
  H2Headers h;
  h.reserve(16);
  h.emplace_back(":status", std::to_string(res.result_int()));
  for (const auto& f : res) {
    std::string name(f.name_string().data(), f.name_string().size());
    absl::AsciiStrToLower(&name);
    if (ConnectionSpecific(name)) continue;
    h.emplace_back(std::move(name), std::string(f.value().data(), f.value().size()));
  }
  conn_->h2.RespondStreaming(id_, h);
  headers_sent_ = true;
}

error_code H2RestStream::Take(std::string_view bytes) {
  if (Gone()) return net::error::connection_reset;
  in_.append(bytes);
  char scratch[16 * 1024];
  while (!parser_.is_done()) {
    parser_.get().body().data = scratch;
    parser_.get().body().size = sizeof scratch;
    error_code ec;
    const size_t used = parser_.put(net::buffer(in_.data(), in_.size()), ec);
    in_.erase(0, used);
    if (ec == http::error::need_buffer || ec == http::error::need_more) ec = {};
    if (ec) {  // the pipeline wrote what is not HTTP/1.1: a bug, never a client's
      spdlog::error("router: HTTP/2 stream {}: answer not relayed: {}", id_, ec.message());
      return ec;
    }
    if (parser_.is_header_done() && !headers_sent_) SendHeaders();
    const size_t body = sizeof scratch - parser_.get().body().size;
    if (body > 0) conn_->h2.SendData(id_, {scratch, body});
    if (used == 0 && body == 0) break;
  }
  if (parser_.is_done() && !finished_) {
    if (!headers_sent_) SendHeaders();
    conn_->h2.Finish(id_, {});
    finished_ = true;
  }
  conn_->Kick();
  return {};
}

awaitable<error_code> H2RestStream::WaitForRoom() {
  for (;;) {
    if (Gone()) co_return net::error::connection_reset;
    if (deadline_.expired()) co_return net::error::timed_out;
    if (!Backlogged()) co_return error_code{};
    // The session takes the stream's bytes as its client's window opens;
    // looked at again a moment later (the writer has no per-stream signal).
    error_code ec;
    wait_.expires_after(milliseconds(5));
    co_await wait_.async_wait(Redirect(ec));
  }
}

void H2RestStream::End() {
  deadline_.Disarm();
  if (finished_ || Gone()) return;
  conn_->h2.Reset(id_, NGHTTP2_INTERNAL_ERROR);
  conn_->Kick();
}

awaitable<void> HandleRest(Loop& L, std::shared_ptr<grpc_proxy::H2ClientConn> conn, int32_t id) {
  grpc_proxy::CallCount count{*conn};  // counted when it was spawned
  H2Stream* s = conn->h2.Find(id);
  if (s == nullptr || conn->closed) co_return;
  absl::StatusOr<std::string> request = Http1Request(*s);
  const bool head = s->Header(":method") == "HEAD";
  std::string().swap(s->body);  // copied into the request
  if (!request.ok()) {
    Inc(L.stats.router_answers[static_cast<size_t>(Reason::kBadRequest)]);
    conn->h2.Respond(id,
                     {{":status", "400"},
                      {"content-type", "application/json"},
                      {"x-gpuha-error", ReasonLabel(Reason::kBadRequest)}},
                     ErrorBody(Reason::kBadRequest, std::string(request.status().message()), ""),
                     {});
    conn->Kick();
    co_return;
  }
  H2RestStream stream(L, conn, id, head);
  // A client connection's state from the connection's spares: its buffers
  // keep their capacity from one stream to the next, as an HTTP/1.1
  // connection's do from one request to the next.
  std::unique_ptr<ClientConn> spare = conn->TakeSpare();
  ClientConn& cc = *spare;
  cc.peer_ip = conn->peer_ip;
  auto room = cc.buf.prepare(request->size());
  std::memcpy(room.data(), request->data(), request->size());
  cc.buf.commit(request->size());
  std::string().swap(*request);
  co_await ServeRequest(L, stream, stream.deadline(), cc);
  stream.End();
  conn->GiveBack(std::move(spare));
}

}  // namespace gpuha::router
