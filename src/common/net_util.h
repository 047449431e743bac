// Small shared helpers for network addresses and secrets in config files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::common {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string str() const;
};
// "127.0.0.1:7400" or "[::1]:7400"; "localhost" becomes 127.0.0.1. `field`
// names the input in errors.
[[nodiscard]] absl::StatusOr<HostPort> ParseHostPort(const std::string& text,
                                                     const std::string& field);

// True for an IPv4 or IPv6 address as text ("10.0.0.7", "fd00::7"); a name
// is not one.
bool IsIpAddress(const std::string& text);
// The IP of a gRPC peer string ("ipv4:10.0.0.7:51234", "ipv6:[fd00::7]:5"):
// empty for any other form (a Unix socket).
std::string GrpcPeerIp(absl::string_view peer);

// True for a host in 127.0.0.0/8 or ::1 (ParseHostPort already turned
// "localhost" into 127.0.0.1). Any other name or address is not loopback.
bool IsLoopbackHost(const std::string& host);

// A loopback TCP port that was free a moment ago (0 if none), for processes
// whose listen address must be known before they start.
uint16_t FreeLoopbackPort();
// Whether 127.0.0.1:`port` can be bound now (for a run of ports in a row).
bool LoopbackPortFree(uint16_t port);

// The timeout=N parameter of an HTTP Keep-Alive header's value ("timeout=5,
// max=100", RFC 2068 19.7.1.1), in seconds: how long the sender keeps an
// idle connection open. Nothing when absent or malformed.
std::optional<int> KeepAliveTimeout(absl::string_view value);

// Lower-case hex SHA-256 of `data` (OpenSSL): how API keys and tokens are
// stored in config files.
std::string Sha256Hex(absl::string_view data);
std::string Sha256(absl::string_view data);  // the 32 raw bytes

}  // namespace gpuha::common
