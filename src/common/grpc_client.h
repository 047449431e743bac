// gRPC client plumbing for the agent and the router's route watch: channel
// credentials from TLS files, and one channel set-up (keepalive, reconnect
// backoff) that waits for the connection.
//
//   auto creds = ClientCredentials({.ca = "ca.pem", .cert = "me.pem", .key = "me.key"});
//   auto channel = DialController(controller, *creds, policy.ConnectTimeout(), &stopping_);
//
// Errors name the file that could not be read, or the controller that did
// not answer. Thread-safety: pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/net_util.h"

namespace gpuha::common {

struct ClientTls {
  std::string ca;    // PEM roots; empty with no cert: plain (insecure) gRPC
  std::string cert;  // our certificate chain, for mTLS
  std::string key;
  std::string section = "tls";  // the config section, for errors ("tls.ca: ...")
};

[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ClientTls& tls);

// A channel to `controller` that notices a peer vanishing within ~2 s
// (keepalive every 1 s, also without calls) and reconnects after 100 ms to
// 1 s. Unavailable at once when the connection is refused; DeadlineExceeded
// when it is not connected within `connect_timeout`;
// Cancelled as soon as `*stopping` is seen true (it is read every 50 ms).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> DialController(
    const HostPort& controller, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    Duration connect_timeout, const std::atomic<bool>* stopping);

}  // namespace gpuha::common
