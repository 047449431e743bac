#include "controller/grpc_serving.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/net_util.h"

namespace gpuha::controller {
namespace {

using std::chrono::milliseconds;

class RouteWatch final : public v1::RouteService::Service {
 public:
  RouteWatch(RouteSource* source, std::atomic<bool>* stopping)
      : source_(source), stopping_(stopping) {}
  grpc::Status Watch(grpc::ServerContext* ctx,
                     grpc::ServerReaderWriter<v1::RouteSnapshot, v1::RouteAck>* stream) override {
    v1::RouteAck first;
    if (!stream->Read(&first) || first.router().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first ack must name the router");
    }
    const std::string router = first.router();
    if (absl::Status s = source_->Hello(router, first); !s.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
    }
    std::atomic<bool> done{false};
    std::thread reader([&] {
      v1::RouteAck ack;
      while (stream->Read(&ack)) source_->Ack(router, ack);
      done = true;
    });
    uint64_t sent = 0;
    while (!done && !ctx->IsCancelled() && !*stopping_ && source_->Serving()) {
      std::optional<v1::RouteSnapshot> next = source_->Next(&sent, milliseconds(200));
      if (!next) continue;
      // Deposed meanwhile: its routes may hold a failover it never committed.
      if (!source_->Serving()) break;
      if (!stream->Write(*next)) break;
    }
    ctx->TryCancel();
    reader.join();
    source_->Gone(router);
    return grpc::Status::OK;
  }

 private:
  RouteSource* const source_;
  std::atomic<bool>* stopping_;
};

// A controller that starts or stops leading hands listen.grpc from one of
// its servers to the other within milliseconds; gRPC may close the old
// listener a little later. Waits (at most `max`) until the address binds.
void WaitForPortFree(const std::string& listen, common::Duration max) {
  auto hp = common::ParseHostPort(listen, "listen.grpc");
  if (!hp.ok() || hp->port == 0) return;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &found) != 0) {
    return;  // gRPC's own bind reports it
  }
  const auto until = std::chrono::steady_clock::now() + max;
  while (true) {
    int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool bound = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0;
    if (fd >= 0) ::close(fd);
    if (bound || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  ::freeaddrinfo(found);
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(const ControllerConfig& config,
                                                        const std::vector<grpc::Service*>& services,
                                                        int* port) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert.empty()) {
    auto cert = common::ReadFile(config.tls_cert);
    auto key = common::ReadFile(config.tls_key);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions o(
        config.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!config.tls_ca.empty()) {
      auto ca = common::ReadFile(config.tls_ca);
      if (!ca.ok()) return ca.status();
      o.pem_root_certs = *ca;
    }
    o.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(o);
  }
  WaitForPortFree(config.grpc_listen, milliseconds(2000));
  grpc::ServerBuilder b;
  b.AddListeningPort(config.grpc_listen, creds, port);
  // gRPC sets SO_REUSEPORT by default: two controllers then both bound the
  // port and the agents split between them. One port, one owner.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* s : services) b.RegisterService(s);
  // Agents send a keepalive every second; let them.
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Heartbeats are small and steady: bandwidth-delay probing would answer
  // every burst of them with a PING the agent must wake up to acknowledge.
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The server pings too: a stream whose agent vanished without a FIN (a
  // host reboot, a NAT drop) ends within ~2 s, so the agent's reconnect is
  // not refused for long as a second stream for a connected node.
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", config.grpc_listen));
  }
  return server;
}

std::unique_ptr<grpc::Service> RouteWatchService(RouteSource* source, std::atomic<bool>* stopping) {
  return std::make_unique<RouteWatch>(source, stopping);
}

}  // namespace gpuha::controller
