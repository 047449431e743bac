#include "common/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
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
  if (impl.options.adopt_fd >= 0) {
    impl.acceptor.assign(endpoint.protocol(), impl.options.adopt_fd, ec);
  } else {
    impl.acceptor.open(endpoint.protocol(), ec);
    if (!ec) impl.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) impl.acceptor.bind(endpoint, ec);
    if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
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

int HttpServer::listen_fd() { return impl_->acceptor.native_handle(); }

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

struct HttpClient::Loop::Impl {
  asio::io_context io;
};

HttpClient::Loop::Loop() : impl_(std::make_shared<Impl>()) {}

struct HttpClient::Impl {
  std::shared_ptr<Loop::Impl> loop;
  std::optional<beast::tcp_stream> stream;  // open while the server keeps it alive
  beast::flat_buffer buffer;
};

// One request and its answer, in flight on its client's Loop.
struct HttpClient::Exchange {
  HttpClient* client = nullptr;
  http::request<http::string_body> req{};
  http::response<http::string_body> res{};
  absl::Status status{};
  bool keep_alive = false;
  bool kept = false;  // went out on a connection kept from before
};

HttpClient::HttpClient(std::string host, uint16_t port, Loop loop)
    : host_(std::move(host)), port_(port), impl_(std::make_unique<Impl>()) {
  impl_->loop = std::move(loop.impl_);
}

HttpClient::~HttpClient() = default;

void HttpClient::Start(Exchange& x, std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  x.status = absl::DeadlineExceededError(
      absl::StrCat(std::string(x.req.method_string()), " http://", host_, ":", port_,
                   std::string(x.req.target()), ": no answer within ", timeout.count(), " ms"));
  x.res = {};
  x.kept = m.stream.has_value();
  // Out of time is DeadlineExceeded: a hung server is not asked again.
  auto failed = [](const std::string& step, beast::error_code ec) {
    std::string what = absl::StrCat(step, ": ", ec.message());
    return ec == beast::error::timeout ? absl::DeadlineExceededError(what)
                                       : absl::UnavailableError(what);
  };
  auto exchange = [this, &x, failed] {
    Impl& m = *impl_;
    http::async_write(*m.stream, x.req, [this, &x, failed](beast::error_code ec, size_t) {
      if (ec) {
        x.status = failed("write", ec);
        return;
      }
      http::async_read(*impl_->stream, impl_->buffer, x.res,
                       [&x, failed](beast::error_code ec, size_t) {
                         if (ec) {
                           x.status = failed("read", ec);
                           return;
                         }
                         x.keep_alive = x.res.keep_alive();
                         x.status = absl::OkStatus();
                       });
    });
  };
  if (m.stream) {
    m.stream->expires_after(timeout);
    exchange();
    return;
  }
  beast::error_code ec;
  auto address = asio::ip::make_address(host_, ec);  // checked by the caller
  m.stream.emplace(m.loop->io);
  m.buffer.clear();
  ++connects_;
  m.stream->expires_after(timeout);
  m.stream->async_connect(tcp::endpoint(address, port_),
                          [this, &x, failed, exchange](beast::error_code ec) {
                            if (ec) {
                              x.status = failed(absl::StrCat("connect ", host_, ":", port_), ec);
                              return;
                            }
                            exchange();
                          });
}

void HttpClient::Finish(Exchange& x) {
  if (x.status.ok() && x.keep_alive) {
    impl_->stream->expires_never();
  } else {
    impl_->stream.reset();  // failed, or the server closes it: the next call connects anew
  }
}

void HttpClient::RunAll(const std::vector<Exchange*>& xs, std::chrono::milliseconds timeout) {
  if (xs.empty()) return;
  asio::io_context& io = xs.front()->client->impl_->loop->io;
  for (int round = 0; round < 2; ++round) {
    // The second round: GETs that failed on a connection kept from before
    // (not out of time), once more on a fresh one. A POST the server did
    // get must not run twice.
    std::vector<Exchange*> go;
    for (Exchange* x : xs) {
      if (round == 0 || (!x->status.ok() && x->kept && x->req.method() == http::verb::get &&
                         !absl::IsDeadlineExceeded(x->status))) {
        go.push_back(x);
      }
    }
    if (go.empty()) return;
    io.restart();
    for (Exchange* x : go) x->client->Start(*x, timeout);
    io.run();
    for (Exchange* x : go) x->client->Finish(*x);
  }
}

absl::StatusOr<HttpResult> HttpClient::Call(const std::string& method, const std::string& target,
                                            const std::string& body,
                                            std::chrono::milliseconds timeout,
                                            const std::string& bearer_token) {
  beast::error_code ec;
  auto address = asio::ip::make_address(host_, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad host '", host_, "'"));
  for (unsigned char c : bearer_token) {
    if (c < 0x20 || c == 0x7f) {  // CR and LF would start a header of their own
      return absl::InvalidArgumentError("the bearer token holds a control character");
    }
  }
  Exchange x;
  x.client = this;
  x.req = http::request<http::string_body>(http::string_to_verb(method), target, 11);
  x.req.set(http::field::host,
            absl::StrCat(address.is_v6() ? "[" + host_ + "]" : host_, ":", port_));
  if (!bearer_token.empty()) x.req.set(http::field::authorization, "Bearer " + bearer_token);
  if (!body.empty()) x.req.set(http::field::content_type, "application/json");
  x.req.body() = body;
  x.req.prepare_payload();
  RunAll({&x}, timeout);
  if (!x.status.ok()) return x.status;
  return HttpResult{static_cast<int>(x.res.result_int()), x.res.body()};
}

void HttpClient::GetAll(std::vector<Get>& calls, std::chrono::milliseconds timeout) {
  std::vector<Exchange> xs(calls.size());
  std::vector<Exchange*> go;
  for (size_t i = 0; i < calls.size(); ++i) {
    HttpClient* c = calls[i].client;
    beast::error_code ec;
    auto address = asio::ip::make_address(c->host_, ec);
    if (ec) {
      calls[i].result = absl::InvalidArgumentError(absl::StrCat("bad host '", c->host_, "'"));
      continue;
    }
    if (c->impl_->loop != calls.front().client->impl_->loop) {
      calls[i].result = absl::InvalidArgumentError("GetAll: a client of another Loop");
      continue;
    }
    bool twice = false;
    for (size_t j = 0; j < i; ++j) twice = twice || calls[j].client == c;
    if (twice) {  // one connection carries one call at a time
      calls[i].result = absl::InvalidArgumentError("GetAll: a client listed twice");
      continue;
    }
    xs[i].client = c;
    xs[i].req = http::request<http::string_body>(http::verb::get, calls[i].target, 11);
    xs[i].req.set(http::field::host,
                  absl::StrCat(address.is_v6() ? "[" + c->host_ + "]" : c->host_, ":", c->port_));
    xs[i].req.prepare_payload();
    go.push_back(&xs[i]);
  }
  RunAll(go, timeout);
  for (size_t i = 0; i < calls.size(); ++i) {
    if (xs[i].client == nullptr) continue;
    if (xs[i].status.ok()) {
      calls[i].result = HttpResult{static_cast<int>(xs[i].res.result_int()), xs[i].res.body()};
    } else {
      calls[i].result = xs[i].status;
    }
  }
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
