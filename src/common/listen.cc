#include "common/listen.h"

#include <sys/socket.h>

#include <boost/asio/ip/address.hpp>

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

}  // namespace gpuha::common
