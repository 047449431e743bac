#include "common/heartbeat_datagram.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/udp.h"

namespace gpuha::common {
namespace {

using ::testing::HasSubstr;

const std::string kKeyBytes(32, 'k');

std::unique_ptr<DatagramKey> Key(absl::string_view bytes) {
  absl::StatusOr<std::unique_ptr<DatagramKey>> k = DatagramKey::Create(bytes);
  EXPECT_TRUE(k.ok()) << k.status();
  return std::move(k).value();
}

TEST(HeartbeatDatagramTest, TheMacIsHmacSha256) {
  // RFC 4231, test case 2, the data given in two parts.
  std::unique_ptr<DatagramKey> owned = Key("Jefe");
  DatagramKey& key = *owned;
  EXPECT_EQ(absl::BytesToHexString(key.Mac("what do ya", " want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // The context is reused: the same input, the same MAC.
  EXPECT_EQ(absl::BytesToHexString(key.Mac("what do ya want ", "for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HeartbeatDatagramTest, SealedIsOpenedWithItsKeyOnly) {
  std::unique_ptr<DatagramKey> owned = Key(kKeyBytes);
  DatagramKey& key = *owned;
  const std::string d = SealDatagram(0x0102030405060708ULL, key, "payload");
  ASSERT_EQ(d.size(), kDatagramHeaderBytes + 7);
  EXPECT_EQ(d.substr(0, 4), "GHB1");
  EXPECT_EQ(d.substr(4, 8), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  absl::StatusOr<uint64_t> session = DatagramSession(d);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(*session, 0x0102030405060708ULL);
  absl::StatusOr<absl::string_view> p = OpenDatagram(d, key);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, "payload");
  // An empty payload is a datagram too (every field of a heartbeat at its default).
  EXPECT_TRUE(OpenDatagram(SealDatagram(1, key, ""), key).ok());

  std::unique_ptr<DatagramKey> other_key = Key(std::string(32, 'x'));
  absl::StatusOr<absl::string_view> other = OpenDatagram(d, *other_key);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("bytes 12-43"));
}

TEST(HeartbeatDatagramTest, EveryAlteredByteIsRefusedAndNamed) {
  std::unique_ptr<DatagramKey> owned = Key(kKeyBytes);
  DatagramKey& key = *owned;
  const std::string d = SealDatagram(42, key, "a heartbeat");
  for (size_t i = 0; i < d.size(); ++i) {
    std::string bad = d;
    bad[i] ^= 0x01;
    absl::StatusOr<absl::string_view> p = OpenDatagram(bad, key);
    ASSERT_FALSE(p.ok()) << "byte " << i << " altered and accepted";
    EXPECT_THAT(p.status().message(), HasSubstr(i < 4 ? "bytes 0-3" : "bytes 12-43")) << i;
  }
  absl::StatusOr<uint64_t> shortened = DatagramSession(d.substr(0, kDatagramHeaderBytes - 1));
  EXPECT_THAT(shortened.status().message(),
              HasSubstr("datagram of 43 bytes: shorter than its 44-byte header"));
  EXPECT_THAT(DatagramSession(std::string(50, '\xff')).status().message(),
              HasSubstr("bytes 0-3 are \"\\xff\\xff\\xff\\xff\", not \"GHB1\""));
}

TEST(HeartbeatDatagramTest, KeysAndSessionsAreRandom) {
  EXPECT_EQ(RandomBytes(32).size(), 32u);
  EXPECT_NE(RandomBytes(32), RandomBytes(32));
}

TEST(UdpTest, DatagramsArriveInOrderOnLoopbackAndStopEndsTheThread) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  auto rx = UdpReceiver::Start({"127.0.0.1", 0}, [&](absl::string_view d) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(d);
    cv.notify_all();
  });
  ASSERT_TRUE(rx.ok()) << rx.status();
  ASSERT_NE((*rx)->port(), 0);
  auto tx = UdpSender::Open({"127.0.0.1", (*rx)->port()});
  ASSERT_TRUE(tx.ok()) << tx.status();
  for (const char* d : {"one", "two", "three"}) ASSERT_TRUE((*tx)->Send(d).ok());
  ASSERT_TRUE((*tx)->Send(std::string(9000, 'x')).ok());  // larger than any buffer of ours
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return got.size() == 4; }));
  }
  EXPECT_EQ(got[0], "one");
  EXPECT_EQ(got[2], "three");
  EXPECT_EQ(got[3].size(), 9000u);
  const auto t0 = std::chrono::steady_clock::now();
  (*rx)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));

  // Bad addresses are named. (The stopped receiver still holds its port.)
  auto taken = UdpReceiver::Start({"127.0.0.1", (*rx)->port()}, [](absl::string_view) {});
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(taken.status().message(),
              HasSubstr(absl::StrCat("UDP 127.0.0.1:", (*rx)->port(), ": cannot bind")));
  auto unresolvable = UdpSender::Open({"no such host.invalid", 1});
  EXPECT_THAT(unresolvable.status().message(), HasSubstr("cannot resolve"));
}

// A burst past the socket's buffer while the reader is busy: what the
// kernel dropped is reported (SO_RXQ_OVFL), and never more than was lost.
// (A drop is reported with the next datagram read, so probes follow; drops
// in the loopback device's own backlog are not the socket's to count.)
TEST(UdpTest, DatagramsTheKernelDropsAreReported) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  size_t got = 0;
  std::atomic<uint64_t> dropped{0};
  auto rx = UdpReceiver::Start(
      {"127.0.0.1", 0},
      [&](absl::string_view) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return release; });  // the first one holds the reader
        ++got;
        cv.notify_all();
      },
      [&](uint64_t n) { dropped += n; });
  ASSERT_TRUE(rx.ok()) << rx.status();
  auto tx = UdpSender::Open({"127.0.0.1", (*rx)->port()});
  ASSERT_TRUE(tx.ok()) << tx.status();
  // 20 MiB in 1 KiB datagrams: more than any receive buffer the kernel grants.
  // Paced a little, so that the loopback device's own queue keeps up (its
  // drops are not the socket's, and would hit tests running beside).
  size_t sent = 0;
  size_t refused = 0;
  for (; sent < 20000; ++sent) {
    refused += !(*tx)->Send(std::string(1024, 'x')).ok();
    if (sent % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  EXPECT_EQ(refused, 0u);
  for (int probe = 0; probe < 100 && dropped.load() == 0; ++probe) {
    ASSERT_TRUE((*tx)->Send("probe").ok());
    ++sent;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(dropped.load(), 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_GT(got, 0u);
  EXPECT_LE(got + dropped.load(), sent);
}

// A name that resolves to several addresses is heard on each, as gRPC
// listens: an agent that reached the controller at any of them can beat.
TEST(UdpTest, EveryAddressOfTheHostIsHeardOnOnePort) {
  std::vector<std::string> addresses;  // what "localhost" is here, and can be bound
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  ASSERT_EQ(::getaddrinfo("localhost", "0", &hints, &found), 0);
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && ::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      addresses.push_back(a->ai_family == AF_INET6 ? "::1" : "127.0.0.1");
    }
    if (fd >= 0) ::close(fd);
  }
  ::freeaddrinfo(found);
  ASSERT_FALSE(addresses.empty());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  auto rx = UdpReceiver::Start({"localhost", 0}, [&](absl::string_view d) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(d);
    cv.notify_all();
  });
  ASSERT_TRUE(rx.ok()) << rx.status();
  for (const std::string& a : addresses) {
    auto tx = UdpSender::Open({a, (*rx)->port()});
    ASSERT_TRUE(tx.ok()) << tx.status();
    ASSERT_TRUE((*tx)->Send("to " + a).ok()) << a;
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(
      cv.wait_for(lock, std::chrono::seconds(5), [&] { return got.size() == addresses.size(); }))
      << "heard " << got.size() << " of " << addresses.size();
  for (const std::string& a : addresses) {
    EXPECT_NE(std::find(got.begin(), got.end(), "to " + a), got.end()) << a;
  }
}

TEST(UdpTest, GrpcPeerHostReadsEveryForm) {
  EXPECT_EQ(*GrpcPeerHost("ipv4:10.0.0.5:7400"), "10.0.0.5");
  EXPECT_EQ(*GrpcPeerHost("ipv6:[::1]:7400"), "::1");
  EXPECT_EQ(*GrpcPeerHost("ipv6:%5B::1%5D:7400"), "::1");
  EXPECT_EQ(*GrpcPeerHost("ipv6:%5B%3A%3A1%5D:7400"), "::1");
  EXPECT_THAT(GrpcPeerHost("unix:/run/x.sock").status().message(),
              HasSubstr("'unix:/run/x.sock' is not ipv4:HOST:PORT"));
  EXPECT_FALSE(GrpcPeerHost("ipv4:10.0.0.5").ok());
}

}  // namespace
}  // namespace gpuha::common
