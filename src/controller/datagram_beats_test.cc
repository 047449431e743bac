// Heartbeat datagrams at the controller (Controller::AgentDatagram): a
// stream's session and key, newer beats only, and the failure detector fed
// by them as by the stream. Fake clock and sinks, no sockets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/heartbeat_datagram.h"
#include "controller/controller.h"
#include "controller/testing/controller_fixture.h"

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

class DatagramBeatsTest : public ControllerTest {
 protected:
  // a1's agent connects again, now offered datagrams; their session and key.
  v1::HeartbeatDatagrams Offer() {
    c_->SetDatagramPort(7400);
    Connect("a1");
    const std::vector<v1::ControllerMessage>& sent = sinks_["a1"]->sent;
    EXPECT_FALSE(sent.empty());
    EXPECT_TRUE(sent.front().has_welcome());
    return sent.front().welcome().datagrams();
  }
  v1::Heartbeat Healthy(uint64_t seq) {
    v1::Heartbeat hb;
    hb.set_seq(seq);
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.mutable_server()->set_running(true);
    hb.mutable_server()->set_ready(true);
    return hb;
  }
  std::string Sealed(const v1::HeartbeatDatagrams& d, const v1::Heartbeat& hb) {
    std::unique_ptr<common::DatagramKey> key = common::DatagramKey::Create(d.key()).value();
    return common::SealDatagram(d.session(), *key, hb.SerializeAsString());
  }
};

TEST_F(DatagramBeatsTest, AWelcomeOffersASessionOfItsOwnOnlyWhenAPortIsSet) {
  Start();
  ASSERT_TRUE(sinks_["a1"]->sent.front().has_welcome());
  EXPECT_FALSE(sinks_["a1"]->sent.front().welcome().has_datagrams());  // no port: no offer
  v1::HeartbeatDatagrams first = Offer();
  EXPECT_EQ(first.port(), 7400u);
  EXPECT_NE(first.session(), 0u);
  EXPECT_EQ(first.key().size(), common::kDatagramKeyBytes);
  v1::HeartbeatDatagrams second = Offer();  // a reconnect: a new session and key
  EXPECT_NE(second.session(), first.session());
  EXPECT_NE(second.key(), first.key());
  // The old session's late datagram is stale; a session never given is not
  // an agent's.
  absl::Status old = c_->AgentDatagram(Sealed(first, Healthy(1)));
  EXPECT_EQ(old.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(old.message(), HasSubstr("bytes 4-11: session " + std::to_string(first.session()) +
                                       " ended (a late datagram)"));
  v1::HeartbeatDatagrams never = second;
  never.set_session(second.session() ^ first.session());
  absl::Status unknown = c_->AgentDatagram(Sealed(never, Healthy(1)));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("is no connected agent's"));
  EXPECT_EQ(c_->counters().datagrams_refused, 1u);
  EXPECT_EQ(c_->counters().datagrams_stale, 1u);
  EXPECT_TRUE(c_->AgentDatagram(Sealed(second, Healthy(1))).ok());
}

TEST_F(DatagramBeatsTest, ABeatIsTakenOnceFromEitherPathAndTheFirstDatagramIsAcknowledged) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  const uint64_t beats = c_->counters().heartbeats;
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(5))).ok());
  EXPECT_EQ(c_->counters().heartbeats, beats + 1);
  EXPECT_EQ(c_->counters().heartbeat_datagrams, 1u);
  const v1::ControllerMessage& heard = sinks_["a1"]->sent.back();
  ASSERT_TRUE(heard.has_datagrams_heard());
  EXPECT_EQ(heard.datagrams_heard().session(), d.session());

  // The same beat again, by datagram (a replay) or by the stream (sent both
  // ways before the agent heard), changes nothing.
  absl::Status replay = c_->AgentDatagram(Sealed(d, Healthy(5)));
  EXPECT_EQ(replay.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(replay.message(), HasSubstr("heartbeat 5 is not newer than 5"));
  EXPECT_EQ(c_->counters().datagrams_stale, 1u);
  c_->AgentHeartbeat("a1", Healthy(5));
  EXPECT_EQ(c_->counters().heartbeats, beats + 1);
  c_->AgentHeartbeat("a1", Healthy(6));  // a newer one on the stream counts
  EXPECT_EQ(c_->counters().heartbeats, beats + 2);
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(8))).ok());
  // Beat 7 on the stream, overtaken by datagram 8 (the stream's bytes were
  // slower): old as liveness, but its telemetry and XID are applied.
  v1::Heartbeat seven = Healthy(7);
  v1::GpuSample* g = seven.add_gpus();
  g->set_index(0);
  g->set_temperature_c(71);
  v1::XidEvent* x = seven.add_xids();
  x->set_gpu_index(0);
  x->set_xid(31);
  c_->AgentHeartbeat("a1", seven);
  EXPECT_EQ(c_->counters().heartbeats, beats + 3);
  nlohmann::json node = *c_->NodeJson("a1");
  ASSERT_EQ(node["gpus"].size(), 1u);
  EXPECT_EQ(node["gpus"][0]["temperature_c"], 71);
  ASSERT_EQ(node["gpus"][0]["xids"].size(), 1u);
  EXPECT_EQ(node["gpus"][0]["xids"][0]["xid"], 31);
  // Datagram 8 stays the newest: 7 again by datagram is stale.
  EXPECT_EQ(c_->AgentDatagram(Sealed(d, Healthy(7))).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(DatagramBeatsTest, AnOvertakenStreamBeatDoesNotUndoTheNewerState) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(10))).ok());
  ASSERT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  // Beats 8 (its server not ready yet) and 9 came on the stream before
  // datagram 10 but arrive after it: 8's state is older than 10's.
  v1::Heartbeat eight = Healthy(8);
  eight.mutable_server()->set_ready(false);
  eight.set_health(v1::NODE_HEALTH_DEGRADED);
  c_->AgentHeartbeat("a1", eight, sinks_["a1"].get());
  c_->AgentHeartbeat("a1", Healthy(9), sinks_["a1"].get());
  nlohmann::json node = *c_->NodeJson("a1");
  EXPECT_EQ(node["lifecycle"], "serving");
  EXPECT_EQ(node["health"], "healthy");
  EXPECT_EQ(sinks_["a1"]->fences(), 0);
}

TEST_F(DatagramBeatsTest, BeatsOfAStreamAnotherReplacedAreDropped) {
  Start();
  std::shared_ptr<FakeSink> old_stream = sinks_["a1"];
  v1::HeartbeatDatagrams d = Offer();  // an mTLS reconnect: a new stream for a1
  // The old process's late beat, numbered far ahead of the new one's.
  c_->AgentHeartbeat("a1", Healthy(5000), old_stream.get());
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(1))).ok());  // not stale
  EXPECT_EQ(c_->counters().heartbeat_datagrams, 1u);
  // Acknowledged once per session.
  int acks = 0;
  for (const v1::ControllerMessage& m : sinks_["a1"]->sent) acks += m.has_datagrams_heard();
  EXPECT_EQ(acks, 1);
}

TEST_F(DatagramBeatsTest, ForgedAndMalformedDatagramsAreRefusedWithTheBytesAtFault) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  v1::HeartbeatDatagrams forged = d;
  forged.set_key(std::string(common::kDatagramKeyBytes, 'x'));
  absl::Status s = c_->AgentDatagram(Sealed(forged, Healthy(1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("bytes 12-43"));
  s = c_->AgentDatagram("GHB1");
  EXPECT_THAT(s.message(), HasSubstr("datagram of 4 bytes"));
  std::unique_ptr<common::DatagramKey> key = common::DatagramKey::Create(d.key()).value();
  s = c_->AgentDatagram(common::SealDatagram(d.session(), *key, "\xff\xff\xff"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("bytes 44-46 of node 'a1': not a Heartbeat message"));
  EXPECT_EQ(c_->counters().datagrams_refused, 3u);
  EXPECT_EQ(c_->counters().heartbeat_datagrams, 0u);
  EXPECT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(1))).ok());

  // A stream that ends takes its session with it.
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  EXPECT_EQ(c_->AgentDatagram(Sealed(d, Healthy(2))).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(c_->counters().heartbeat_datagrams, 1u);
}

// UDP blocked after the controller heard datagrams (a firewall change): the
// stream's beats go on, skipping the beats sent as datagrams, and none of
// those comes for a second. The agent is told to beat on its stream; a
// late datagram, or a controller that stalled, is no such sign.
TEST_F(DatagramBeatsTest, AgentsWhoseDatagramsStopArrivingAreToldToBeatOnTheirStreams) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  auto lost_sent = [&] {
    int n = 0;
    for (const v1::ControllerMessage& m : sinks_["a1"]->sent) n += m.has_datagrams_lost();
    return n;
  };
  const AgentSink* stream = sinks_["a1"].get();
  // Ticks every 10 ms for `for_`, the other nodes beating; a1's stream
  // beats every 500 ms (telemetry), 9 beats apart, its datagrams not at all.
  uint64_t seq = 0;
  auto run = [&](milliseconds for_) {
    for (milliseconds t(0); t < for_; t += milliseconds(10)) {
      clock_.Advance(milliseconds(10));
      elapsed_ += 10;
      if (elapsed_ % 50 == 0) {
        for (const char* n : {"a2", "a3", "p1"}) Beat(n);
      }
      if (elapsed_ % 500 == 0) c_->AgentHeartbeat("a1", Healthy(seq += 10), stream);
      c_->Tick();
    }
  };
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(++seq))).ok());  // heard
  run(milliseconds(900));
  EXPECT_EQ(lost_sent(), 0);  // under a second
  // A late datagram: the path works, behind the stream.
  EXPECT_EQ(c_->AgentDatagram(Sealed(d, Healthy(seq - 1))).code(),
            absl::StatusCode::kAlreadyExists);
  run(milliseconds(900));
  EXPECT_EQ(lost_sent(), 0);
  // The controller stalls 3 s (a hung store write): datagrams may sit
  // unread behind the stream's beats. Forgiven, as the detector forgives.
  clock_.Advance(milliseconds(3000));
  c_->Tick();
  EXPECT_EQ(lost_sent(), 0);
  EXPECT_EQ(c_->counters().datagram_fallbacks, 0u);

  run(milliseconds(1200));  // a second with none: UDP is blocked
  ASSERT_EQ(lost_sent(), 1);
  const v1::ControllerMessage& lost = sinks_["a1"]->sent.back();
  EXPECT_EQ(lost.datagrams_lost().session(), d.session());
  EXPECT_THAT(lost.datagrams_lost().reason(),
              HasSubstr("no heartbeat datagram arrived, not even late, for 1"));
  EXPECT_THAT(lost.datagrams_lost().reason(), HasSubstr("beats (UDP blocked on the way?)"));
  EXPECT_EQ(c_->counters().datagram_fallbacks, 1u);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("datagrams_lost"));
  // The session is over: a late datagram of it is stale, not forged.
  const uint64_t refused = c_->counters().datagrams_refused;
  absl::Status late = c_->AgentDatagram(Sealed(d, Healthy(seq + 1)));
  EXPECT_EQ(late.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(late.message(), HasSubstr("ended (a late datagram)"));
  EXPECT_EQ(c_->counters().datagrams_refused, refused);
  // From now on every beat comes on the stream, each one counted, none a sign.
  const uint64_t beats = c_->counters().heartbeats;
  for (uint64_t i = 1; i <= 17; ++i) c_->AgentHeartbeat("a1", Healthy(seq + i), stream);
  EXPECT_EQ(c_->counters().heartbeats, beats + 17);
  run(milliseconds(2000));
  EXPECT_EQ(lost_sent(), 1);
}

// Beats that all go on the stream (the state changes at each) skip none:
// datagrams that were never sent are not missed.
TEST_F(DatagramBeatsTest, StreamBeatsThatSkipNothingAreNoSignOfLostDatagrams) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  uint64_t seq = 1;
  ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(seq))).ok());
  for (int t = 0; t < 300; ++t) {
    clock_.Advance(milliseconds(10));
    if (t % 5 == 0) {
      for (const char* n : {"a2", "a3", "p1"}) Beat(n);
      c_->AgentHeartbeat("a1", Healthy(++seq), sinks_["a1"].get());
    }
    c_->Tick();
  }
  EXPECT_EQ(c_->counters().datagram_fallbacks, 0u);
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
}

// The UDP thread's lookups (datagram_mu_) and the stream threads' session
// changes (mu_, then datagram_mu_) at once: late datagrams of ended
// sessions and unknown ones while agents reconnect. A lock taken in the
// other order hangs here (the test's timeout).
TEST_F(DatagramBeatsTest, DatagramsDuringReconnectsTakeNoLockInTheWrongOrder) {
  Start();
  v1::HeartbeatDatagrams first = Offer();
  Offer();  // first ends before the UDP thread starts: its datagrams are late
  v1::HeartbeatDatagrams unknown = first;
  unknown.set_session(first.session() ^ 0x5a5a5a5a5a5a5a5aULL);
  const std::string late = Sealed(first, Healthy(1));
  const std::string forged = Sealed(unknown, Healthy(1));
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0};
  std::thread udp([&] {
    while (!done) {
      (void)c_->AgentDatagram(late);
      (void)c_->AgentDatagram(forged);
      ++rounds;
    }
  });
  while (rounds.load() == 0) std::this_thread::yield();  // overlapping for sure
  const int start = rounds.load();
  for (int i = 0; i < 200 || rounds.load() < start + 50; ++i) {
    Offer();  // a reconnect: the last session ends, a new one opens
    c_->AgentDisconnected("a1", sinks_["a1"].get());
  }
  done = true;
  udp.join();
  const ControllerCounters c = c_->counters();
  EXPECT_GT(c.datagrams_stale, 0u);    // the late ones
  EXPECT_GT(c.datagrams_refused, 0u);  // the unknown ones
  EXPECT_EQ(c.heartbeat_datagrams, 0u);
}

TEST_F(DatagramBeatsTest, DatagramsAloneKeepANodeAliveAndTheirSilenceFailsIt) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  uint64_t seq = 0;
  auto run = [&](milliseconds for_, bool a1_beats) {
    for (milliseconds t(0); t < for_; t += milliseconds(10)) {
      clock_.Advance(milliseconds(10));
      if ((elapsed_ += 10) % 50 == 0) {
        for (const char* n : {"a2", "a3", "p1"}) Beat(n);
        if (a1_beats) {
          ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(++seq))).ok());
        }
      }
      c_->Tick();
    }
  };
  run(milliseconds(2000), true);
  EXPECT_NE((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_EQ(c_->counters().heartbeat_datagrams, 40u);
  run(milliseconds(300), false);  // the agent hangs: no datagram, its stream open
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
}

// Adversarial finding: a UDP flood filled the controller's socket buffer,
// the kernel dropped real heartbeats among the flood's datagrams, and the
// detector failed healthy nodes on that silence. Drops the kernel reports
// make every datagram-fed node beat on its stream (which a UDP flood does
// not starve), its silence until then forgiven; a node that then goes
// silent on its stream too still fails.
TEST_F(DatagramBeatsTest, ASilenceTheKernelsDropsExplainIsNotTheNodes) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  const AgentSink* stream = sinks_["a1"].get();
  uint64_t seq = 0;
  bool on_stream = false;
  auto run = [&](milliseconds for_, bool a1_beats, bool flood) {
    for (milliseconds t(0); t < for_; t += milliseconds(10)) {
      clock_.Advance(milliseconds(10));
      if (flood) c_->CountDatagramDrops(3000);  // the receiver's reports, as it reads
      if ((elapsed_ += 10) % 50 == 0) {
        for (const char* n : {"a2", "a3", "p1"}) Beat(n);
        if (a1_beats && on_stream) c_->AgentHeartbeat("a1", Healthy(++seq), stream);
        // Its datagrams are lost in the flood.
        if (a1_beats && !on_stream && !flood) {
          ASSERT_TRUE(c_->AgentDatagram(Sealed(d, Healthy(++seq))).ok());
        }
      }
      c_->Tick();
      for (const v1::ControllerMessage& m : sinks_["a1"]->sent) on_stream |= m.has_datagrams_lost();
    }
  };
  run(milliseconds(2000), true, false);
  ASSERT_FALSE(on_stream);
  // The flood: the first tick that hears of drops tells a1 to beat on its
  // stream; it does, and is never failed.
  run(milliseconds(1000), true, true);
  ASSERT_TRUE(on_stream);
  EXPECT_NE((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  const v1::ControllerMessage* lost = nullptr;
  for (const v1::ControllerMessage& m : sinks_["a1"]->sent) {
    if (m.has_datagrams_lost()) lost = &m;
  }
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(lost->datagrams_lost().session(), d.session());
  EXPECT_THAT(lost->datagrams_lost().reason(),
              HasSubstr("the controller's UDP socket dropped 3000 datagram(s) unread"));
  EXPECT_EQ(c_->counters().datagram_fallbacks, 1u);
  // Still flooded, a1 hangs: its stream is silent too, and it fails.
  run(milliseconds(1500), false, true);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
}

// Datagrams longer than a heartbeat are refused by their length, before
// any HMAC is computed over them.
TEST_F(DatagramBeatsTest, ADatagramLongerThanAHeartbeatIsRefusedByItsLength) {
  Start();
  v1::HeartbeatDatagrams d = Offer();
  std::string big = Sealed(d, Healthy(1)) + std::string(common::kMaxDatagramBytes, 'x');
  absl::Status s = c_->AgentDatagram(big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("longer than a heartbeat's 1400"));
}

}  // namespace
}  // namespace gpuha::controller
