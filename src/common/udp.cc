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

// `hp`'s addresses (passive: for bind). Numeric hosts need no lookup.
absl::StatusOr<addrinfo*> Resolve(const HostPort& hp, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(hp.port);
  if (int rc =
          ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UDP ", hp.str(), ": cannot resolve: ", ::gai_strerror(rc)));
  }
  return found;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

void SetPort(sockaddr* a, uint16_t port) {
  if (a->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(a)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(a)->sin_port = htons(port);
  }
}

std::string AddressText(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  ::getnameinfo(a, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
  return host;
}

// Sockets bound to every address `hp` resolves to, on one port (as gRPC
// listens on each of a name's addresses: "localhost" is ::1 and 127.0.0.1).
// Port 0: the first bind picks it. The first address must bind; a later one
// that does not (a dual-stack wildcard already holds it) is left out.
absl::StatusOr<std::vector<int>> BoundSockets(const HostPort& hp) {
  absl::StatusOr<addrinfo*> found = Resolve(hp, /*passive=*/true);
  if (!found.ok()) return found.status();
  std::vector<int> fds;
  std::string why;
  // Port 0: the port the first bind picked may be taken on another of the
  // addresses; a few more picks before one is left out.
  for (int attempt = 0; attempt < 5; ++attempt) {
    uint16_t port = hp.port;
    bool taken = false;
    for (addrinfo* a = *found; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd >= 0) {
        SetPort(a->ai_addr, port);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
          port = BoundPort(fd);
          fds.push_back(fd);
          continue;
        }
      }
      const int err = errno;
      if (fd >= 0) ::close(fd);
      if (fds.empty()) {
        why = absl::StrCat(AddressText(a->ai_addr, a->ai_addrlen), ": ", std::strerror(err));
        break;
      }
      if (hp.port == 0 && err == EADDRINUSE && attempt < 4) {
        taken = true;
        break;
      }
      spdlog::warn("UDP {}: {} left out: {}", hp.str(), AddressText(a->ai_addr, a->ai_addrlen),
                   std::strerror(err));
    }
    if (!taken) break;
    for (int fd : fds) ::close(fd);
    fds.clear();
  }
  ::freeaddrinfo(*found);
  if (fds.empty()) {
    return absl::UnavailableError(absl::StrCat("UDP ", hp.str(), ": cannot bind: ", why));
  }
  return fds;
}

// A datagram socket connected to the first of `hp`'s addresses that takes
// it. Errors say which step failed for `hp`.
absl::StatusOr<int> ConnectedSocket(const HostPort& hp) {
  absl::StatusOr<addrinfo*> found = Resolve(hp, /*passive=*/false);
  if (!found.ok()) return found.status();
  int fd = -1;
  std::string why;
  for (addrinfo* a = *found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(*found);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("UDP ", hp.str(), ": cannot connect: ", why));
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UdpReceiver>> UdpReceiver::Start(const HostPort& at,
                                                                Handler on_datagram,
                                                                DropHandler on_drops) {
  absl::StatusOr<std::vector<int>> sockets = BoundSockets(at);
  if (!sockets.ok()) return sockets.status();
  // Room for a burst while the handler is busy; best effort (capped by
  // net.core.rmem_max), and drops are counted either way.
  const int buffer = 4 << 20;
  const int on = 1;
  for (int fd : *sockets) {
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
    (void)::setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof(on));
  }
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    for (int fd : *sockets) ::close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  const uint16_t port = BoundPort(sockets->front());
  std::unique_ptr<UdpReceiver> r(
      new UdpReceiver(*sockets, wake, port, std::move(on_datagram), std::move(on_drops)));
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

UdpReceiver::UdpReceiver(std::vector<int> fds, int wake_fd, uint16_t port, Handler h, DropHandler d)
    : fds_(std::move(fds)),
      wake_fd_(wake_fd),
      port_(port),
      handler_(std::move(h)),
      on_drops_(std::move(d)) {}

UdpReceiver::~UdpReceiver() {
  Stop();
  for (int fd : fds_) ::close(fd);
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
  // Room for the SO_RXQ_OVFL control message (a uint32_t) of each,
  // aligned as the cmsghdr CMSG_FIRSTHDR reads there.
  union Control {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(uint32_t))];
  };
  std::array<Control, kBatch> control{};
  // The kernel's drop count is per socket, cumulative, and wraps.
  std::vector<uint32_t> dropped_seen(fds_.size(), 0);
  std::vector<pollfd> fds;
  for (int fd : fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  while (!stopping_) {
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) {
      spdlog::error("UDP :{}: poll: {}", port_, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stopping_ || (fds.back().revents & POLLIN) != 0) return;
    for (size_t s = 0; s < fds_.size(); ++s) {
      if (fds[s].revents == 0) continue;
      // Everything queued on this socket, then the next (or poll again).
      while (!stopping_) {
        for (size_t i = 0; i < kBatch; ++i) {
          iov[i] = {buf.data() + i * kSlot, kSlot};
          msgs[i] = {};
          msgs[i].msg_hdr.msg_iov = &iov[i];
          msgs[i].msg_hdr.msg_iovlen = 1;
          msgs[i].msg_hdr.msg_control = control[i].bytes;
          msgs[i].msg_hdr.msg_controllen = sizeof(control[i].bytes);
        }
        const int n = ::recvmmsg(fds_[s], msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
        if (n <= 0) break;  // EAGAIN, or an ICMP error queued on the socket
        for (int i = 0; i < n && !stopping_; ++i) {
          msghdr& h = msgs[i].msg_hdr;
          for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SO_RXQ_OVFL ||
                c->cmsg_len < CMSG_LEN(sizeof(uint32_t))) {
              continue;
            }
            uint32_t dropped = 0;
            std::memcpy(&dropped, CMSG_DATA(c), sizeof(dropped));
            if (dropped != dropped_seen[s] && on_drops_) on_drops_(dropped - dropped_seen[s]);
            dropped_seen[s] = dropped;
          }
          handler_(absl::string_view(buf.data() + i * kSlot, msgs[i].msg_len));
        }
        if (static_cast<size_t>(n) < kBatch) break;  // drained
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<UdpSender>> UdpSender::Open(const HostPort& to) {
  absl::StatusOr<int> fd = ConnectedSocket(to);
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
