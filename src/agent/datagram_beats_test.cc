#include "agent/datagram_beats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/heartbeat_datagram.h"

namespace gpuha::agent {
namespace {

using ::testing::HasSubstr;

// A controller's UDP port: the heartbeats it could open with the key.
class Port {
 public:
  Port() {
    auto rx = common::UdpReceiver::Start({"127.0.0.1", 0}, [this](absl::string_view d) {
      absl::StatusOr<absl::string_view> p = common::OpenDatagram(d, *mac_);
      std::lock_guard<std::mutex> lock(mu_);
      v1::Heartbeat hb;
      if (p.ok() && hb.ParseFromArray(p->data(), static_cast<int>(p->size()))) got_.push_back(hb);
      cv_.notify_all();
    });
    EXPECT_TRUE(rx.ok()) << rx.status();
    if (rx.ok()) rx_ = std::move(*rx);
  }
  v1::HeartbeatDatagrams Offer() const {
    v1::HeartbeatDatagrams o;
    o.set_port(rx_->port());
    o.set_session(7);
    o.set_key(key);
    return o;
  }
  // The seqs received once `n` datagrams came (or 2 s passed).
  std::vector<uint64_t> Seqs(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(2), [&] { return got_.size() >= n; });
    std::vector<uint64_t> out;
    for (const v1::Heartbeat& h : got_) out.push_back(h.seq());
    return out;
  }
  const std::string key = std::string(common::kDatagramKeyBytes, 'q');

 private:
  std::unique_ptr<common::DatagramKey> mac_ =
      common::DatagramKey::Create(key).value();  // the receiver thread's
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::Heartbeat> got_;
  std::unique_ptr<common::UdpReceiver> rx_;  // last: stopped before the rest goes
};

v1::Heartbeat Beat(uint64_t seq, v1::NodeHealth health = v1::NODE_HEALTH_HEALTHY) {
  v1::Heartbeat hb;
  hb.set_seq(seq);
  hb.set_sent_unix_nanos(1000 + seq);
  hb.set_health(health);
  hb.set_epoch(3);
  return hb;
}

// A beat to hand to Send(), which takes a pointer (it serializes in place).
v1::Heartbeat* Ptr(v1::Heartbeat hb) {
  static v1::Heartbeat held;
  held = std::move(hb);
  return &held;
}

TEST(DatagramBeatsTest, OnlyBeatsThatSayNothingNewGoAndTheStreamCarriesThemUntilHeard) {
  Port port;
  DatagramBeats beats;
  EXPECT_FALSE(beats.Send(Ptr(Beat(1))));  // nothing offered: the stream
  ASSERT_TRUE(beats.Open("ipv4:127.0.0.1:1", port.Offer()).ok());
  EXPECT_FALSE(beats.Send(Ptr(Beat(2))));  // the first: nothing to compare with
  EXPECT_FALSE(beats.Send(Ptr(Beat(3))));  // sent, but not heard yet: the stream too
  beats.Heard(99);                         // another session's word
  EXPECT_FALSE(beats.heard());
  beats.Heard(7);
  v1::Heartbeat four = Beat(4);
  EXPECT_TRUE(beats.Send(&four));                                    // the datagram alone
  EXPECT_EQ(four.SerializeAsString(), Beat(4).SerializeAsString());  // given back whole
  EXPECT_FALSE(beats.Send(Ptr(Beat(5, v1::NODE_HEALTH_DEGRADED))));  // a change: the stream
  EXPECT_TRUE(beats.Send(Ptr(Beat(6, v1::NODE_HEALTH_DEGRADED))));
  v1::Heartbeat telemetry = Beat(7, v1::NODE_HEALTH_DEGRADED);
  telemetry.add_gpus()->set_index(0);
  EXPECT_FALSE(beats.Send(&telemetry));  // telemetry: the stream
  v1::Heartbeat xid = Beat(8, v1::NODE_HEALTH_DEGRADED);
  xid.add_xids()->set_xid(31);
  EXPECT_FALSE(beats.Send(&xid));                                   // an XID: the stream
  EXPECT_TRUE(beats.Send(Ptr(Beat(9, v1::NODE_HEALTH_DEGRADED))));  // the same state again
  v1::Heartbeat big = Beat(10, v1::NODE_HEALTH_DEGRADED);
  big.add_reasons()->set_detail(std::string(2000, 'x'));
  EXPECT_FALSE(beats.Send(&big));  // a change anyway
  EXPECT_FALSE(beats.Send(&big));  // the same, but larger than a datagram may be
  EXPECT_EQ(port.Seqs(4), (std::vector<uint64_t>{3, 4, 6, 9}));

  beats.Reset();  // a new stream: nothing offered until its welcome
  EXPECT_FALSE(beats.heard());
  EXPECT_FALSE(beats.Send(Ptr(Beat(11))));
  EXPECT_FALSE(beats.Send(Ptr(Beat(12))));
}

TEST(DatagramBeatsTest, LostSendsEveryBeatOnTheStreamUntilTheNextOffer) {
  Port port;
  std::atomic<uint64_t> send_errors{0};
  DatagramBeats beats(&send_errors);
  ASSERT_TRUE(beats.Open("ipv4:127.0.0.1:1", port.Offer()).ok());
  beats.Heard(7);
  EXPECT_FALSE(beats.Send(Ptr(Beat(1))));
  EXPECT_TRUE(beats.Send(Ptr(Beat(2))));
  EXPECT_FALSE(beats.Lost(99));  // another session's word changes nothing
  EXPECT_TRUE(beats.Send(Ptr(Beat(3))));
  EXPECT_TRUE(beats.Lost(7));
  EXPECT_FALSE(beats.heard());
  for (uint64_t seq = 4; seq < 10; ++seq) EXPECT_FALSE(beats.Send(Ptr(Beat(seq)))) << seq;
  EXPECT_FALSE(beats.Lost(7));  // said twice: once is enough
  EXPECT_EQ(port.Seqs(2), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(send_errors.load(), 0u);
  ASSERT_TRUE(beats.Open("ipv4:127.0.0.1:1", port.Offer()).ok());  // a new stream offers again
  EXPECT_FALSE(beats.Send(Ptr(Beat(10))));
  EXPECT_FALSE(beats.Send(Ptr(Beat(11))));  // sent both ways until heard
  EXPECT_EQ(port.Seqs(3), (std::vector<uint64_t>{2, 3, 11}));
}

TEST(DatagramBeatsTest, ADatagramTheKernelRefusesIsCountedAndGoesOnTheStream) {
  std::atomic<uint64_t> send_errors{0};
  DatagramBeats beats(&send_errors);
  // A port held by a socket connected elsewhere: it takes nothing of ours,
  // so loopback answers ICMP port unreachable, and no one else can take it.
  const int holder = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  socklen_t len = sizeof(at);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&at), &len), 0);
  const uint16_t closed = ntohs(at.sin_port);
  sockaddr_in peer = at;
  peer.sin_port = htons(1);
  ASSERT_EQ(::connect(holder, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)), 0);
  v1::HeartbeatDatagrams offer;
  offer.set_port(closed);
  offer.set_session(7);
  offer.set_key(std::string(common::kDatagramKeyBytes, 'q'));
  ASSERT_TRUE(beats.Open("ipv4:127.0.0.1:1", offer).ok());
  beats.Heard(7);
  EXPECT_FALSE(beats.Send(Ptr(Beat(1))));
  // The first datagram goes out; the ICMP error it draws fails the next send
  // on the connected socket (ECONNREFUSED).
  for (uint64_t seq = 2; seq < 200 && send_errors.load() == 0; ++seq) {
    const bool alone = beats.Send(Ptr(Beat(seq)));
    if (send_errors.load() > 0) {
      EXPECT_FALSE(alone) << seq;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(send_errors.load(), 1u);
  ::close(holder);
}

TEST(DatagramBeatsTest, ABadOfferLeavesTheStream) {
  Port port;
  DatagramBeats beats;
  v1::HeartbeatDatagrams o = port.Offer();
  o.set_key("short");
  EXPECT_THAT(beats.Open("ipv4:127.0.0.1:1", o).message(),
              HasSubstr("datagrams.key has 5 bytes, not 32"));
  o = port.Offer();
  o.set_port(0);
  EXPECT_THAT(beats.Open("ipv4:127.0.0.1:1", o).message(), HasSubstr("datagrams.port 0"));
  EXPECT_THAT(beats.Open("unix:/x", port.Offer()).message(), HasSubstr("'unix:/x'"));
  beats.Heard(7);
  EXPECT_FALSE(beats.Send(Ptr(Beat(1))));
  EXPECT_FALSE(beats.Send(Ptr(Beat(2))));
}

}  // namespace
}  // namespace gpuha::agent
