#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace gpuha::common {

absl::Status SdNotify(const std::string& state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  std::string path = env;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if ((path[0] != '/' && path[0] != '@') || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET '", path, "' is neither an absolute path nor '@abstract'"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("NOTIFY_SOCKET: socket: ", strerror(errno)));
  ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(&addr), len);
  int err = errno;
  ::close(fd);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("NOTIFY_SOCKET '", path, "': ", strerror(err)));
  }
  return absl::OkStatus();
}

void SdNotifyOrLog(const std::string& state) {
  if (absl::Status s = SdNotify(state); !s.ok()) {
    spdlog::warn("systemd notify: {}", s.message());
  }
}

}  // namespace gpuha::common
