#include "router/testing/test_backend.h"

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/listen.h"
#include "common/query.h"

namespace gpuha::router::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

struct TestBackend::Impl {
  std::string name;
  std::shared_ptr<std::atomic<uint64_t>> requests;
  std::shared_ptr<std::atomic<bool>> stuck;
  std::shared_ptr<std::atomic<int64_t>> health_delay_ms;
  std::shared_ptr<net::ssl::context> tls;  // null: plain HTTP

  template <class Stream>
  net::awaitable<void> Serve(Stream& s, std::string client_cn) {
    beast::flat_buffer buf;
    auto chunk = std::make_unique<char[]>(64 * 1024);
    for (;;) {
      error_code ec;
      http::request_parser<http::buffer_body> p;
      p.body_limit(std::numeric_limits<uint64_t>::max());
      co_await http::async_read_header(s, buf, p, net::redirect_error(net::use_awaitable, ec));
      if (ec) co_return;
      uint64_t body_bytes = 0;
      while (!p.is_done()) {
        p.get().body().data = chunk.get();
        p.get().body().size = 64 * 1024;
        co_await http::async_read_some(s, buf, p, net::redirect_error(net::use_awaitable, ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) co_return;
        body_bytes += 64 * 1024 - p.get().body().size;
      }
      auto& req = p.get();
      std::string target(req.target());
      std::string path(common::TargetPath(target));
      const bool health = path.rfind("/v2/health/", 0) == 0;
      if (!health) requests->fetch_add(1);  // probes not counted
      int64_t delay_ms = 0, size = -1, status = 200;
      bool chunked = false;
      // Test knobs; a malformed one is ignored (the backend serves anything).
      common::QueryParams q = common::QueryParams::FromTarget(target);
      // only=NAME: the delay and status apply on that backend alone (a
      // fault on the primary, the standby healthy).
      const bool mine = q.Get("only").value_or(name) == name;
      delay_ms = mine ? q.Int("delay_ms").value_or(std::nullopt).value_or(0) : 0;
      size = q.Int("size").value_or(std::nullopt).value_or(-1);
      status = mine ? q.Int("status").value_or(std::nullopt).value_or(200) : 200;
      chunked = q.Get("chunked") == "1";
      std::string body;
      if (path == "/v2/health/ready" || path == "/v2/health/live") {
        body = "ready\n";
      } else if (size >= 0) {
        body.assign(static_cast<size_t>(size), 'x');
      } else {
        body = absl::StrCat(
            "{\"backend\":\"", name, "\",\"method\":\"", std::string(req.method_string()),
            "\",\"target\":\"", target, "\",\"body_bytes\":", body_bytes, ",\"tenant\":\"",
            std::string(req["x-gpuha-tenant"]), "\",\"stream\":\"",
            std::string(req["x-gpuha-stream"]), "\",\"api_key\":\"", std::string(req["x-api-key"]),
            "\"", tls ? absl::StrCat(",\"client_cn\":\"", client_cn, "\"") : "", "}\n");
      }
      while (!health && stuck->load()) {  // half-hung: health answers, nothing else
        net::steady_timer t(s.get_executor());
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
      if (health) delay_ms = health_delay_ms->load();
      if (delay_ms > 0) {
        net::steady_timer t(s.get_executor());
        t.expires_after(std::chrono::milliseconds(delay_ms));
        co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
      std::string out = absl::StrCat(
          "HTTP/1.1 ", status, " ", std::string(http::obsolete_reason(http::int_to_status(status))),
          "\r\nContent-Type: text/plain\r\nX-Backend: ", name, "\r\n");
      if (chunked) {
        out += "Transfer-Encoding: chunked\r\n\r\n";
        // Two chunks, to exercise re-framing.
        size_t half = body.size() / 2;
        for (std::string_view part :
             {std::string_view(body).substr(0, half), std::string_view(body).substr(half)}) {
          if (part.empty()) continue;
          char hex[24];
          std::snprintf(hex, sizeof hex, "%zx\r\n", part.size());
          out += hex;
          out += part;
          out += "\r\n";
        }
        out += "0\r\n\r\n";
      } else {
        out += absl::StrCat("Content-Length: ", body.size(), "\r\n\r\n", body);
      }
      co_await net::async_write(s, net::buffer(out), net::redirect_error(net::use_awaitable, ec));
      if (ec || !req.keep_alive()) co_return;
    }
  }

  net::awaitable<void> Connection(tcp::socket sock) {
    if (!tls) {
      beast::tcp_stream s(std::move(sock));
      co_await Serve(s, "");
      co_return;
    }
    beast::ssl_stream<beast::tcp_stream> s(std::move(sock), *tls);
    error_code ec;
    co_await s.async_handshake(net::ssl::stream_base::server,
                               net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;  // e.g. no client certificate: the client sees the alert
    std::string cn;
    if (X509* peer = SSL_get_peer_certificate(s.native_handle())) {
      char name[256] = {};
      X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, name, sizeof name);
      cn = name;
      X509_free(peer);
    }
    co_await Serve(s, cn);
  }
};

absl::StatusOr<std::unique_ptr<TestBackend>> TestBackend::Start(Options o) {
  std::unique_ptr<TestBackend> b(new TestBackend());
  b->impl_ = std::make_unique<Impl>();
  b->impl_->name = o.name;
  b->impl_->requests = b->requests_;
  b->impl_->stuck = b->stuck_;
  b->impl_->health_delay_ms = b->health_delay_ms_;
  if (!o.tls_cert.empty()) {
    auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
    error_code ec;
    ctx->use_certificate_chain_file(o.tls_cert, ec);
    if (!ec) ctx->use_private_key_file(o.tls_key, net::ssl::context::pem, ec);
    if (!ec && !o.tls_client_ca.empty()) {
      ctx->load_verify_file(o.tls_client_ca, ec);
      ctx->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
    }
    if (ec) return absl::InvalidArgumentError("test backend TLS files: " + ec.message());
    b->impl_->tls = std::move(ctx);
  }
  Impl* impl = b->impl_.get();
  auto server =
      common::LoopServer::Start(o.address, o.port, std::max(1, o.threads),
                                [impl](tcp::socket s) { return impl->Connection(std::move(s)); });
  if (!server.ok()) return server.status();
  b->server_ = std::move(*server);
  b->port_ = b->server_->port();
  return b;
}

void TestBackend::Stop() {
  server_.reset();  // its loops run Impl's coroutines
  impl_.reset();
}

TestBackend::~TestBackend() { Stop(); }

}  // namespace gpuha::router::testing
