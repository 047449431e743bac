#include "common/net_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpuha::common {

namespace {

// Binds a TCP socket on 127.0.0.1:`port` (0: any) and returns the port it
// got, or 0; the socket is closed again.
uint16_t BindLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  socklen_t len = sizeof(a);
  uint16_t bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    bound = ntohs(a.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

uint16_t FreeLoopbackPort() { return BindLoopback(0); }

bool LoopbackPortFree(uint16_t port) { return port != 0 && BindLoopback(port) == port; }

std::string HostPort::str() const {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& field) {
  HostPort hp;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", text, "' is not [HOST]:PORT"));
    }
    hp.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", text, "' is not HOST:PORT"));
    }
    hp.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' has a bad port '", port_text, "'"));
  }
  if (hp.host == "localhost") hp.host = "127.0.0.1";
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

bool IsIpAddress(const std::string& text) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, text.c_str(), buf) == 1 || inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

std::string GrpcPeerIp(absl::string_view peer) {
  std::string ip;
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    ip = std::string(peer.substr(0, peer.rfind(':')));
  } else if (absl::ConsumePrefix(&peer, "ipv6:")) {
    // "[::1]:port", or "%5B::1%5D:port" as some gRPC versions escape it.
    for (auto [open, close] : {std::pair{"[", "]"}, std::pair{"%5B", "%5D"}}) {
      if (!absl::ConsumePrefix(&peer, open)) continue;
      const size_t end = peer.find(close);
      if (end != absl::string_view::npos) ip = std::string(peer.substr(0, end));
      break;
    }
  }
  return IsIpAddress(ip) ? ip : std::string();
}

bool IsLoopbackHost(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string Sha256(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string Sha256Hex(absl::string_view data) { return absl::BytesToHexString(Sha256(data)); }

std::optional<int> KeepAliveTimeout(absl::string_view value) {
  // Comma-separated parameters: timeout=5, max=100 (RFC 2068 19.7.1.1).
  while (!value.empty()) {
    size_t comma = value.find(',');
    absl::string_view part = absl::StripAsciiWhitespace(value.substr(0, comma));
    value = comma == absl::string_view::npos ? absl::string_view() : value.substr(comma + 1);
    constexpr absl::string_view kKey = "timeout=";
    if (part.size() <= kKey.size() || !absl::EqualsIgnoreCase(part.substr(0, kKey.size()), kKey)) {
      continue;
    }
    int n = 0;
    absl::string_view digits = part.substr(kKey.size());
    if (digits.size() > 6) return std::nullopt;
    for (char ch : digits) {
      if (ch < '0' || ch > '9') return std::nullopt;
      n = n * 10 + (ch - '0');
    }
    return n;
  }
  return std::nullopt;
}

}  // namespace gpuha::common
