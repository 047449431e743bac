// UDP for heartbeat datagrams (common/heartbeat_datagram.h).
//
//   auto rx = UdpReceiver::Start({"127.0.0.1", 7400}, [](absl::string_view d) { ... });
//   auto tx = UdpSender::Open({"127.0.0.1", (*rx)->port()});
//   (*tx)->Send(bytes);
//
// UdpReceiver: one thread blocks in poll() on the socket and an eventfd that
// Stop() signals, reads what is queued in batches (recvmmsg, up to 16 a
// call), and hands each datagram to the callback in arrival order. It asks
// for a 4 MiB receive buffer (the kernel caps it at net.core.rmem_max) and
// reports datagrams the kernel dropped for a full buffer (SO_RXQ_OVFL) to
// `on_drops`, each drop once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/net_util.h"

namespace gpuha::common {

class UdpReceiver {
 public:
  using Handler = std::function<void(absl::string_view datagram)>;
  using DropHandler = std::function<void(uint64_t dropped)>;
  // Binds every address `at`'s host resolves to ("localhost": ::1 and
  // 127.0.0.1, as gRPC listens), on one port (0: a free one, the same for
  // all); the error names the address. One that does not bind after the
  // first (a dual-stack wildcard already covers it) is left out, logged.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UdpReceiver>> Start(
      const HostPort& at, Handler on_datagram, DropHandler on_drops = nullptr);
  ~UdpReceiver();
  void Stop();
  uint16_t port() const { return port_; }

 private:
  UdpReceiver(std::vector<int> fds, int wake_fd, uint16_t port, Handler h, DropHandler d);
  void Loop();
  const std::vector<int> fds_;  // one per address the host resolves to, one port
  const int wake_fd_;
  const uint16_t port_;
  const Handler handler_;
  const DropHandler on_drops_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A UDP socket connected to one peer.
class UdpSender {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UdpSender>> Open(const HostPort& to);
  ~UdpSender();
  // OK when the kernel took the whole datagram.
  absl::Status Send(absl::string_view datagram);
  const HostPort& to() const { return to_; }

 private:
  UdpSender(int fd, HostPort to) : fd_(fd), to_(std::move(to)) {}
  const int fd_;
  const HostPort to_;
};

// The host of a gRPC peer string ("ipv4:10.0.0.5:7400", "ipv6:[::1]:7400",
// either percent-encoded): the address the agent's stream reached.
[[nodiscard]] absl::StatusOr<std::string> GrpcPeerHost(absl::string_view peer);

}  // namespace gpuha::common
