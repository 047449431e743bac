#include "common/grpc_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"

namespace gpuha::common {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(const ClientTls& tls) {
  if (tls.ca.empty() && tls.cert.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  auto read = [&](const std::string& path, const char* field, std::string* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tls.section, ".", field, ": ", text.status().message()));
    }
    *out = std::move(*text);
    return absl::OkStatus();
  };
  for (absl::Status s :
       {read(tls.ca, "ca", &o.pem_root_certs), read(tls.cert, "cert", &o.pem_cert_chain),
        read(tls.key, "key", &o.pem_private_key)}) {
    if (!s.ok()) return s;
  }
  return grpc::SslCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialController(
    const HostPort& controller, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    Duration connect_timeout, const std::atomic<bool>* stopping) {
  grpc::ChannelArguments args;
  // Notice a controller that vanished without closing the connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC stops pinging after 2 pings with no data sent between them; an
  // agent whose quiet heartbeats go as datagrams may send no data for long.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // small steady messages; no probing
  args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);    // no per-message filters we do not use
  auto channel = grpc::CreateCustomChannel(controller.str(), creds, args);
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::duration_cast<std::chrono::system_clock::duration>(connect_timeout);
  for (;;) {
    if (stopping->load()) return absl::CancelledError("stopping");
    auto slice =
        std::min(deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    if (channel->WaitForConnected(slice)) return channel;
    // Refused (nothing listens: a standby controller on etcd, or one that
    // is down on a live host): say so now. Waiting out the timeout there
    // made a client walking three controllers find the leader too late.
    if (channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      return absl::UnavailableError("refused (nothing listens there)");
    }
    if (std::chrono::system_clock::now() >= deadline) break;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("unreachable (no connection within ", ToMillis(connect_timeout), " ms)"));
}

}  // namespace gpuha::common
