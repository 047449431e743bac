#include "common/listen.h"

#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/str_cat.h"

namespace gpuha::common {

namespace net = boost::asio;
using tcp = net::ip::tcp;

absl::StatusOr<std::vector<std::unique_ptr<tcp::acceptor>>> ListenReusePort(
    const std::vector<net::io_context*>& loops, const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad address '", host, "'"));
  std::vector<std::unique_ptr<tcp::acceptor>> out;
  for (net::io_context* ioc : loops) {
    auto a = std::make_unique<tcp::acceptor>(*ioc);
    tcp::endpoint ep(addr, port);
    a->open(ep.protocol(), ec);
    if (!ec) a->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) {
      int one = 1;
      if (setsockopt(a->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        return absl::InternalError("SO_REUSEPORT unavailable");
      }
    }
    if (!ec) a->bind(ep, ec);
    if (!ec) a->listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", host, ":", port, ": ", ec.message()));
    }
    port = a->local_endpoint().port();  // the other loops share the port
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<LoopServer>> LoopServer::Start(const std::string& host,
                                                              uint16_t port, int loops,
                                                              Serve serve) {
  if (loops < 1) return absl::InvalidArgumentError("threads: must be at least 1");
  std::unique_ptr<LoopServer> s(new LoopServer());
  s->serve_ = std::move(serve);
  std::vector<boost::asio::io_context*> iocs;
  for (int i = 0; i < loops; ++i) {
    s->loops_.push_back(std::make_unique<boost::asio::io_context>(1));
    iocs.push_back(s->loops_.back().get());
  }
  auto acceptors = ListenReusePort(iocs, host, port);
  if (!acceptors.ok()) return acceptors.status();
  s->acceptors_ = std::move(*acceptors);
  for (auto& a : s->acceptors_) {
    boost::asio::co_spawn(a->get_executor(), s->Accept(*a), boost::asio::detached);
  }
  s->port_ = s->acceptors_.front()->local_endpoint().port();
  for (boost::asio::io_context* ioc : iocs) s->threads_.emplace_back([ioc] { ioc->run(); });
  return s;
}

net::awaitable<void> LoopServer::Accept(tcp::acceptor& a) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket sock = co_await a.async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted) co_return;
    if (OutOfDescriptors(ec)) {
      net::steady_timer pause(a.get_executor(), kAcceptPause);
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    if (ec) continue;
    sock.set_option(tcp::no_delay(true), ec);
    net::co_spawn(a.get_executor(), serve_(std::move(sock)), net::detached);
  }
}

void LoopServer::Stop() {
  for (auto& l : loops_) l->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

LoopServer::~LoopServer() {
  Stop();
  // Acceptors, then the loops, whose destruction frees suspended frames.
  acceptors_.clear();
  loops_.clear();
}

}  // namespace gpuha::common
