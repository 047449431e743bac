#include "common/http_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/query.h"

namespace gpuha::common {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpServer::Options& options, const HttpHandler& handler)
      : stream_(std::move(socket)), options_(options), handler_(handler) {}

  void Start() { Read(); }

 private:
  void Read() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    parser_->body_limit(options_.max_body_bytes);
    stream_.expires_after(options_.read_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return Close();
    }
    if (ec) {
      HttpResponse r;
      r.status = ec == http::error::body_limit ? 413 : 400;
      r.body = absl::StrCat("{\"error\":\"bad request: ", ec.message(), "\"}\n");
      r.content_type = "application/json";
      return Write(std::move(r), /*keep_alive=*/false, 11);
    }
    const auto& req = parser_->get();
    HttpRequest in;
    in.method = std::string(req.method_string());
    in.target = std::string(req.target());
    in.path = std::string(TargetPath(in.target));
    for (const auto& field : req) {
      in.headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
          std::string(field.value());
    }
    in.body = req.body();
    beast::error_code peer_ec;
    auto ep = stream_.socket().remote_endpoint(peer_ec);
    if (!peer_ec) in.peer = absl::StrCat(ep.address().to_string(), ":", ep.port());
    HttpResponse out = handler_(in);
    Write(std::move(out), req.keep_alive(), req.version());
  }

  void Write(HttpResponse r, bool keep_alive, unsigned version) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), version);
    res->set(http::field::server, "gpuha");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    res->keep_alive(keep_alive);
    res->body() = std::move(r.body);
    res->prepare_payload();
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
                        if (ec || !keep_alive) return self->Close();
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpServer::Options& options_;
  const HttpHandler& handler_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(Options o, HttpHandler h) : options(std::move(o)), handler(std::move(h)), acceptor(io) {}
  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (OutOfDescriptors(ec)) {  // pause, as every accept loop does
        if (!paused) spdlog::error("http {}: accept: {}; pausing accepts", port, ec.message());
        paused = true;
        pause.expires_after(kAcceptPause);
        pause.async_wait([this](beast::error_code wec) {
          if (!wec && acceptor.is_open()) Accept();
        });
        return;
      }
      paused = false;
      if (!ec) std::make_shared<Session>(std::move(socket), options, handler)->Start();
      if (acceptor.is_open()) Accept();
    });
  }
  Options options;
  HttpHandler handler;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer pause{io};
  bool paused = false;
  uint16_t port = 0;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options,
                                                              HttpHandler handler) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>(std::move(options), std::move(handler));
  Impl& impl = *server->impl_;
  beast::error_code ec;
  auto address = asio::ip::make_address(impl.options.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", impl.options.address, "': ", ec.message()));
  }
  tcp::endpoint endpoint(address, impl.options.port);
  impl.acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(endpoint, ec);
  if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", impl.options.address, ":",
                                               impl.options.port, ": ", ec.message()));
  }
  server->port_ = impl.acceptor.local_endpoint().port();
  impl.port = server->port_;
  impl.Accept();
  server->thread_ = std::thread([&impl] { impl.io.run(); });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (!impl_) return;
  asio::post(impl_->io, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->io.stop();
  if (thread_.joinable()) thread_.join();
  impl_.reset();
}

absl::StatusOr<HttpResult> HttpCall(const std::string& method, const std::string& host,
                                    uint16_t port, const std::string& target,
                                    const std::string& body, std::chrono::milliseconds timeout,
                                    const std::string& bearer_token) {
  return HttpClient(host, port).Call(method, target, body, timeout, bearer_token);
}

struct HttpClient::Impl {
  asio::io_context io;
  std::optional<beast::tcp_stream> stream;  // open while the server keeps it alive
  beast::flat_buffer buffer;
};

HttpClient::HttpClient(std::string host, uint16_t port)
    : host_(std::move(host)), port_(port), impl_(std::make_unique<Impl>()) {}

HttpClient::~HttpClient() = default;

absl::StatusOr<HttpResult> HttpClient::Call(const std::string& method, const std::string& target,
                                            const std::string& body,
                                            std::chrono::milliseconds timeout,
                                            const std::string& bearer_token) {
  const bool kept = impl_->stream.has_value();
  absl::StatusOr<HttpResult> r = Exchange(method, target, body, timeout, bearer_token);
  // Only a GET is sent again: a POST the server did get must not run twice.
  if (!r.ok() && kept && method == "GET" && !absl::IsDeadlineExceeded(r.status()) &&
      !absl::IsInvalidArgument(r.status())) {
    r = Exchange(method, target, body, timeout, bearer_token);
  }
  return r;
}

absl::StatusOr<HttpResult> HttpClient::Exchange(const std::string& method,
                                                const std::string& target, const std::string& body,
                                                std::chrono::milliseconds timeout,
                                                const std::string& bearer_token) {
  Impl& m = *impl_;
  beast::error_code ec;
  auto address = asio::ip::make_address(host_, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad host '", host_, "'"));
  for (unsigned char c : bearer_token) {
    if (c < 0x20 || c == 0x7f) {  // CR and LF would start a header of their own
      return absl::InvalidArgumentError("the bearer token holds a control character");
    }
  }
  HttpResult result;
  absl::Status status =
      absl::DeadlineExceededError(absl::StrCat(method, " http://", host_, ":", port_, target,
                                               ": no answer within ", timeout.count(), " ms"));
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, absl::StrCat(address.is_v6() ? "[" + host_ + "]" : host_, ":", port_));
  if (!bearer_token.empty()) req.set(http::field::authorization, "Bearer " + bearer_token);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::response<http::string_body> res;
  bool keep_alive = false;
  // Out of time is DeadlineExceeded: a hung server is not asked again.
  auto failed = [](const std::string& step, beast::error_code ec) {
    std::string what = absl::StrCat(step, ": ", ec.message());
    return ec == beast::error::timeout ? absl::DeadlineExceededError(what)
                                       : absl::UnavailableError(what);
  };
  auto exchange = [&] {
    http::async_write(*m.stream, req, [&](beast::error_code ec, size_t) {
      if (ec) {
        status = failed("write", ec);
        return;
      }
      http::async_read(*m.stream, m.buffer, res, [&](beast::error_code ec, size_t) {
        if (ec) {
          status = failed("read", ec);
          return;
        }
        result.status = res.result_int();
        result.body = res.body();
        keep_alive = res.keep_alive();
        status = absl::OkStatus();
      });
    });
  };
  m.io.restart();
  if (m.stream) {
    m.stream->expires_after(timeout);
    exchange();
  } else {
    m.stream.emplace(m.io);
    m.buffer.clear();
    ++connects_;
    m.stream->expires_after(timeout);
    m.stream->async_connect(tcp::endpoint(address, port_), [&](beast::error_code ec) {
      if (ec) {
        status = failed(absl::StrCat("connect ", host_, ":", port_), ec);
        return;
      }
      exchange();
    });
  }
  m.io.run();
  if (status.ok() && keep_alive) {
    m.stream->expires_never();
  } else {
    m.stream.reset();  // failed, or the server closes it: the next call connects anew
  }
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme.data(), kScheme.size()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an http:// URL"));
  }
  std::string rest = url.substr(kScheme.size());
  HttpUrl out;
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) out.target = rest.substr(slash);
  size_t colon = hostport.rfind(':');
  if (!hostport.empty() && hostport[0] == '[') {  // an IPv6 literal: [::1]:7401
    size_t close = hostport.find(']');
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': no ']' after an IPv6 host"));
    }
    out.host = hostport.substr(1, close - 1);
    colon =
        close + 1 < hostport.size() && hostport[close + 1] == ':' ? close + 1 : std::string::npos;
    if (close + 1 < hostport.size() && colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': junk after ']'"));
    }
  } else {
    out.host = hostport.substr(0, colon);
  }
  if (colon != std::string::npos) {
    uint32_t port = 0;
    if (!absl::SimpleAtoi(hostport.substr(colon + 1), &port) || port == 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': bad port"));
    }
    out.port = static_cast<uint16_t>(port);
  }
  if (out.host.empty()) return absl::InvalidArgumentError(absl::StrCat("'", url, "': no host"));
  if (out.host == "localhost") out.host = "127.0.0.1";
  return out;
}

}  // namespace gpuha::common
