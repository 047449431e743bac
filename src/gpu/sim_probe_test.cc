#include "gpu/sim_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <time.h>

#include <set>

#include "gpu/nvml_cost.h"

namespace gpuha::gpu {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::unique_ptr<SimProbe> Make(common::FakeClock* clock, std::vector<Fault> faults = {},
                               uint32_t count = 2) {
  SimOptions o;
  o.count = count;
  o.load = 0.5;
  o.faults = std::move(faults);
  auto p = SimProbe::Create(o, clock);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

TEST(SimProbeTest, ListsDevicesOfTheModel) {
  common::FakeClock clock;
  auto probe = Make(&clock);
  auto devices = probe->Devices();
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].name, "NVIDIA L4");
  EXPECT_EQ((*devices)[0].memory_total_bytes, 24ull << 30);
  EXPECT_NE((*devices)[0].uuid, (*devices)[1].uuid);
  EXPECT_EQ((*devices)[1].pci_bus_id, "00000000:42:00.0");
}

// Issue 38: with gpu.sim.cost_model a sample costs what the NVML backend's
// calls cost on a driver: the slow readings' 3 ms of energy counter among
// them on the first sample and each slow_every after, not in between.
TEST(SimProbeTest, TheCostModelSpendsWhatADriversCallsCost) {
  common::FakeClock clock;
  SimOptions o;
  o.cost_model = true;
  o.slow_every = std::chrono::seconds(30);
  auto probe = SimProbe::Create(o, &clock);
  ASSERT_TRUE(probe.ok());
  auto cpu_ms = [&] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
  };
  const double slow_ms = NvmlPlanCost(kNvmlSlowSample).cpu_us / 1000.0;
  ASSERT_GT(slow_ms, 3.0);  // the energy counter alone is 3 ms
  double before = cpu_ms();
  ASSERT_TRUE((*probe)->Sample(0).ok());
  EXPECT_GE(cpu_ms() - before, slow_ms);
  before = cpu_ms();
  ASSERT_TRUE((*probe)->Sample(0).ok());  // the slow readings not due
  EXPECT_LT(cpu_ms() - before, slow_ms);
  clock.Advance(std::chrono::seconds(30));
  before = cpu_ms();
  ASSERT_TRUE((*probe)->Sample(0).ok());
  EXPECT_GE(cpu_ms() - before, slow_ms);
}

TEST(SimProbeTest, HealthyValuesAreRealisticForAnL4) {
  common::FakeClock clock;
  auto probe = Make(&clock);
  auto s = probe->Sample(0);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->lost);
  EXPECT_GT(s->temperature_c, 40);
  EXPECT_LT(s->temperature_c, 60);
  EXPECT_GT(s->power_w, 30);
  EXPECT_LT(s->power_w, 72);
  EXPECT_DOUBLE_EQ(s->power_limit_w, 72);
  EXPECT_EQ(s->utilization_pct, 50u);
  EXPECT_EQ(s->ecc_uncorrected, 0u);
}

TEST(SimProbeTest, TemperatureRampsOverTimeThenHolds) {
  common::FakeClock clock;
  auto probe = Make(
      &clock,
      {Fault{.at_ms = 1000, .gpu = 0, .kind = FaultKind::kTempRamp, .to_c = 95, .over_ms = 1000}});
  double before = probe->Sample(0)->temperature_c;
  clock.Advance(milliseconds(1500));
  double mid = probe->Sample(0)->temperature_c;
  clock.Advance(milliseconds(1000));
  auto after = probe->Sample(0);
  EXPECT_LT(before, 60);
  EXPECT_GT(mid, before + 10);
  EXPECT_LT(mid, 90);
  EXPECT_NEAR(after->temperature_c, 95, 1);
  EXPECT_NE(after->throttle_reasons & throttle::kHwThermalSlowdown, 0u);
  EXPECT_LT(probe->Sample(1)->temperature_c, 60);  // the other GPU is untouched
}

TEST(SimProbeTest, Xid79IsDeliveredAndLosesTheGpu) {
  common::FakeClock clock;
  auto probe = Make(&clock, {Fault{.at_ms = 500, .gpu = 1, .kind = FaultKind::kXid, .xid = 79}});
  EXPECT_TRUE(probe->WaitForXids(milliseconds(0))->empty());
  clock.Advance(milliseconds(500));
  auto xids = probe->WaitForXids(milliseconds(0));
  ASSERT_EQ(xids->size(), 1u);
  EXPECT_EQ((*xids)[0].gpu_index, 1u);
  EXPECT_EQ((*xids)[0].xid, 79u);
  EXPECT_TRUE(probe->Sample(1)->lost);
  EXPECT_FALSE(probe->Sample(0)->lost);
  EXPECT_TRUE(probe->WaitForXids(milliseconds(0))->empty());  // delivered once
}

TEST(SimProbeTest, EccBurstPowerExcursionAndClear) {
  common::FakeClock clock;
  auto probe = Make(
      &clock,
      {
          Fault{.at_ms = 0,
                .gpu = 0,
                .kind = FaultKind::kEccBurst,
                .corrected = 10,
                .uncorrected = 3},
          Fault{
              .at_ms = 0, .gpu = 0, .kind = FaultKind::kPowerExcursion, .watts = 95, .for_ms = 100},
      });
  auto s = probe->Sample(0);
  EXPECT_EQ(s->ecc_corrected, 10u);
  EXPECT_EQ(s->ecc_uncorrected, 3u);
  EXPECT_NEAR(s->power_w, 95, 3);
  clock.Advance(milliseconds(200));
  EXPECT_LT(probe->Sample(0)->power_w, 72);
  ASSERT_TRUE(probe->Inject(Fault{.gpu = 0, .kind = FaultKind::kClear}).ok());
  EXPECT_EQ(probe->Sample(0)->ecc_uncorrected, 0u);
}

TEST(SimProbeTest, AgentHangLastsItsDuration) {
  common::FakeClock clock;
  auto probe = Make(&clock, {Fault{.at_ms = 100, .kind = FaultKind::kAgentHang, .for_ms = 300}});
  EXPECT_FALSE(probe->AgentHung());
  clock.Advance(milliseconds(150));
  EXPECT_TRUE(probe->AgentHung());
  clock.Advance(milliseconds(300));
  EXPECT_FALSE(probe->AgentHung());
}

TEST(SimProbeTest, LiveInjectionAndBadGpuIndex) {
  common::FakeClock clock;
  auto probe = Make(&clock);
  EXPECT_FALSE(probe->Inject(Fault{.gpu = 7, .kind = FaultKind::kLost}).ok());
  ASSERT_TRUE(probe->Inject(Fault{.gpu = 0, .kind = FaultKind::kLost}).ok());
  EXPECT_TRUE(probe->Sample(0)->lost);
  EXPECT_FALSE(probe->Sample(5).ok());
}

TEST(SimProbeTest, CreateRejectsUnknownModelAndFaultOnMissingGpu) {
  common::FakeClock clock;
  SimOptions o;
  o.model = "Voodoo2";
  EXPECT_FALSE(SimProbe::Create(o, &clock).ok());
  o.model = "L4";
  o.faults = {Fault{.gpu = 3, .kind = FaultKind::kLost}};
  auto p = SimProbe::Create(o, &clock);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("faults[0].gpu"), std::string::npos);
}

TEST(SimProbeTest, WaitWakesForAScriptedXidOnTheRealClock) {
  auto probe = SimProbe::Create(
      SimOptions{.faults = {Fault{.at_ms = 30, .gpu = 0, .kind = FaultKind::kXid, .xid = 48}}},
      common::RealClock::Get());
  ASSERT_TRUE(probe.ok());
  auto xids = (*probe)->WaitForXids(milliseconds(5000));
  ASSERT_TRUE(xids.ok());
  ASSERT_EQ(xids->size(), 1u);
  EXPECT_EQ((*xids)[0].xid, 48u);
}

// Issue 16: the sim backend's MIG layout, seven 1g slices of each GPU.
TEST(SimProbeTest, MigLayoutSlicesEachGpu) {
  common::FakeClock clock;
  SimOptions o;
  o.count = 8;
  o.mig = 7;
  auto probe = SimProbe::Create(o, &clock);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto devices = (*probe)->Devices();
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 8u);
  std::set<std::string> uuids;
  for (const DeviceInfo& d : *devices) {
    ASSERT_EQ(d.slices.size(), 7u);
    for (const SliceInfo& s : d.slices) {
      EXPECT_EQ(s.memory_total_bytes, d.memory_total_bytes / 7);
      EXPECT_EQ(s.name, "NVIDIA L4 MIG 1g.3gb");
      uuids.insert(s.uuid);
    }
  }
  EXPECT_EQ(uuids.size(), 56u);  // every instance its own
  // A MIG instance lost: that GPU's sample names its slot, from then on.
  ASSERT_TRUE((*probe)->Inject(Fault{.gpu = 5, .kind = FaultKind::kMigLost, .slice = 4}).ok());
  auto s = (*probe)->Sample(5);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->slices_lost, std::vector<uint32_t>{4});
  EXPECT_FALSE(s->lost);
  EXPECT_TRUE((*probe)->Sample(4)->slices_lost.empty());
  absl::Status bad = (*probe)->Inject(Fault{.gpu = 5, .kind = FaultKind::kMigLost, .slice = 7});
  EXPECT_THAT(std::string(bad.message()),
              HasSubstr("slice: MIG instance 7 does not exist (7 per GPU)"));
  o.faults = {Fault{.gpu = 0, .kind = FaultKind::kMigLost, .slice = 9}};
  EXPECT_THAT(std::string(SimProbe::Create(o, &clock).status().message()),
              HasSubstr("faults[0].slice: MIG instance 9 does not exist"));
}

}  // namespace
}  // namespace gpuha::gpu
