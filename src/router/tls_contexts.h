// TLS contexts of the router: the server side (the certificate clients see)
// and the client side to upstreams (mTLS). Both are TLS 1.2+. Errors name the
// config field and the file (tls.cert, upstream_tls.ca, ...).
//
//   auto server = MakeServerTls(config);     // null: plain HTTP
//   auto upstream = MakeUpstreamTls(config); // null: plain HTTP upstream
//   PrepareUpstreamTls(stream, UpstreamTlsName(config, "10.0.0.7"));
//
// A context is immutable once made; a reload makes new ones and connections
// keep the one they started with. Thread-safety: as OpenSSL's SSL_CTX.
#pragma once

#include <openssl/ssl.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/router_config.h"

namespace gpuha::router {

// The certificate clients see; null when `tls` is not configured.
[[nodiscard]] absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> MakeServerTls(
    const RouterConfig& c);
// Verifies upstreams against upstream_tls.ca and presents the router's own
// certificate when given; null when upstream_tls is not configured.
[[nodiscard]] absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> MakeUpstreamTls(
    const RouterConfig& c);

// The name an upstream's certificate must carry: upstream_server_name, or
// the upstream's own IP.
inline std::string UpstreamTlsName(const RouterConfig& c, const std::string& host) {
  return c.upstream_server_name.empty() ? host : c.upstream_server_name;
}

// Starts TLS on a connected upstream socket: SNI for a DNS name, and the
// certificate must chain to upstream_tls.ca and carry `name`.
template <class TlsStream>
void PrepareUpstreamTls(TlsStream& tls, const std::string& name) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(name, ec);
  if (ec) SSL_set_tlsext_host_name(tls.native_handle(), name.c_str());  // not an IP
  tls.set_verify_callback(boost::asio::ssl::host_name_verification(name));
}

}  // namespace gpuha::router
