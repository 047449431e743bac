#include "router/handoff.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace gpuha::router {
namespace {

constexpr char kTake[] = "take 1\n";
constexpr size_t kMaxListeners = 256;

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handoff_socket: '", path, "' must be a path of 1 to ", sizeof a.sun_path - 1, " bytes"));
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// A listening TCP socket, as a giver must hand over.
bool IsTcpListener(int fd) {
  int listening = 0, type = 0;
  socklen_t n = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) != 0 || !listening) return false;
  n = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) != 0 || type != SOCK_STREAM) return false;
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
         (a.ss_family == AF_INET || a.ss_family == AF_INET6);
}

}  // namespace

void Listeners::Close() {
  for (int fd : data) ::close(fd);
  data.clear();
  for (int* fd : {&admin, &giver}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void SayReady(int* giver) {
  if (*giver < 0) return;
  static constexpr char kReady[] = "ready\n";
  if (::send(*giver, kReady, sizeof kReady - 1, MSG_NOSIGNAL) < 0) {
    spdlog::warn("router: handoff: {}", Errno("telling the old router this one serves"));
  }
  ::close(*giver);
  *giver = -1;
}

absl::StatusOr<Listeners> TakeListeners(const std::string& path) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(Errno("handoff: socket"));
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0) {
    if (errno == ENOENT || errno == ECONNREFUSED) {
      return absl::NotFoundError(absl::StrCat("no router gives listeners at ", path));
    }
    return absl::UnavailableError(Errno(absl::StrCat("handoff: connect to ", path).c_str()));
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::send(fd, kTake, sizeof kTake - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof kTake - 1)) {
    return absl::UnavailableError(Errno(absl::StrCat("handoff: ask ", path).c_str()));
  }
  char text[64];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxListeners + 1))];
  iovec iov{text, sizeof text - 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
  if (n <= 0) {
    return absl::UnavailableError(
        n == 0 ? absl::StrCat("handoff: the router at ", path, " closed without an answer")
               : Errno(absl::StrCat("handoff: read from ", path).c_str()));
  }
  Listeners got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int d;
      std::memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof d);
      got.data.push_back(d);
    }
  }
  // Untrusted: the answer must say how many, and each must be what it says.
  text[n] = '\0';
  std::string_view answer(text, static_cast<size_t>(n));
  uint32_t count = 0;
  const bool truncated = (m.msg_flags & MSG_CTRUNC) != 0;
  if (answer.substr(0, 10) != "listeners " || answer.back() != '\n' ||
      !absl::SimpleAtoi(absl::string_view(answer.data() + 10, answer.size() - 11), &count) ||
      count == 0 || count > kMaxListeners || truncated || got.data.size() != count + 1) {
    got.Close();
    return absl::DataLossError(absl::StrCat(
        "handoff: the answer from ", path, " is not \"listeners N\\n\" with N + 1 sockets (got \"",
        std::string(answer.substr(0, 40)), "\" and ", got.data.size(), " socket(s)",
        truncated ? ", truncated" : "", ")"));
  }
  got.admin = got.data.back();
  got.data.pop_back();
  got.giver = closer.fd;  // kept open for SayReady
  closer.fd = -1;
  for (size_t i = 0; i <= got.data.size(); ++i) {
    const int d = i < got.data.size() ? got.data[i] : got.admin;
    if (!IsTcpListener(d)) {
      got.Close();
      return absl::DataLossError(
          absl::StrCat("handoff: socket ", i, " from ", path, " is not a listening TCP socket"));
    }
  }
  return got;
}

absl::StatusOr<std::unique_ptr<HandoffServer>> HandoffServer::Start(
    const std::string& path, Listeners fds, std::function<void()> on_taken) {
  std::unique_ptr<HandoffServer> s(new HandoffServer());
  s->fds_ = std::move(fds);
  s->on_taken_ = std::move(on_taken);
  s->path_ = path;
  absl::StatusOr<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(Errno("handoff: socket"));
  // A socket file left there is the predecessor's (its listeners taken) or
  // a crashed one's: replaced. A file that is not a socket is refused.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("handoff_socket: ", path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());
  }
  const mode_t old_mask = ::umask(0177);  // mode 0600 from the start
  const int bound = ::bind(s->listen_fd_, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr);
  ::umask(old_mask);
  if (bound != 0 || ::listen(s->listen_fd_, 4) != 0) {
    return absl::UnavailableError(Errno(absl::StrCat("handoff_socket: ", path).c_str()));
  }
  if (::lstat(path.c_str(), &st) == 0) s->inode_ = st.st_ino;
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return absl::InternalError(Errno("handoff: pipe"));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

void HandoffServer::Serve() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;  // stopping
    int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char ask[16] = {};
    ssize_t n = ::recv(c, ask, sizeof ask - 1, 0);
    if (n != static_cast<ssize_t>(sizeof kTake - 1) || std::memcmp(ask, kTake, n) != 0) {
      spdlog::warn("router: handoff: a caller at {} asked something else; ignored", path_);
      ::close(c);
      continue;
    }
    std::vector<int> all = fds_.data;
    all.push_back(fds_.admin);
    const std::string text = absl::StrCat("listeners ", fds_.data.size(), "\n");
    std::vector<char> control(CMSG_SPACE(sizeof(int) * all.size()));
    iovec iov{const_cast<char*>(text.data()), text.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control.data();
    m.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * all.size());
    std::memcpy(CMSG_DATA(cm), all.data(), sizeof(int) * all.size());
    const bool sent = ::sendmsg(c, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
    if (!sent) {
      spdlog::warn("router: handoff: {}", Errno("sending the listeners"));
      ::close(c);
      continue;
    }
    spdlog::info(
        "router: handoff: {} listener(s) given; serving on until the new router says "
        "it serves",
        fds_.data.size());
    const bool ready = AwaitReady(c);
    ::close(c);
    if (!ready) {
      spdlog::warn(
          "router: handoff: the router that took the listeners ended before it "
          "served; this one serves on");
      continue;
    }
    // Given once: the successor serves on them now.
    spdlog::info("router: handoff: {} listener(s) given to the router that replaces this one",
                 fds_.data.size());
    fds_.Close();
    on_taken_();
    return;
  }
}

bool HandoffServer::AwaitReady(int c) {
  // No deadline: a successor waits for its first routes as long as they
  // take, and this one serves meanwhile.
  timeval none{0, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  std::string got;
  for (;;) {
    pollfd p[2] = {{c, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (p[1].revents != 0) return false;  // stopping
    char buf[16];
    ssize_t n = ::recv(c, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
    if (got.size() >= 6) return got.rfind("ready\n", 0) == 0;
  }
}

HandoffServer::~HandoffServer() {
  if (wake_[1] >= 0) {
    char x = 1;
    (void)!::write(wake_[1], &x, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  fds_.Close();
  // A successor's socket at the same path is left alone.
  struct stat st {};
  if (inode_ != 0 && ::lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_) {
    ::unlink(path_.c_str());
  }
}

}  // namespace gpuha::router
