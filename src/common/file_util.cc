#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace gpuha::common {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // An ifstream opens a directory and reads it as empty: a config path that
  // named a folder then read as an empty config.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return buffer.str();
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view data) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::DataLossError(absl::StrCat(tmp, ": write failed: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
  }
  // The rename is durable once the directory is synced: before, a power
  // loss could bring the old file back (a checkpoint fence, an old epoch).
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const bool synced =
        ::fsync(dfd) == 0 || errno == EINVAL;  // EINVAL: cannot sync a directory here
    const int err = errno;
    ::close(dfd);
    if (!synced) {
      return absl::DataLossError(
          absl::StrCat(dir, ": fsync after renaming ", path, " failed: ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

}  // namespace gpuha::common
