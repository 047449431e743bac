#include "controller/failure_detector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using std::chrono::milliseconds;

class FailureDetectorTest : public ::testing::Test {
 protected:
  // Heartbeats every `interval` for `count` beats, checking every 10 ms.
  void Beat(const std::string& node, milliseconds interval, int count) {
    for (int i = 0; i < count; ++i) {
      for (milliseconds t(0); t < interval; t += milliseconds(10)) {
        clock_.Advance(milliseconds(10));
        for (auto& c : d_.Check()) changes_.push_back(c);
      }
      d_.Heartbeat(node);
    }
  }
  // Every node in `nodes` beats every `interval`, `count` times.
  void BeatAll(const std::vector<std::string>& nodes, milliseconds interval, int count) {
    for (int i = 0; i < count; ++i) {
      Quiet(interval);
      for (const auto& n : nodes) d_.Heartbeat(n);
    }
  }
  // No heartbeat for `d`, checking every 5 ms.
  void Quiet(milliseconds d) {
    for (milliseconds t(0); t < d; t += milliseconds(5)) {
      clock_.Advance(milliseconds(5));
      for (auto& c : d_.Check()) changes_.push_back(c);
    }
  }
  // Advances in 5 ms steps until `node` reaches `want`; returns the time it took.
  milliseconds TimeUntil(const std::string& node, Liveness want, milliseconds limit) {
    milliseconds t(0);
    while (d_.state(node) != want && t < limit) {
      clock_.Advance(milliseconds(5));
      t += milliseconds(5);
      for (auto& c : d_.Check()) changes_.push_back(c);
    }
    return t;
  }
  common::FakeClock clock_;
  FailureDetector d_{DetectorOptions{}, &clock_};
  std::vector<LivenessChange> changes_;
  milliseconds elapsed_{0};
};

TEST_F(FailureDetectorTest, SteadyHeartbeatsStayAlive) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 200);
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
  EXPECT_TRUE(changes_.empty());
}

TEST_F(FailureDetectorTest, HungAgentFailsWithin200MsOfItsLastHeartbeat) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 100);
  milliseconds t = TimeUntil("n1", Liveness::kFailed, milliseconds(5000));
  EXPECT_LE(t.count(), 200);
  EXPECT_GE(t.count(), 150);  // the floor: never faster than BFD's 3 x 50 ms
  ASSERT_FALSE(changes_.empty());
  EXPECT_EQ(changes_.front().to, Liveness::kSuspect);
  EXPECT_EQ(changes_.back().to, Liveness::kFailed);
  EXPECT_NE(changes_.back().reason.find("threshold 150 ms"), std::string::npos);
}

TEST_F(FailureDetectorTest, BrokenStreamIsSuspectAtOnceAndFailedWithinTheGrace) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 10);
  d_.StreamBroken("n1");
  auto c = d_.Check();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].to, Liveness::kSuspect);
  EXPECT_EQ(c[0].reason, "stream broke");
  milliseconds t = TimeUntil("n1", Liveness::kFailed, milliseconds(1000));
  EXPECT_LE(t.count(), 100);  // a killed agent is detected within 100 ms
}

TEST_F(FailureDetectorTest, QuickReconnectAfterABreakIsNotAFailure) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 10);
  d_.StreamBroken("n1");
  d_.Check();
  clock_.Advance(milliseconds(10));
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 10);
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
}

TEST_F(FailureDetectorTest, JitteryNodeGetsALongerThreshold) {
  d_.Connected("n1");
  for (int i = 0; i < 100; ++i) Beat("n1", milliseconds(i % 2 ? 20 : 100), 1);
  EXPECT_GT(d_.Threshold("n1"), milliseconds(150));
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
}

TEST_F(FailureDetectorTest, ThresholdIsCappedAtTheCeiling) {
  d_.Connected("n1");
  Beat("n1", milliseconds(2000), 5);
  EXPECT_LE(d_.Threshold("n1"), std::chrono::seconds(3));
}

TEST_F(FailureDetectorTest, FailedStaysFailedUntilReconnected) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 10);
  TimeUntil("n1", Liveness::kFailed, milliseconds(1000));
  d_.Heartbeat("n1");  // a hung agent resumes: still failed, the controller decides
  d_.Check();
  EXPECT_EQ(d_.state("n1"), Liveness::kFailed);
  d_.Connected("n1");
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
}

// A loaded controller host (a chaos test beside a busy loop on two cores)
// once read every live node's beats late together, 152 to 168 ms, and
// fenced all three: 503 for every stream. Silence most nodes share is held
// until the ceiling; a node that is really gone fails then.
TEST_F(FailureDetectorTest, SilenceMostNodesShareIsHeldUntilTheCeiling) {
  const std::vector<std::string> all = {"n1", "n2", "n3", "n4"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  // n4 crashes: its stream breaks, and it fails as ever (its own word).
  d_.StreamBroken("n4");
  BeatAll({"n1", "n2", "n3"}, milliseconds(50), 1);
  ASSERT_EQ(d_.state("n4"), Liveness::kFailed);
  changes_.clear();
  // The other three go unheard together for 200 ms, past their 150 ms.
  Quiet(milliseconds(200));
  size_t held = 0;
  for (const auto& n : {"n1", "n2", "n3"}) EXPECT_EQ(d_.state(n), Liveness::kSuspect) << n;
  for (const auto& c : changes_) {
    EXPECT_NE(c.to, Liveness::kFailed) << c.node << ": " << c.reason;
    if (!c.held) continue;
    ++held;
    EXPECT_NE(c.reason.find("3 of 3 watched nodes are silent together"), std::string::npos)
        << c.reason;
  }
  EXPECT_EQ(held, 3u) << "one held change per node per silence";
  // Their beats resume: alive, nothing lost.
  BeatAll({"n1", "n2", "n3"}, milliseconds(50), 2);
  for (const auto& n : {"n1", "n2", "n3"}) EXPECT_EQ(d_.state(n), Liveness::kAlive) << n;
  // A silence that lasts to the ceiling (3 s) fails them all: a rack that
  // lost power is failed over, late rather than never.
  changes_.clear();
  Quiet(milliseconds(2990));
  for (const auto& n : {"n1", "n2", "n3"}) EXPECT_EQ(d_.state(n), Liveness::kSuspect) << n;
  Quiet(milliseconds(15));
  for (const auto& n : {"n1", "n2", "n3"}) EXPECT_EQ(d_.state(n), Liveness::kFailed) << n;
  ASSERT_FALSE(changes_.empty());
  EXPECT_NE(changes_.back().reason.find("held as shared silence before"), std::string::npos)
      << changes_.back().reason;
}

// Beats are read again one by one: the hold outlasts the shared silence by a
// threshold, so the last ones back are not failed a tick after the first;
// a node still unheard a threshold later fails then.
TEST_F(FailureDetectorTest, AHeldSilenceEndsOneBeatAtATime) {
  const std::vector<std::string> all = {"n1", "n2", "n3", "n4"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  changes_.clear();
  BeatAll({"n1"}, milliseconds(50), 4);  // n2, n3, n4 unheard 200 ms: held
  d_.Heartbeat("n2");                    // 2 of 4 silent: no longer most
  BeatAll({"n1", "n2"}, milliseconds(10), 1);
  d_.Heartbeat("n3");
  BeatAll({"n1", "n2", "n3"}, milliseconds(10), 1);
  d_.Heartbeat("n4");
  BeatAll(all, milliseconds(50), 2);
  for (const auto& c : changes_) EXPECT_NE(c.to, Liveness::kFailed) << c.node << ": " << c.reason;
  for (const auto& n : all) EXPECT_EQ(d_.state(n), Liveness::kAlive) << n;

  // Again, and n3 and n4 stay silent: they fail a threshold after n2's beat.
  BeatAll({"n1"}, milliseconds(50), 4);
  ASSERT_EQ(d_.state("n3"), Liveness::kSuspect);
  d_.Heartbeat("n2");
  milliseconds t(0);
  while ((d_.state("n3") != Liveness::kFailed || d_.state("n4") != Liveness::kFailed) &&
         t < milliseconds(1000)) {
    BeatAll({"n1", "n2"}, milliseconds(10), 1);
    t += milliseconds(10);
  }
  EXPECT_GE(t.count(), 140);  // a threshold each (n4's a little longer: its last interval was)
  EXPECT_LE(t.count(), 250);
  EXPECT_EQ(d_.state("n2"), Liveness::kAlive);
}

// Two of three nodes silent together (a loaded host): the sharing ends
// when one beats again, before the other reaches its threshold. That one
// is held a threshold longer all the same; it failed 50 ms later once
// (ChaosTest.RollingAgentRestartWithSupervisedWorkersMovesWorkFirst: a
// healthy node taken out, "silent 151 ms (threshold 150 ms)", after the
// other had been heard at 102 ms). Unheard past that, it fails.
TEST_F(FailureDetectorTest, ANodeOverdueInASharedSilenceIsHeldWhenTheOthersAreHeardFirst) {
  const std::vector<std::string> all = {"n1", "n2", "n3"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  changes_.clear();
  BeatAll({"n3"}, milliseconds(10), 11);  // n1, n2 unheard 110 ms: shared, neither past 150
  d_.Heartbeat("n2");
  BeatAll({"n2", "n3"}, milliseconds(10), 9);  // n1 unheard 200 ms
  EXPECT_EQ(d_.state("n1"), Liveness::kSuspect);
  d_.Heartbeat("n1");
  BeatAll(all, milliseconds(10), 2);
  for (const auto& c : changes_) EXPECT_NE(c.to, Liveness::kFailed) << c.node << ": " << c.reason;
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
}

// The same, and n1 stays silent: it fails a threshold after the sharing
// ended, not at its own threshold, and not held to the ceiling.
TEST_F(FailureDetectorTest, ANodeOverdueInASharedSilenceFailsAThresholdAfterItEnds) {
  const std::vector<std::string> all = {"n1", "n2", "n3"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  BeatAll({"n3"}, milliseconds(10), 11);
  d_.Heartbeat("n2");
  milliseconds t(110);
  while (d_.state("n1") != Liveness::kFailed && t < milliseconds(1000)) {
    BeatAll({"n2", "n3"}, milliseconds(10), 1);
    t += milliseconds(10);
  }
  EXPECT_GE(t.count(), 240);  // the shared silence's last check (~105 ms) plus a threshold
  EXPECT_LE(t.count(), 300);
}

// Slow beats out of phase: a live node between its beats is not overdue, so
// one dead node among three is not held (counting every node silent 100 ms
// would have held it for the whole ceiling).
TEST_F(FailureDetectorTest, SlowBeatsOutOfPhaseDoNotHoldOneDeadNode) {
  const std::vector<std::string> all = {"n1", "n2", "n3"};
  for (const auto& n : all) d_.Connected(n);
  auto run = [&](milliseconds d, const std::vector<std::string>& beating) {
    for (milliseconds t(0); t < d; t += milliseconds(5)) {
      clock_.Advance(milliseconds(5));
      elapsed_ += milliseconds(5);
      for (size_t i = 0; i < beating.size(); ++i) {
        const int phase = beating[i] == "n1" ? 0 : beating[i] == "n2" ? 85 : 170;
        if ((elapsed_.count() - phase) % 250 == 0) d_.Heartbeat(beating[i]);
      }
      for (auto& c : d_.Check()) changes_.push_back(c);
    }
  };
  run(milliseconds(250 * 15), all);
  // (Suspect between beats: the suspect mark is an absolute 100 ms.)
  for (const auto& n : all) ASSERT_NE(d_.state(n), Liveness::kFailed) << n;
  run(milliseconds(600), {"n2", "n3"});
  EXPECT_EQ(d_.state("n1"), Liveness::kFailed);
  for (const auto& c : changes_) EXPECT_FALSE(c.held) << c.node << ": " << c.reason;
  EXPECT_NE(d_.state("n2"), Liveness::kFailed);
  EXPECT_NE(d_.state("n3"), Liveness::kFailed);
}

// A controller stalled again and again forgives silence each time; the
// ceiling counts from the nodes' last beat all the same.
TEST_F(FailureDetectorTest, ForgivenSilenceDoesNotStretchAHoldPastTheCeiling) {
  const std::vector<std::string> all = {"n1", "n2", "n3"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  for (int i = 0; i < 5; ++i) {
    Quiet(milliseconds(500));
    d_.ForgiveSilence();
  }
  for (const auto& n : all) EXPECT_EQ(d_.state(n), Liveness::kSuspect) << n;
  Quiet(milliseconds(505));
  for (const auto& n : all) EXPECT_EQ(d_.state(n), Liveness::kFailed) << n;
}

// The hold needs company: a node silent while most others beat fails at its
// threshold as before.
TEST_F(FailureDetectorTest, ANodeSilentAloneFailsAtItsThreshold) {
  const std::vector<std::string> all = {"n1", "n2", "n3"};
  for (const auto& n : all) d_.Connected(n);
  BeatAll(all, milliseconds(50), 20);
  changes_.clear();
  milliseconds t(0);
  while (d_.state("n1") != Liveness::kFailed && t < milliseconds(1000)) {
    BeatAll({"n2", "n3"}, milliseconds(10), 1);
    t += milliseconds(10);
  }
  EXPECT_LE(t.count(), 200);
  for (const auto& c : changes_) EXPECT_FALSE(c.held) << c.node << ": " << c.reason;
  EXPECT_EQ(d_.state("n2"), Liveness::kAlive);
}

// The watcher's hold (a node whose streams would have nowhere to go): the
// node is watched on as suspect, reported nowhere, and heard again it is
// alive; unheard for the ceiling it fails, saying it was held. A node
// already unheard that long, or whose stream broke, is not held.
TEST_F(FailureDetectorTest, AHoldToTheCeilingEndsWhenHeardOrUnheardThatLong) {
  d_.Connected("n1");
  Beat("n1", milliseconds(50), 20);
  ASSERT_LE(TimeUntil("n1", Liveness::kFailed, milliseconds(1000)).count(), 200);
  ASSERT_TRUE(d_.HoldToCeiling("n1"));
  EXPECT_EQ(d_.state("n1"), Liveness::kSuspect);
  changes_.clear();
  Quiet(milliseconds(500));
  EXPECT_EQ(d_.state("n1"), Liveness::kSuspect);
  EXPECT_TRUE(changes_.empty());
  d_.Heartbeat("n1");  // heard again: the hold is over
  Quiet(milliseconds(5));
  EXPECT_EQ(d_.state("n1"), Liveness::kAlive);
  // Silent again: failed at its threshold, held again, failed at the ceiling.
  EXPECT_LE(TimeUntil("n1", Liveness::kFailed, milliseconds(3000)).count(), 1000);
  ASSERT_TRUE(d_.HoldToCeiling("n1"));
  changes_.clear();
  const milliseconds held = TimeUntil("n1", Liveness::kFailed, milliseconds(5000));
  EXPECT_GE(held.count(), 1500);
  ASSERT_EQ(changes_.size(), 1u);
  EXPECT_THAT(changes_[0].reason, ::testing::HasSubstr("held until unheard for 3000 ms"));
  EXPECT_FALSE(d_.HoldToCeiling("n1"));  // unheard for the ceiling: no more hold
  d_.Connected("n2");
  d_.StreamBroken("n2");
  EXPECT_FALSE(d_.HoldToCeiling("n2"));
  EXPECT_FALSE(d_.HoldToCeiling("nobody"));
}

TEST_F(FailureDetectorTest, UnknownNodeReadsAsFailedAndForgetRemoves) {
  EXPECT_EQ(d_.state("ghost"), Liveness::kFailed);
  d_.Connected("n1");
  d_.Forget("n1");
  EXPECT_EQ(d_.state("n1"), Liveness::kFailed);
  EXPECT_TRUE(d_.Check().empty());
}

}  // namespace
}  // namespace gpuha::controller
