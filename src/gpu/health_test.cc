#include "gpu/health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::gpu {
namespace {

using std::chrono::minutes;
using std::chrono::seconds;

GpuSample Healthy(uint32_t index = 0) {
  GpuSample s;
  s.index = index;
  s.temperature_c = 50;
  s.power_w = 40;
  s.power_limit_w = 72;
  s.memory_total_bytes = 100;
  s.memory_used_bytes = 30;
  return s;
}

Observation Obs(std::vector<GpuSample> gpus, std::vector<XidEvent> xids = {}) {
  Observation o;
  o.gpus = std::move(gpus);
  o.new_xids = std::move(xids);
  return o;
}

class HealthTest : public ::testing::Test {
 protected:
  HealthReport Feed(const Observation& o, int times = 1) {
    HealthReport r;
    for (int i = 0; i < times; ++i) r = eval_.Update(o, clock_.Now());
    return r;
  }
  common::FakeClock clock_;
  HealthEvaluator eval_{HealthThresholds{}};
};

TEST_F(HealthTest, HealthyReadingsStayHealthy) {
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1)}), 5);
  EXPECT_EQ(r.state, HealthState::kHealthy);
  EXPECT_TRUE(r.reasons.empty());
}

TEST_F(HealthTest, HotGpuDegradesThenDrainsAfterTwoSamples) {
  GpuSample warm = Healthy();
  warm.temperature_c = 85;
  EXPECT_EQ(Feed(Obs({warm})).state, HealthState::kHealthy);  // one sample is not enough
  HealthReport r = Feed(Obs({warm}));
  EXPECT_EQ(r.state, HealthState::kDegraded);
  EXPECT_TRUE(r.changed);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_EQ(r.reasons[0].code, "gpu0.temperature");
  EXPECT_THAT(r.reasons[0].detail, ::testing::HasSubstr("85.0 C >= warn 83"));
  GpuSample hot = Healthy();
  hot.temperature_c = 92;
  EXPECT_EQ(Feed(Obs({hot}), 2).state, HealthState::kDraining);
}

TEST_F(HealthTest, RecoveryNeedsSixHealthySamples) {
  GpuSample hot = Healthy();
  hot.temperature_c = 92;
  Feed(Obs({hot}), 2);
  ASSERT_EQ(eval_.state(), HealthState::kDraining);
  EXPECT_EQ(Feed(Obs({Healthy()}), 5).state, HealthState::kDraining);
  EXPECT_EQ(Feed(Obs({Healthy()})).state, HealthState::kHealthy);
}

TEST_F(HealthTest, FlappingReadingDoesNotFlapTheState) {
  GpuSample hot = Healthy();
  hot.temperature_c = 92;
  Feed(Obs({hot}), 2);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(Feed(Obs({i % 2 ? hot : Healthy()})).state, HealthState::kDraining);
  }
}

TEST_F(HealthTest, LostGpuFailsAtOnce) {
  GpuSample lost;
  lost.index = 1;
  lost.lost = true;
  HealthReport r = Feed(Obs({Healthy(0), lost}));
  EXPECT_EQ(r.state, HealthState::kFailed);
  EXPECT_EQ(r.reasons[0].code, "gpu1.lost");
  EXPECT_EQ(r.reasons[0].detail, "GPU stopped answering (lost)");
}

TEST_F(HealthTest, ALostGpuSaysWhyAndAnUnseenOneDrains) {
  GpuSample hung;
  hung.index = 0;
  hung.lost = true;
  hung.lost_detail = "the nvml driver has not answered for 2000 ms";
  HealthReport r = Feed(Obs({hung}));
  EXPECT_EQ(r.state, HealthState::kFailed);
  EXPECT_EQ(r.reasons[0].detail, "the nvml driver has not answered for 2000 ms");

  HealthEvaluator fresh{HealthThresholds{}};
  Observation o = Obs({Healthy(0)});
  o.unseen_pci = {"0000:43:00"};
  fresh.Update(o, clock_.Now());
  r = fresh.Update(o, clock_.Now());
  EXPECT_EQ(r.state, HealthState::kDraining);
  EXPECT_EQ(r.reasons[0].code, "pci.0000:43:00");
  EXPECT_THAT(r.reasons[0].detail, ::testing::HasSubstr("driver does not list it"));
}

TEST_F(HealthTest, XidConsequencesLatch) {
  HealthReport r = Feed(Obs({Healthy()}, {XidEvent{0, 79, 0}}));
  EXPECT_EQ(r.state, HealthState::kFailed);
  EXPECT_THAT(r.reasons[0].detail, ::testing::HasSubstr("fallen off the bus"));
  // Latched: healthy readings after it do not clear a fail-and-fence XID.
  EXPECT_EQ(Feed(Obs({Healthy()}), 20).state, HealthState::kFailed);
  eval_.Reset();
  EXPECT_EQ(Feed(Obs({Healthy()})).state, HealthState::kHealthy);
}

TEST_F(HealthTest, DrainXidDrainsAndAlertXidExpires) {
  Feed(Obs({Healthy()}, {XidEvent{0, 74, 0}}), 1);  // NVLink: a drain
  EXPECT_EQ(Feed(Obs({Healthy()})).state, HealthState::kDraining);
  HealthEvaluator alerts{HealthThresholds{}};
  alerts.Update(Obs({Healthy()}, {XidEvent{0, 13, 0}}), clock_.Now());
  EXPECT_EQ(alerts.Update(Obs({Healthy()}), clock_.Now()).state, HealthState::kDegraded);
  clock_.Advance(seconds(61));
  for (int i = 0; i < 6; ++i) alerts.Update(Obs({Healthy()}), clock_.Now());
  EXPECT_EQ(alerts.state(), HealthState::kHealthy);
}

TEST_F(HealthTest, AnAlertXidRepeatedOnOneGpuDrains) {
  HealthEvaluator e{HealthThresholds{}};  // 3 within 10 min
  auto seen = [&](uint32_t gpu) {
    return e.Update(Obs({Healthy()}, {XidEvent{gpu, 13, 0}}), clock_.Now());
  };
  seen(0);
  clock_.Advance(minutes(4));
  seen(1);  // another GPU: counted apart
  seen(0);
  EXPECT_NE(e.state(), HealthState::kDraining);
  clock_.Advance(minutes(7));  // the first one is out of the window
  seen(0);
  for (int i = 0; i < 3; ++i) e.Update(Obs({Healthy()}), clock_.Now());
  EXPECT_NE(e.state(), HealthState::kDraining);
  clock_.Advance(minutes(1));
  seen(0);  // three within ten minutes
  HealthReport r;
  for (int i = 0; i < 3; ++i) r = e.Update(Obs({Healthy()}), clock_.Now());
  EXPECT_EQ(r.state, HealthState::kDraining);
  bool named = false;
  for (const HealthReason& reason : r.reasons) {
    named = named || reason.code == "gpu0.xid13.repeated";
  }
  EXPECT_TRUE(named);
}

TEST_F(HealthTest, IgnoredXidChangesNothing) {
  EXPECT_EQ(Feed(Obs({Healthy()}, {XidEvent{0, 43, 0}}), 3).state, HealthState::kHealthy);
}

TEST_F(HealthTest, NewUncorrectedEccDrains) {
  GpuSample g = Healthy();
  g.ecc_uncorrected = 5;  // baseline at start: old errors do not count
  EXPECT_EQ(Feed(Obs({g}), 3).state, HealthState::kHealthy);
  g.ecc_uncorrected = 6;
  EXPECT_EQ(Feed(Obs({g}), 2).state, HealthState::kDraining);
}

TEST_F(HealthTest, PowerAndThrottleDegrade) {
  GpuSample g = Healthy();
  g.power_w = 77;  // 107% of 72 W
  g.throttle_reasons = throttle::kHwPowerBrakeSlowdown;
  HealthReport r = Feed(Obs({g}), 2);
  EXPECT_EQ(r.state, HealthState::kDegraded);
  EXPECT_EQ(r.reasons.size(), 2u);
}

TEST_F(HealthTest, NicDownFailsAndErrorBurstDegrades) {
  NicSample up{.name = "eth0", .present = true, .carrier = true, .operstate = "up"};
  Observation o = Obs({Healthy()});
  o.nics = {up};
  EXPECT_EQ(Feed(o, 2).state, HealthState::kHealthy);
  o.nics[0].rx_errors = 500;
  EXPECT_EQ(Feed(o).state, HealthState::kHealthy);
  o.nics[0].rx_errors = 1000;
  EXPECT_EQ(Feed(o).state, HealthState::kDegraded);
  o.nics[0].carrier = false;
  HealthReport r = Feed(o);
  EXPECT_EQ(r.state, HealthState::kFailed);
  EXPECT_THAT(r.reasons.back().detail, ::testing::HasSubstr("link down"));
}

TEST(HealthThresholdsTest, ReadsLevelsAndRejectsMalformedOnes) {
  auto read = [](const char* yaml, HealthThresholds* t) {
    auto doc = common::YamlDocument::LoadString(yaml, "agent.yaml");
    common::YamlMap root = doc->Root();
    ReadHealthThresholds(root.Map("thresholds"), t);
    return root.Finish();
  };
  HealthThresholds t;
  ASSERT_TRUE(read("thresholds: { temperature_c: { warn: 80, critical: 88 }, "
                   "healthy_threshold: 3 }",
                   &t)
                  .ok());
  EXPECT_EQ(t.temperature_c.warn, 80);
  EXPECT_EQ(t.temperature_c.critical, 88);
  EXPECT_EQ(t.healthy_threshold, 3);
  absl::Status bad = read("thresholds: { temperature_c: { warn: 95, critical: 88 } }", &t);
  EXPECT_THAT(
      std::string(bad.message()),
      ::testing::HasSubstr("thresholds.temperature_c.warn: warn (95) is above critical (88)"));
  bad = read("thresholds: { temprature_c: { warn: 1 } }", &t);
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("did you mean 'temperature_c'"));
  bad = read("thresholds: { power_pct_of_limit: { warn: hot } }", &t);
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("expected a number, got 'hot'"));
  ASSERT_TRUE(read("thresholds: { xid_repeat_count: 5, xid_repeat_window_ms: 60000 }", &t).ok());
  EXPECT_EQ(t.xid_repeat_count, 5);
  EXPECT_EQ(t.xid_repeat_window, std::chrono::minutes(1));
  bad = read("thresholds: { xid_repeat_count: -2 }", &t);
  EXPECT_THAT(std::string(bad.message()),
              ::testing::HasSubstr("thresholds.xid_repeat_count: must be between 0 and 1000"));
}

// Issue 16: a GPU's own faults make its verdict, not the node's.
TEST_F(HealthTest, AGpuLevelFaultFailsThatGpuAndLeavesTheNodeHealthy) {
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1), Healthy(2)}, {XidEvent{1, 48, 0}}));
  EXPECT_EQ(r.state, HealthState::kFailed);  // a node without servers per GPU
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
  EXPECT_EQ(r.gpu_states, (std::map<uint32_t, HealthState>{{0, HealthState::kHealthy},
                                                           {1, HealthState::kFailed},
                                                           {2, HealthState::kHealthy}}));
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons.front().gpu, 1);
  // Heat on GPU 2 drains GPU 2 only, after the same two samples.
  GpuSample hot = Healthy(2);
  hot.temperature_c = 95;
  Feed(Obs({Healthy(0), Healthy(1), hot}));
  r = Feed(Obs({Healthy(0), Healthy(1), hot}));
  EXPECT_EQ(r.gpu_states[2], HealthState::kDraining);
  EXPECT_EQ(r.gpu_states[0], HealthState::kHealthy);
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
}

TEST_F(HealthTest, ARebootXidAndALostGpuAreTheNodes) {
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1)}, {XidEvent{1, 79, 0}}));  // off the bus
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  EXPECT_EQ(r.gpu_states[1], HealthState::kHealthy);
  eval_.Reset();
  GpuSample lost = Healthy(0);
  lost.lost = true;
  r = Feed(Obs({lost, Healthy(1)}));
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  EXPECT_EQ(r.reasons.front().gpu, -1);
}

// A MIG instance gone fails that slice only: its GPU and the GPU's other
// slices serve on; a node without a server per slice drains.
TEST_F(HealthTest, ALostMigInstanceFailsThatSliceOnly) {
  GpuSample gone = Healthy(1);
  gone.slices_lost = {3};
  HealthReport r = Feed(Obs({Healthy(0), gone}));
  EXPECT_EQ(r.slice_states,
            (std::map<std::pair<uint32_t, uint32_t>, HealthState>{{{1, 3}, HealthState::kFailed}}));
  EXPECT_EQ(r.gpu_states[1], HealthState::kHealthy);
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
  ASSERT_EQ(r.reasons.size(), 1u);
  EXPECT_EQ(r.reasons[0].code, "gpu1.mig3.lost");
  EXPECT_EQ(r.reasons[0].gpu, 1);
  EXPECT_EQ(r.reasons[0].slice, 3);
  r = Feed(Obs({Healthy(0), gone}));
  EXPECT_EQ(r.state, HealthState::kDraining);  // the node's one server: capacity lost
  // Its GPU's sample failing keeps the slice's verdict; it heals only
  // after healthy_threshold samples of it back.
  r = Feed(Obs({Healthy(0)}));
  EXPECT_EQ(r.slice_states.at({1, 3}), HealthState::kFailed);
  r = Feed(Obs({Healthy(0), Healthy(1)}), HealthThresholds{}.healthy_threshold - 1);
  EXPECT_EQ(r.slice_states.at({1, 3}), HealthState::kFailed);
  r = Feed(Obs({Healthy(0), Healthy(1)}));
  EXPECT_EQ(r.slice_states.at({1, 3}), HealthState::kHealthy);
  // A GPU reset forgets its slices.
  Feed(Obs({Healthy(0), gone}));
  eval_.ResetGpu(1);
  r = Feed(Obs({Healthy(0), Healthy(1)}));
  EXPECT_TRUE(r.slice_states.empty());
}

TEST_F(HealthTest, Xid154ActsOnTheActionItsMessageNames) {
  auto xid154 = [](uint32_t gpu, const char* action) {
    XidEvent x{gpu, 154, 0};
    x.recovery_action = action;
    return x;
  };
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, "GPU Reset Required")}));
  EXPECT_EQ(r.gpu_states[1], HealthState::kFailed);
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("GPU Reset Required"));
  eval_.Reset();
  r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, "Node Reboot Required")}));
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  EXPECT_EQ(r.gpu_states[1], HealthState::kHealthy);
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {xid154(0, "Drain P2P")}), 2);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {xid154(0, "None")}), 2);
  EXPECT_TRUE(r.reasons.empty());
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {XidEvent{0, 154, 0}}), 2);  // NVML's event: no action known
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
}

// Issue 38: an XID takes effect at once, judged without a sample and
// whatever the readings' hysteresis is doing; the readings' reasons of the
// last sample stand beside it, and their hysteresis goes on at the next
// sample.
TEST_F(HealthTest, AnXidAppliesAtOnceWithoutASampleAndReadingsKeepTheirCount) {
  GpuSample hot = Healthy();
  hot.temperature_c = 92;  // critical: draining after two samples
  EXPECT_EQ(Feed(Obs({hot})).state, HealthState::kHealthy);
  HealthReport r = eval_.Update(Obs({}, {XidEvent{0, 13, 0}}), clock_.Now(), /*sampled=*/false);
  EXPECT_EQ(r.state, HealthState::kDegraded);
  EXPECT_TRUE(r.changed);
  bool temperature = false;
  for (const HealthReason& reason : r.reasons) temperature |= reason.code == "gpu0.temperature";
  EXPECT_TRUE(temperature);
  EXPECT_EQ(Feed(Obs({hot})).state, HealthState::kDraining);  // the second hot sample
}

// A flood of one XID latches one reason, refreshed, not one per occurrence.
TEST_F(HealthTest, ALatchedXidIsOneReasonHoweverOftenItComes) {
  HealthReport r;
  for (int i = 0; i < 50; ++i) {
    r = eval_.Update(Obs({Healthy()}, {XidEvent{0, 74, 0}}), clock_.Now(), /*sampled=*/false);
  }
  int n = 0;
  for (const HealthReason& reason : r.reasons) n += reason.code == "gpu0.xid74";
  EXPECT_EQ(n, 1);
  EXPECT_EQ(r.state, HealthState::kDraining);
}

}  // namespace
}  // namespace gpuha::gpu
