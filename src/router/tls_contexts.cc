#include "router/tls_contexts.h"

#include <openssl/ssl.h>

#include "absl/strings/str_cat.h"

namespace gpuha::router {

namespace ssl = boost::asio::ssl;
using boost::system::error_code;

// Loads a certificate chain and its key into `ctx`; errors name the config
// fields (`section`.cert, `section`.key).
namespace {

absl::Status UseCertificate(ssl::context& ctx, const std::string& cert, const std::string& key,
                            const char* section) {
  error_code ec;
  ctx.use_certificate_chain_file(cert, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(section, ".cert: ", cert, ": ", ec.message()));
  ctx.use_private_key_file(key, ssl::context::pem, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat(section, ".key: ", key, ": ", ec.message()));
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(section, ".key: does not match ", section, ".cert"));
  }
  return absl::OkStatus();
}

// ALPN: h2 when the client offers it, else http/1.1 (or no ALPN at all:
// an HTTP/1.1 client that sends none is served as before).
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
               unsigned int inlen, void*) {
  static const unsigned char kOurs[] = "\x02h2\x08http/1.1";
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, kOurs, sizeof(kOurs) - 1, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ssl::context>> MakeServerTls(const RouterConfig& c) {
  if (c.tls_cert.empty()) return std::shared_ptr<ssl::context>();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::single_dh_use);
  if (absl::Status s = UseCertificate(*ctx, c.tls_cert, c.tls_key, "tls"); !s.ok()) return s;
  SSL_CTX_set_alpn_select_cb(ctx->native_handle(), SelectAlpn, nullptr);
  return ctx;
}

absl::StatusOr<std::shared_ptr<ssl::context>> MakeUpstreamTls(const RouterConfig& c) {
  if (c.upstream_ca.empty()) return std::shared_ptr<ssl::context>();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  error_code ec;
  ctx->load_verify_file(c.upstream_ca, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("upstream_tls.ca: ", c.upstream_ca, ": ", ec.message()));
  }
  ctx->set_verify_mode(ssl::verify_peer);
  if (!c.upstream_cert.empty()) {
    absl::Status s = UseCertificate(*ctx, c.upstream_cert, c.upstream_key, "upstream_tls");
    if (!s.ok()) return s;
  }
  return ctx;
}

}  // namespace gpuha::router
