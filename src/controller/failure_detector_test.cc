#include "controller/failure_detector.h"

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

TEST_F(FailureDetectorTest, UnknownNodeReadsAsFailedAndForgetRemoves) {
  EXPECT_EQ(d_.state("ghost"), Liveness::kFailed);
  d_.Connected("n1");
  d_.Forget("n1");
  EXPECT_EQ(d_.state("n1"), Liveness::kFailed);
  EXPECT_TRUE(d_.Check().empty());
}

}  // namespace
}  // namespace gpuha::controller
