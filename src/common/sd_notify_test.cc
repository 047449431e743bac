#include "common/sd_notify.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace gpuha::common {
namespace {

using ::testing::HasSubstr;

// A datagram socket bound where systemd's would be; receives one message.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, name.data(), name.size());
    if (name[0] == '@') a.sun_path[0] = '\0';
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0;
    timeval tv{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~NotifySocket() { ::close(fd_); }
  bool bound() const { return bound_; }
  std::string Receive() {
    char buf[512];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n < 0 ? "" : std::string(buf, static_cast<size_t>(n));
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

class SdNotifyTest : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv("NOTIFY_SOCKET"); }
};

TEST_F(SdNotifyTest, WithoutNotifySocketDoesNothing) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotify("READY=1").ok());
}

TEST_F(SdNotifyTest, SendsTheStateToAPathSocket) {
  std::string path =
      (std::filesystem::temp_directory_path() / ("gpuha-notify-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(path);
  NotifySocket s(path);
  ASSERT_TRUE(s.bound());
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  ASSERT_TRUE(SdNotify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(s.Receive(), "READY=1\nSTATUS=serving");
  std::filesystem::remove(path);
}

TEST_F(SdNotifyTest, SendsTheStateToAnAbstractSocket) {
  std::string name = "@gpuha-notify-test-" + std::to_string(::getpid());
  NotifySocket s(name);
  ASSERT_TRUE(s.bound());
  ::setenv("NOTIFY_SOCKET", name.c_str(), 1);
  ASSERT_TRUE(SdNotify("STOPPING=1").ok());
  EXPECT_EQ(s.Receive(), "STOPPING=1");
}

TEST_F(SdNotifyTest, ABadSocketNameIsAnErrorNamingIt) {
  ::setenv("NOTIFY_SOCKET", "relative/path", 1);
  absl::Status s = SdNotify("READY=1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'relative/path'"));
  ::setenv("NOTIFY_SOCKET", "/nonexistent/gpuha/notify", 1);
  s = SdNotify("READY=1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/gpuha/notify"));
}

}  // namespace
}  // namespace gpuha::common
