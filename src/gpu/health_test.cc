#include "gpu/health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::gpu {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

constexpr uint32_t Bit21() { return 1u << 21; }

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

// A GPU call that missed the watchdog's deadline once may be the host's
// load (beside a busy loop, a new agent's first call took over 500 ms and
// failed a healthy node over): lost only if still stuck at the next sample.
// The driver's own word (GPU_IS_LOST) needs no second reading.
TEST_F(HealthTest, AGpuStuckOnceIsLostOnlyIfStillStuckAtTheNextSample) {
  GpuSample stuck;
  stuck.index = 0;
  stuck.lost = true;
  stuck.stuck = true;
  stuck.lost_detail = "the sim driver has not answered for 500 ms (watchdog deadline 500 ms)";
  EXPECT_EQ(Feed(Obs({stuck, Healthy(1)})).state, HealthState::kHealthy);
  EXPECT_EQ(Feed(Obs({Healthy(0), Healthy(1)})).state, HealthState::kHealthy);  // it answered
  EXPECT_EQ(Feed(Obs({stuck, Healthy(1)})).state, HealthState::kHealthy);
  HealthReport r = Feed(Obs({stuck, Healthy(1)}));
  EXPECT_EQ(r.state, HealthState::kFailed);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons[0].code, "gpu0.lost");
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

bool Names(const HealthReport& r, const std::string& code) {
  return std::any_of(r.reasons.begin(), r.reasons.end(),
                     [&](const HealthReason& reason) { return reason.code == code; });
}

// Issue 39: repeats are counted by burst (NVSentinel: occurrences less than
// 180 s apart are one), and XID 31 in two bursts on one GPU within 24 h is
// its hardware (NVIDIA's XID 31 workflow): a drain.
TEST_F(HealthTest, AnApplicationXidRepeatedInBurstsOnOneGpuDrains) {
  HealthEvaluator e{HealthThresholds{}};  // XID 13/31: 2 bursts within 24 h
  auto seen = [&](uint32_t gpu, uint32_t xid) {
    return e.Update(Obs({Healthy(0), Healthy(1)}, {XidEvent{gpu, xid, 0}}), clock_.Now());
  };
  // One burst: a storm of XID 31s each under 180 s after the one before.
  for (int i = 0; i < 10; ++i) {
    seen(0, 31);
    clock_.Advance(seconds(100));
  }
  EXPECT_NE(e.state(), HealthState::kDraining);
  clock_.Advance(seconds(181));  // 281 s after the last: a burst of its own
  HealthReport r = seen(0, 31);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_EQ(r.gpu_states[1], HealthState::kHealthy);
  EXPECT_TRUE(Names(r, "gpu0.xid31.repeated"));
  // Another application XID: five bursts (NVSentinel's
  // RepeatedXIDErrorOnSameGPU) send it to support, with no drain (NVIDIA's
  // catalog has no repeat rule for it; it once drained); a day apart they
  // are not repeats.
  HealthEvaluator other{HealthThresholds{}};
  for (int i = 0; i < 4; ++i) {
    other.Update(Obs({Healthy(0)}, {XidEvent{0, 68, 0}}), clock_.Now());  // NVDEC0
    clock_.Advance(minutes(5));
  }
  EXPECT_NE(other.state(), HealthState::kDraining);
  clock_.Advance(hours(24));
  other.Update(Obs({Healthy(0)}, {XidEvent{0, 68, 0}}), clock_.Now());
  EXPECT_NE(other.state(), HealthState::kDraining);
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(minutes(5));
    r = other.Update(Obs({Healthy(0)}, {XidEvent{0, 68, 0}}), clock_.Now());
  }
  EXPECT_EQ(r.state, HealthState::kDegraded);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDegraded);
  ASSERT_TRUE(Names(r, "gpu0.xid68.repeated"));
  EXPECT_THAT(r.reasons.back().detail, ::testing::HasSubstr("contact NVIDIA support"));
}

// The same XID on different GPUs is the application's (NVIDIA: "Repeat MMU
// faults to diff GPU: CHECK_APP"): an alert. It no longer hides this GPU's
// own repeats (NVSentinel's same-GPU and other-GPU rules fire apart; one
// application's fault on GPU 1 once turned GPU 0's drain into an alert for
// a day): GPU 0's second burst drains it, beside the alert.
TEST_F(HealthTest, RepeatsOnOneGpuDrainItEvenWhenAnotherGpuHadTheXid) {
  HealthEvaluator e{HealthThresholds{}};
  auto seen = [&](uint32_t gpu) {
    return e.Update(Obs({Healthy(0), Healthy(1)}, {XidEvent{gpu, 31, 0}}), clock_.Now());
  };
  seen(1);
  clock_.Advance(minutes(10));
  HealthReport r = seen(0);
  EXPECT_NE(r.gpu_states[0], HealthState::kDraining);  // one burst on each: the application's
  clock_.Advance(minutes(10));
  r = seen(0);  // GPU 0's second burst, with GPU 1's beside it
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_TRUE(Names(r, "gpu0.xid31.repeated"));
  EXPECT_TRUE(Names(r, "gpu0.xid31.other_gpus"));
  EXPECT_NE(r.gpu_states[1], HealthState::kDraining);
}

// XID 13 (issue 52, item 2): NVIDIA's workflow and NVSentinel count its
// repeats by place. Twice on the same GPC and TPC within the window is the
// GPU's hardware: drain. On different GPCs or TPCs (or where the line says
// none) it is the application's: no drain, and after
// xid_repeat_count_other bursts an alert to contact support. (It drained
// after 2 bursts anywhere on the GPU.)
TEST_F(HealthTest, Xid13RepeatsCountByTheirGpcAndTpc) {
  auto x13 = [](std::optional<uint32_t> gpc, std::optional<uint32_t> tpc) {
    XidEvent x{0, 13, 0};
    x.gpc = gpc;
    x.tpc = tpc;
    return x;
  };
  HealthEvaluator e{HealthThresholds{}};
  auto seen = [&](XidEvent x) { return e.Update(Obs({Healthy(0)}, {x}), clock_.Now()); };
  HealthReport r = seen(x13(0, 1));
  clock_.Advance(minutes(10));
  r = seen(x13(2, 5));  // elsewhere: the application's
  clock_.Advance(minutes(10));
  r = seen(x13(std::nullopt, std::nullopt));  // no place said
  EXPECT_NE(r.gpu_states[0], HealthState::kDraining);
  EXPECT_FALSE(Names(r, "gpu0.xid13.repeated"));
  clock_.Advance(minutes(10));
  r = seen(x13(0, 1));  // GPC 0, TPC 1 again: its hardware
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  ASSERT_TRUE(Names(r, "gpu0.xid13.repeated"));
  EXPECT_THAT(r.reasons.back().detail, ::testing::HasSubstr("GPC 0, TPC 1 in 2 bursts"));
  // Five bursts in different places: support, no drain.
  HealthEvaluator f{HealthThresholds{}};
  for (uint32_t i = 0; i < 5; ++i) {
    r = f.Update(Obs({Healthy(0)}, {x13(i, 0)}), clock_.Now());
    clock_.Advance(minutes(10));
  }
  EXPECT_EQ(r.gpu_states[0], HealthState::kDegraded);
  ASSERT_TRUE(Names(r, "gpu0.xid13.repeated"));
  EXPECT_THAT(r.reasons.back().detail, ::testing::HasSubstr("contact NVIDIA support"));
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
  ASSERT_TRUE(read("thresholds: { xid_repeat_count_other: 7, xid_burst_ms: 1000, "
                   "xid_drain_reset_ms: 5000 }",
                   &t)
                  .ok());
  EXPECT_EQ(t.xid_repeat_count_other, 7);
  EXPECT_EQ(t.xid_burst, seconds(1));
  EXPECT_EQ(t.xid_drain_reset, seconds(5));
  bad = read("thresholds: { xid_burst_ms: -1 }", &t);
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("thresholds.xid_burst_ms"));
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

// Issue 39: XID 154 by the value the driver prints (R610's words differ):
// "Drain and Reset" drains, then fails the GPU to be reset; a bus reset
// fails the GPU, a system reboot the node; a value not known drains.
TEST_F(HealthTest, Xid154ByValueDrainThenResetAndTheNewerActions) {
  auto xid154 = [](uint32_t gpu, int value, const char* words) {
    XidEvent x{gpu, 154, 0};
    x.recovery_value = value;
    x.recovery_action = words;
    return x;
  };
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, 4, "Drain and Reset")}));
  EXPECT_EQ(r.gpu_states[1], HealthState::kDraining);
  EXPECT_FALSE(Names(r, "gpu1.xid154.reset"));
  clock_.Advance(seconds(29));
  EXPECT_EQ(Feed(Obs({Healthy(0), Healthy(1)})).gpu_states[1], HealthState::kDraining);
  clock_.Advance(seconds(1));  // thresholds.xid_drain_reset (30 s): the reset is due
  r = Feed(Obs({Healthy(0), Healthy(1)}));
  EXPECT_EQ(r.gpu_states[1], HealthState::kFailed);
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
  EXPECT_TRUE(Names(r, "gpu1.xid154.reset"));
  eval_.Reset();
  r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, 1, "PF FLR")}));  // R610's words
  EXPECT_EQ(r.gpu_states[1], HealthState::kFailed);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("PF FLR"));
  eval_.Reset();
  r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, 6, "")}));  // NVML's bus reset
  EXPECT_EQ(r.gpu_states[1], HealthState::kFailed);
  EXPECT_EQ(r.node_state, HealthState::kHealthy);
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {xid154(0, 7, "")}));  // system reboot
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {xid154(0, 9, "Recalibrate")}), 2);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("not one gpuha knows"));
}

// Issue 39: XIDs 144-150 act on the sub-error their line's registers name:
// ignored, a reset, or (XID_154_EVAL) an alert with the 154 beside it
// judged on its own; registers the decode does not know, or none, drain.
TEST_F(HealthTest, NvlinkFiveXidsActOnTheirSubError) {
  auto nvl5 = [](uint32_t xid, uint32_t intr, uint32_t status) {
    XidEvent x{0, xid, 0};
    x.intr_info = intr;
    x.error_status = status;
    x.driver_major = 580;
    return x;
  };
  EXPECT_TRUE(Feed(Obs({Healthy(0)}, {nvl5(144, 0x1, 0x1)}), 2).reasons.empty());  // IGNORE
  HealthReport r = Feed(Obs({Healthy(0)}, {nvl5(144, 0x1, 0x2)}));  // SAW_MVB 0x2: RESET_GPU
  EXPECT_EQ(r.gpu_states[0], HealthState::kFailed);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("SAW_MVB, RESET_GPU"));
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvl5(145, 0x04082907, 0x8)}));
  EXPECT_EQ(r.gpu_states[0], HealthState::kDegraded);  // XID_154_EVAL alone: RESTART_APP
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvl5(145, 0x7f, 0x1)}), 2);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("not in the catalog's decode"));
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {XidEvent{0, 149, 0}}), 2);  // NVML's event: no registers
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  // Issue 52: 146-148's rows too (R575+ encoding): TLW_CTRL's reset and
  // ignore, TLW_RX's, TREX's and NVLPW_CTRL's ignore; a status no row lists drains.
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvl5(146, 0x09, 0x4)}));
  EXPECT_EQ(r.gpu_states[0], HealthState::kFailed);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("TLW_CTRL, RESET_GPU"));
  for (const XidEvent& ignored : {nvl5(146, 0x09, 0x1), nvl5(146, 0x0a, 0x2), nvl5(147, 0x0e, 0x1),
                                  nvl5(148, 0x0f, 0x80000000)}) {
    eval_.Reset();
    EXPECT_TRUE(Feed(Obs({Healthy(0)}, {ignored}), 2).reasons.empty()) << ignored.xid;
  }
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvl5(147, 0x0e, 0x4)}), 2);  // no TREX row for 0x4
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
}

// Issue 52, item 1: without the kernel log's line, XIDs 144-150 take the
// recovery action NVML's field gave with the event: the action the
// driver's decode of the sub-error came to (a reset, or none), not the
// catalog's blanket drain.
TEST_F(HealthTest, NvlinkFiveXidsWithoutTheirLineTakeNvmlsRecoveryAction) {
  auto nvml = [](uint32_t xid, int action) {
    XidEvent x{0, xid, 0};
    x.recovery_value = action;
    return x;
  };
  HealthReport r = Feed(Obs({Healthy(0)}, {nvml(145, 1)}));  // a RESET_GPU sub-error
  EXPECT_EQ(r.gpu_states[0], HealthState::kFailed);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("GPU Reset Required"));
  EXPECT_FALSE(Names(r, "gpu0.xid154.reset"));  // the 154 beside it owns any reset
  eval_.Reset();
  EXPECT_TRUE(Feed(Obs({Healthy(0)}, {nvml(149, 0)}), 2).reasons.empty());  // IGNORE: None
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvml(146, 2)}));  // the driver wants a reboot: the node's
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  EXPECT_TRUE(r.reasons.front().reboot);
  eval_.Reset();
  r = Feed(Obs({Healthy(0)}, {nvml(147, -1)}), 2);  // no field (before R565): the catalog's
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  // Every NVLink5 XID, each kind of sub-error by the action the driver
  // sets for it: RESET_GPU's reset, IGNORE's none, XID_154_EVAL's the
  // 154's (a Drain and Reset here): the catalog's action each time.
  const std::pair<int, HealthState> kinds[] = {
      {1, HealthState::kFailed}, {0, HealthState::kHealthy}, {4, HealthState::kDraining}};
  for (uint32_t xid = 144; xid <= 150; ++xid) {
    for (const auto& [action, want] : kinds) {
      eval_.Reset();
      EXPECT_EQ(Feed(Obs({Healthy(0)}, {nvml(xid, action)}), 2).gpu_states[0], want)
          << "XID " << xid << ", recovery action " << action;
    }
  }
}

// Issue 52, item 8: "Drain P2P" drains, and NVIDIA's next step, once P2P
// is quiet, is to read the recovery action again: the evaluator asks for
// it after xid_drain_reset (again each time while it is not answered, or
// answered Drain P2P); a None ends the drain, a reset fails the GPU.
TEST_F(HealthTest, ADrainP2pIsAskedAgainAndEndsAsTheNextAnswerSays) {
  auto action = [](uint32_t gpu, int value, bool asked) {
    XidEvent x{gpu, 154, 0};
    x.recovery_value = value;
    x.recovery_only = asked;
    return x;
  };
  HealthReport r = Feed(Obs({Healthy(0), Healthy(1)}, {action(0, 3, false), action(1, 3, false)}));
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_EQ(r.gpu_states[1], HealthState::kDraining);
  EXPECT_TRUE(eval_.RecoveryQueriesDue(clock_.Now()).empty());
  clock_.Advance(seconds(30));  // thresholds.xid_drain_reset
  EXPECT_EQ(eval_.RecoveryQueriesDue(clock_.Now()), (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(eval_.RecoveryQueriesDue(clock_.Now()).empty());  // asked; next in 30 s
  // GPU 0: None now, its drain ends (after the healthy samples); GPU 1: a reset.
  r = Feed(Obs({Healthy(0), Healthy(1)}, {action(0, 0, true), action(1, 1, true)}), 6);
  EXPECT_EQ(r.gpu_states[0], HealthState::kHealthy);
  EXPECT_FALSE(Names(r, "gpu0.xid154"));
  EXPECT_EQ(r.gpu_states[1], HealthState::kFailed);
  EXPECT_THAT(r.reasons.front().detail,
              ::testing::HasSubstr("recovery action: GPU Reset Required"));
  clock_.Advance(seconds(60));
  EXPECT_TRUE(eval_.RecoveryQueriesDue(clock_.Now()).empty());  // both answered
  // A None does not end a drain that was not a Drain P2P's.
  eval_.Reset();
  Feed(Obs({Healthy(0)}, {action(0, 5, false)}));  // Recover IMEX Domain
  r = Feed(Obs({Healthy(0)}, {action(0, 0, true)}), 6);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
}

// Issue 52, item 7: XID 74 drains on each occurrence (the catalog's
// WORKFLOW_NVLINK_ERR; NVSentinel takes it as fatal too), and its
// registers add NVSentinel's rules: some bits send the GPU to support at
// once, some only when they come again within the window, on the GPU or on
// one link of it.
TEST_F(HealthTest, Xid74RegistersSendTheGpuToSupportAsNvsentinelsRulesSay) {
  auto xid74 = [](uint32_t link, std::vector<uint32_t> regs) {
    XidEvent x{0, 74, 0};
    x.link = link;
    x.nvlink_regs = std::move(regs);
    return x;
  };
  // REG0 bit 16, a hardware issue: the first only drains.
  HealthReport r = Feed(Obs({Healthy(0)}, {xid74(6, {0x10000, 0, 0, 0, 0, 0, 0})}));
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_FALSE(Names(r, "gpu0.xid74.support"));
  clock_.Advance(hours(1));
  r = Feed(Obs({Healthy(0)}, {xid74(2, {0x10000, 0, 0, 0, 0, 0, 0})}));  // again, any link
  ASSERT_TRUE(Names(r, "gpu0.xid74.support"));
  eval_.Reset();
  // REG2 bit 0 on two different links: each link once, no rule met.
  Feed(Obs({Healthy(0)}, {xid74(1, {0, 0, 0x1, 0, 0, 0, 0})}));
  r = Feed(Obs({Healthy(0)}, {xid74(2, {0, 0, 0x1, 0, 0, 0, 0})}));
  EXPECT_FALSE(Names(r, "gpu0.xid74.support"));
  r = Feed(Obs({Healthy(0)}, {xid74(2, {0, 0, 0x1, 0, 0, 0, 0})}));  // link 2 again
  EXPECT_TRUE(Names(r, "gpu0.xid74.support"));
  eval_.Reset();
  // REG0 bit 21, signal integrity: at once, and it says what to check.
  r = Feed(Obs({Healthy(0)}, {xid74(3, {Bit21(), 0, 0, 0, 0, 0, 0})}));
  ASSERT_TRUE(Names(r, "gpu0.xid74.support"));
  for (const HealthReason& reason : r.reasons) {
    if (reason.code == "gpu0.xid74.support") {
      EXPECT_THAT(reason.detail, ::testing::HasSubstr("XID74Reg0SignalIntegrityError"));
      EXPECT_THAT(reason.detail, ::testing::HasSubstr("mechanical"));
    }
  }
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);  // the drain stands
}

// Issue 52: XID 159 is CHECK_UVM, "RESET_GPU if UVM or vGPU is in use,
// else IGNORE": as the agent found the modules; not known, a drain.
TEST_F(HealthTest, Xid159ResetsWhereUvmIsInUseAndIsIgnoredElsewhere) {
  XidEvent x{0, 159, 0};
  x.uvm = true;
  EXPECT_EQ(Feed(Obs({Healthy(0)}, {x})).gpu_states[0], HealthState::kFailed);
  eval_.Reset();
  x.uvm = false;
  EXPECT_TRUE(Feed(Obs({Healthy(0)}, {x}), 2).reasons.empty());
  eval_.Reset();
  x.uvm.reset();
  EXPECT_EQ(Feed(Obs({Healthy(0)}, {x}), 2).gpu_states[0], HealthState::kDraining);
}

// Issue 52: every XID of the table, alone on a healthy GPU, ends in its
// consequence (the buckets' behaviour, not only the table's words), and an
// XID no table knows drains, naming itself.
TEST_F(HealthTest, EveryXidAloneEndsInItsConsequenceAndAnUnknownOneDrains) {
  std::vector<XidInfo> all(XidCatalog().begin(), XidCatalog().end());
  all.insert(all.end(), XidsAfterCatalog().begin(), XidsAfterCatalog().end());
  for (const XidInfo& info : all) {
    HealthEvaluator eval{HealthThresholds{}};
    HealthReport r;
    for (int i = 0; i < 2; ++i) {
      r = eval.Update(Obs({Healthy(0)}, i == 0 ? std::vector<XidEvent>{XidEvent{0, info.xid, 0}}
                                               : std::vector<XidEvent>{}),
                      clock_.Now());
    }
    const HealthState want = info.consequence == XidConsequence::kFailAndFence
                                 ? HealthState::kFailed
                             : info.consequence == XidConsequence::kDrain ? HealthState::kDraining
                             : info.consequence == XidConsequence::kAlert ? HealthState::kDegraded
                                                                          : HealthState::kHealthy;
    EXPECT_EQ(r.state, want) << "XID " << info.xid << " (" << info.nvidia_action << ")";
    const bool node = IsNodeXid(info.xid);
    EXPECT_EQ(r.node_state, node ? want : HealthState::kHealthy) << "XID " << info.xid;
    if (want != HealthState::kHealthy) {
      ASSERT_FALSE(r.reasons.empty()) << "XID " << info.xid;
      EXPECT_EQ(r.reasons.front().reboot, node) << "XID " << info.xid;
    }
  }
  HealthReport r = Feed(Obs({Healthy(0)}, {XidEvent{0, 4242, 0}}), 2);
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("XID 4242: not in the catalog"));
}

// Issue 39: XID 45 follows the XID beside it; alone, where Fabric Manager
// runs, an alert to restart it; alone elsewhere (a process's channels torn
// down at exit) nothing.
TEST_F(HealthTest, Xid45FollowsTheXidBesideIt) {
  XidEvent caused{0, 45, 0};
  caused.caused_by = 31;
  caused.fabric_manager = true;
  EXPECT_TRUE(Feed(Obs({Healthy(0)}, {caused}), 2).reasons.empty());
  XidEvent alone{0, 45, 0};
  alone.fabric_manager = true;
  Feed(Obs({Healthy(0)}, {XidEvent{0, 79, 0}}));
  clock_.Advance(seconds(2));
  HealthReport r = Feed(Obs({Healthy(0)}, {alone}));  // 2 s after a 79: its cleanup
  EXPECT_FALSE(Names(r, "gpu0.xid45"));
  eval_.Reset();
  clock_.Advance(seconds(20));
  r = Feed(Obs({Healthy(0)}, {alone}));
  EXPECT_EQ(r.state, HealthState::kDegraded);
  EXPECT_THAT(r.reasons.front().detail, ::testing::HasSubstr("restart NVIDIA Fabric Manager"));
  eval_.Reset();
  alone.fabric_manager = false;
  EXPECT_TRUE(Feed(Obs({Healthy(0)}, {alone}), 2).reasons.empty());
  // The 10 s beside: an XID 13 (an alert) 11 s before does not own it.
  HealthEvaluator e{HealthThresholds{}};
  alone.fabric_manager = true;
  e.Update(Obs({Healthy(0)}, {XidEvent{0, 13, 0}}), clock_.Now());
  clock_.Advance(seconds(9));
  EXPECT_FALSE(Names(e.Update(Obs({Healthy(0)}, {alone}), clock_.Now()), "gpu0.xid45"));
  clock_.Advance(seconds(2));  // 11 s after the 13, 2 s after the last 45
  EXPECT_TRUE(Names(e.Update(Obs({Healthy(0)}, {alone}), clock_.Now()), "gpu0.xid45"));
}

// A reset a "Drain and Reset" left pending: a second one does not put it
// off, a "None" cancels it, and the GPU's reset clears it. A node-level 154
// stays the node's when a GPU-level one refreshes its reason.
TEST_F(HealthTest, APendingResetIsKeptCancelledAndClearedAsTheDriverSays) {
  auto xid154 = [](uint32_t gpu, int value) {
    XidEvent x{gpu, 154, 0};
    x.recovery_value = value;
    return x;
  };
  Feed(Obs({Healthy(0)}, {xid154(0, 4)}));
  clock_.Advance(seconds(20));
  Feed(Obs({Healthy(0)}, {xid154(0, 4)}));  // again: the first one's 30 s still hold
  clock_.Advance(seconds(10));
  EXPECT_EQ(Feed(Obs({Healthy(0)})).gpu_states[0], HealthState::kFailed);
  eval_.Reset();
  Feed(Obs({Healthy(0)}, {xid154(0, 4)}));
  clock_.Advance(seconds(5));
  Feed(Obs({Healthy(0)}, {xid154(0, 0)}));  // "None": nothing more to do
  clock_.Advance(seconds(60));
  HealthReport r = Feed(Obs({Healthy(0)}));
  EXPECT_FALSE(Names(r, "gpu0.xid154.reset"));
  EXPECT_EQ(r.gpu_states[0], HealthState::kDraining);  // the drain stays latched
  eval_.Reset();
  Feed(Obs({Healthy(0)}, {xid154(0, 4)}));
  eval_.ResetGpu(0);  // reset early (an operator's)
  clock_.Advance(seconds(60));
  EXPECT_FALSE(Names(Feed(Obs({Healthy(0)})), "gpu0.xid154.reset"));
  eval_.Reset();
  Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, 2)}));      // reboot the node
  r = Feed(Obs({Healthy(0), Healthy(1)}, {xid154(1, 1)}));  // then "GPU Reset Required"
  EXPECT_EQ(r.node_state, HealthState::kFailed);
  eval_.ResetGpu(1);
  EXPECT_EQ(Feed(Obs({Healthy(0), Healthy(1)})).node_state, HealthState::kFailed);
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
