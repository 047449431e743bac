#include "common/udp.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "spdlog/spdlog.h"

namespace gpuha::common {
namespace {

// A datagram socket bound to `hp` (`bind`) or connected to it (`connect`):
// the first of its resolved addresses that takes it. Numeric hosts need no
// lookup. Errors say which step failed for `hp`.
absl::StatusOr<int> DatagramSocket(const HostPort& hp, bool bind) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV | (bind ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(hp.port);
  if (int rc =
          ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UDP ", hp.str(), ": cannot resolve: ", ::gai_strerror(rc)));
  }
  int fd = -1;
  std::string why;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    if ((bind ? ::bind(fd, a->ai_addr, a->ai_addrlen) : ::connect(fd, a->ai_addr, a->ai_addrlen)) ==
        0) {
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("UDP ", hp.str(), bind ? ": cannot bind: " : ": cannot connect: ", why));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UdpReceiver>> UdpReceiver::Start(const HostPort& at,
                                                                Handler on_datagram,
                                                                DropHandler on_drops) {
  absl::StatusOr<int> socket = DatagramSocket(at, /*bind=*/true);
  if (!socket.ok()) return socket.status();
  const int fd = *socket;
  // Room for a burst while the handler is busy; best effort (capped by
  // net.core.rmem_max), and drops are counted either way.
  const int buffer = 4 << 20;
  const int on = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  (void)::setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof(on));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<UdpReceiver> r(
      new UdpReceiver(fd, wake, port, std::move(on_datagram), std::move(on_drops)));
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

UdpReceiver::UdpReceiver(int fd, int wake_fd, uint16_t port, Handler h, DropHandler d)
    : fd_(fd), wake_fd_(wake_fd), port_(port), handler_(std::move(h)), on_drops_(std::move(d)) {}

UdpReceiver::~UdpReceiver() {
  Stop();
  ::close(fd_);
  ::close(wake_fd_);
}

void UdpReceiver::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void UdpReceiver::Loop() {
  // 16 slots of the largest UDP payload: nothing is cut short.
  constexpr size_t kBatch = 16;
  constexpr size_t kSlot = 65536;
  std::vector<char> buf(kBatch * kSlot);
  std::array<iovec, kBatch> iov{};
  std::array<mmsghdr, kBatch> msgs{};
  // Room for the SO_RXQ_OVFL control message (a uint32_t) of each.
  std::array<std::array<char, CMSG_SPACE(sizeof(uint32_t))>, kBatch> control{};
  uint32_t dropped_seen = 0;  // the kernel's count is cumulative (and wraps)
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (!stopping_) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      spdlog::error("UDP :{}: poll: {}", port_, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stopping_ || (fds[1].revents & POLLIN) != 0) return;
    // Everything queued, then poll again (or stop).
    while (!stopping_) {
      for (size_t i = 0; i < kBatch; ++i) {
        iov[i] = {buf.data() + i * kSlot, kSlot};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = control[i].data();
        msgs[i].msg_hdr.msg_controllen = control[i].size();
      }
      const int n = ::recvmmsg(fd_, msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;  // EAGAIN, or an ICMP error queued on the socket
      for (int i = 0; i < n; ++i) {
        msghdr& h = msgs[i].msg_hdr;
        for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
          if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SO_RXQ_OVFL) continue;
          uint32_t dropped = 0;
          std::memcpy(&dropped, CMSG_DATA(c), sizeof(dropped));
          if (dropped != dropped_seen && on_drops_) on_drops_(dropped - dropped_seen);
          dropped_seen = dropped;
        }
        handler_(absl::string_view(buf.data() + i * kSlot, msgs[i].msg_len));
      }
      if (static_cast<size_t>(n) < kBatch) break;  // drained
    }
  }
}

absl::StatusOr<std::unique_ptr<UdpSender>> UdpSender::Open(const HostPort& to) {
  absl::StatusOr<int> fd = DatagramSocket(to, /*bind=*/false);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<UdpSender>(new UdpSender(*fd, to));
}

UdpSender::~UdpSender() { ::close(fd_); }

absl::Status UdpSender::Send(absl::string_view datagram) {
  const ssize_t n = ::send(fd_, datagram.data(), datagram.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(datagram.size())) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("UDP to ", to_.str(), ": ", n < 0 ? std::strerror(errno) : "sent short"));
}

absl::StatusOr<std::string> GrpcPeerHost(absl::string_view peer) {
  std::string p = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}, {"%3A", ":"}});
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(p, scheme)) {
      absl::StatusOr<HostPort> hp = ParseHostPort(p.substr(scheme.size()), "peer");
      if (!hp.ok()) return hp.status();
      return hp->host;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gRPC peer '", peer, "' is not ipv4:HOST:PORT or ipv6:[HOST]:PORT"));
}

}  // namespace gpuha::common
