// Runs NvmlProbe against the fake libnvidia-ml.so.1 built by tests/fake_nvml:
// the dlopen, dlsym and call path are real; only the "driver" is scripted.
#include "gpu/nvml_probe.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <thread>

#include "common/file_util.h"
#include "common/testing/temp_dir.h"
#include "gpu/nvml_cost.h"

namespace gpuha::gpu {
namespace {

using ::testing::HasSubstr;

class NvmlProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = (gpuha::testing::TestTempDir() / "nvml_state").string();
    Write("count 2\ngpu0.temp 47\ngpu0.power_mw 31500\ngpu0.util 64\ngpu0.pending 0\n");
    ::setenv("FAKE_NVML_STATE", state_.c_str(), 1);
  }
  // Whole, as the fake reads it again on every call.
  void Write(const std::string& text) { ASSERT_TRUE(common::WriteFileAtomic(state_, text).ok()); }
  std::string state_;
};

TEST_F(NvmlProbeTest, ReadsDevicesAndSamplesThroughDlopen) {
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ((*probe)->Backend(), "nvml");
  auto devices = (*probe)->Devices();
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].name, "NVIDIA L4");
  EXPECT_EQ((*devices)[1].pci_bus_id, "00000000:42:00.0");
  EXPECT_EQ((*devices)[0].memory_total_bytes, 24ull << 30);
  auto s = (*probe)->Sample(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->temperature_c, 47);
  EXPECT_DOUBLE_EQ(s->power_w, 31.5);
  EXPECT_DOUBLE_EQ(s->power_limit_w, 72);
  EXPECT_EQ(s->utilization_pct, 64u);
  EXPECT_FALSE(s->lost);
  // gpu1 has no "pending" key: the fake answers NOT_SUPPORTED, which is noted.
  auto s1 = (*probe)->Sample(1);
  ASSERT_TRUE(s1.ok());
  EXPECT_THAT(s1->unsupported, ::testing::Contains("nvmlDeviceGetRetiredPagesPendingStatus"));
  // Not a reading of 0 either (an H200 answers so; it remaps rows instead).
  EXPECT_FALSE(s1->retired_pages_pending.has_value());
  EXPECT_EQ(s1->row_remap_pending, false);
  EXPECT_EQ(s->retired_pages_pending, false);
}

TEST_F(NvmlProbeTest, ReadsDcgmExportersOtherCountersAndLabels) {
  Write(
      "count 1\ndriver_version 550.54.15\ngpu0.minor 3\ngpu0.sm_clock 1980\n"
      "gpu0.mem_clock 2619\ngpu0.energy_mj 987654321\ngpu0.pcie_replay 2\ngpu0.util 80\n"
      "gpu0.enc_util 7\ngpu0.dec_util 9\ngpu0.remap_corr 4\ngpu0.remap_unc 1\n"
      "gpu0.remap_failed 0\ngpu0.pending 0\ngpu0.mem_temp 61\ngpu0.pcie_tx_kbps 2000\n"
      "gpu0.nvlink_tx_kib 300\ngpu0.nvlink_rx_kib 400\ngpu0.retired_sbe 2\ngpu0.retired_dbe 1\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto devices = (*probe)->Devices();
  ASSERT_TRUE(devices.ok());
  EXPECT_EQ((*devices)[0].driver_version, "550.54.15");
  EXPECT_EQ((*devices)[0].minor_number, 3u);
  auto s = (*probe)->Sample(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sm_clock_mhz, 1980u);
  EXPECT_EQ(s->memory_clock_mhz, 2619u);
  EXPECT_EQ(s->energy_mj, 987654321u);
  EXPECT_EQ(s->pcie_replays, 2u);
  EXPECT_EQ(s->memory_copy_util_pct, 40u);  // the fake's memory utilisation: half the GPU's
  EXPECT_EQ(s->encoder_util_pct, 7u);
  EXPECT_EQ(s->decoder_util_pct, 9u);
  EXPECT_EQ(s->remapped_rows_correctable, 4u);
  EXPECT_EQ(s->remapped_rows_uncorrectable, 1u);
  EXPECT_EQ(s->row_remap_failed, false);
  EXPECT_EQ(s->memory_temperature_c, 61);
  EXPECT_EQ(s->pcie_tx_bytes_per_s, 2000 * 1024.0);
  EXPECT_EQ(s->pcie_rx_bytes_per_s, 1000 * 1024.0);
  EXPECT_EQ(s->nvlink_kib_total, 700u);  // sent and received, all links
  EXPECT_EQ(s->retired_pages_sbe, 2u);
  EXPECT_EQ(s->retired_pages_dbe, 1u);
  // A board without NVLink answers NOT_SUPPORTED for that field alone.
  Write("count 1\ngpu0.pending 0\n");
  auto pcie = (*probe)->Sample(0);
  ASSERT_TRUE(pcie.ok()) << pcie.status();
  EXPECT_EQ(pcie->memory_temperature_c, 45);
  EXPECT_FALSE(pcie->nvlink_kib_total.has_value());
  EXPECT_THAT(pcie->unsupported, ::testing::Contains("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA"));
  EXPECT_FALSE(pcie->vgpu_licensed.has_value());      // bare metal: no vGPU licensing
  EXPECT_FALSE(pcie->retired_pages_sbe.has_value());  // an Ampere board remaps rows instead
}

// A vGPU guest: the feature its profile enables holds the license or not.
TEST_F(NvmlProbeTest, AVgpuGuestReportsWhetherItsLicenseIsHeld) {
  // Every sample reads the license here (it is a slow reading): the
  // "driver" below changes between samples.
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE, {.slow_every = std::chrono::seconds(0)});
  ASSERT_TRUE(probe.ok()) << probe.status();
  Write("count 2\ngpu0.pending 0\ngpu0.vgpu_license 1\ngpu1.pending 0\ngpu1.vgpu_license 0\n");
  auto held = (*probe)->Sample(0);
  auto lapsed = (*probe)->Sample(1);
  ASSERT_TRUE(held.ok() && lapsed.ok());
  EXPECT_EQ(held->vgpu_licensed, true);
  EXPECT_EQ(lapsed->vgpu_licensed, false);
  Write("count 1\nomit_optional 1\ngpu0.pending 0\n");  // a driver without the entry point
  auto old = (*probe)->Sample(0);
  ASSERT_TRUE(old.ok());
  EXPECT_FALSE(old->vgpu_licensed.has_value());
  EXPECT_THAT(old->unsupported, ::testing::Contains("nvmlDeviceGetGridLicensableFeatures_v4"));
}

// Issue 38: the costly readings (energy 3 ms of CPU, PCIe throughput 20.8
// ms a direction on an H200) and the telemetry no rule judges (clocks) are
// read on the slow cadence, their last value in between; the health
// readings every sample. PCIe throughput comes from
// NVML's cumulative byte counters, as the change over the interval.
TEST_F(NvmlProbeTest, CostlyReadingsComeOnTheSlowCadenceAndPcieFromItsByteCounters) {
  Write(
      "count 1\ngpu0.pending 0\ngpu0.temp 40\ngpu0.energy_mj 1000\ngpu0.sm_clock 1980\n"
      "gpu0.pcie_tx_bytes 1000000\ngpu0.pcie_rx_bytes 2000000\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE, {.slow_every = std::chrono::seconds(60)});
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto first = (*probe)->Sample(0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->energy_mj, 1000u);
  EXPECT_EQ(first->sm_clock_mhz, 1980u);
  EXPECT_FALSE(first->pcie_tx_bytes_per_s.has_value());  // no interval yet
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Write(
      "count 1\ngpu0.pending 0\ngpu0.temp 70\ngpu0.energy_mj 5000\ngpu0.sm_clock 1200\n"
      "gpu0.pcie_tx_bytes 1400000\ngpu0.pcie_rx_bytes 2000000\n");
  auto second = (*probe)->Sample(0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_DOUBLE_EQ(second->temperature_c, 70);  // a health reading: every sample
  EXPECT_EQ(second->energy_mj, 1000u);          // a slow one: its last value
  EXPECT_EQ(second->sm_clock_mhz, 1980u);       // telemetry only: slow too
  ASSERT_TRUE(second->pcie_tx_bytes_per_s.has_value());
  // 400,000 bytes over a little more than 200 ms.
  EXPECT_GT(*second->pcie_tx_bytes_per_s, 1.0e6);
  EXPECT_LE(*second->pcie_tx_bytes_per_s, 2.0e6);
  EXPECT_EQ(second->pcie_rx_bytes_per_s, 0.0);
  // A driver without the byte counters: nvmlDeviceGetPcieThroughput, on the
  // slow cadence (at the first sample here).
  Write("count 1\ngpu0.pending 0\ngpu0.pcie_tx_kbps 2000\n");
  auto fresh = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(fresh.ok());
  auto old = (*fresh)->Sample(0);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->pcie_tx_bytes_per_s, 2000 * 1024.0);
}

// The plan the cost model spends (gpu/nvml_cost.h: the sim backend's
// gpu.sim.cost_model) is the calls the probe makes: every entry point and
// how often, a sample without the slow readings and one with them.
TEST_F(NvmlProbeTest, ASampleMakesTheCallsTheCostModelPlans) {
  Write("count 1\ngpu0.pending 0\ngpu0.pcie_tx_bytes 1\ngpu0.pcie_rx_bytes 1\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE, {.slow_every = std::chrono::seconds(60)});
  ASSERT_TRUE(probe.ok()) << probe.status();
  void* fake = ::dlopen(FAKE_NVML_COMPLETE, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(fake, nullptr);
  auto calls = reinterpret_cast<int (*)(const char*)>(::dlsym(fake, "fake_nvml_calls"));
  auto reset = reinterpret_cast<void (*)()>(::dlsym(fake, "fake_nvml_reset_calls"));
  ASSERT_TRUE(calls != nullptr && reset != nullptr);
  auto expect_plan = [&](std::initializer_list<std::span<const NvmlPlannedCall>> plans) {
    int planned = 0;
    for (std::span<const NvmlPlannedCall> plan : plans) {
      for (const NvmlPlannedCall& p : plan) {
        EXPECT_EQ(calls(std::string(p.call).c_str()), p.times) << p.call;
        planned += p.times;
      }
    }
    EXPECT_EQ(calls(nullptr), planned) << "calls the plan does not list";
  };
  reset();
  ASSERT_TRUE((*probe)->Sample(0).ok());  // the first: the slow readings too
  expect_plan({kNvmlEverySample, kNvmlSlowSample});
  reset();
  ASSERT_TRUE((*probe)->Sample(0).ok());
  expect_plan({kNvmlEverySample});
  ::dlclose(fake);
}

TEST_F(NvmlProbeTest, ReadingsADriverDoesNotSupportAreLeftOutNotErrors) {
  Write("count 1\nomit_optional 1\ngpu0.pending 0\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ((*probe)->Devices()->at(0).driver_version, "");
  EXPECT_FALSE((*probe)->Devices()->at(0).minor_number.has_value());
  auto s = (*probe)->Sample(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->sm_clock_mhz.has_value());
  EXPECT_FALSE(s->energy_mj.has_value());
  EXPECT_FALSE(s->remapped_rows_uncorrectable.has_value());
  EXPECT_FALSE(s->memory_temperature_c.has_value());
  EXPECT_FALSE(s->pcie_tx_bytes_per_s.has_value());
  EXPECT_THAT(s->unsupported, ::testing::Contains("nvmlDeviceGetTotalEnergyConsumption"));
  EXPECT_DOUBLE_EQ(s->temperature_c, 40);  // the required readings still come
}

TEST_F(NvmlProbeTest, GpuIsLostIsAHealthEventNotAnError) {
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok());
  Write("count 2\ngpu1.lost 1\n");
  auto s = (*probe)->Sample(1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->lost);
  EXPECT_FALSE((*probe)->Sample(0)->lost);
}

TEST_F(NvmlProbeTest, XidEventsArriveThroughTheEventSet) {
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok());
  EXPECT_TRUE((*probe)->WaitForXids(std::chrono::milliseconds(10))->empty());
  Write("count 2\nxid_seq 1\nxid_gpu 1\nxid 79\n");
  auto xids = (*probe)->WaitForXids(std::chrono::milliseconds(500));
  ASSERT_TRUE(xids.ok()) << xids.status();
  ASSERT_EQ(xids->size(), 1u);
  EXPECT_EQ((*xids)[0].gpu_index, 1u);
  EXPECT_EQ((*xids)[0].xid, 79u);
}

// Issue 52, item 1: the recovery action comes from NVML too, where the
// kernel log's line is not read: XID 154's and 144-150's events carry
// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as read at the event, and a change
// of it (nvmlEventTypeGpuRecoveryAction) comes as a recovery_only event.
// A driver before R565 refuses the event type and lacks the field: XIDs
// still register and arrive, with the action unknown.
TEST_F(NvmlProbeTest, TheRecoveryActionComesWithXid154AndAsItsOwnEvent) {
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok());
  EXPECT_TRUE((*probe)->RecoveryEventsRegistered(0));
  EXPECT_EQ((*probe)->RecoveryAction(0), std::nullopt);  // no field: not supported
  Write("count 2\ngpu1.recovery_action 4\nxid_gpu 1\nxid 154\nxid_seq 101\n");
  EXPECT_EQ((*probe)->RecoveryAction(1), 4);
  auto xids = (*probe)->WaitForXids(std::chrono::milliseconds(500));
  ASSERT_TRUE(xids.ok()) << xids.status();
  ASSERT_EQ(xids->size(), 1u);
  EXPECT_EQ((*xids)[0].xid, 154u);
  EXPECT_EQ((*xids)[0].recovery_value, 4);  // Drain and Reset
  EXPECT_FALSE((*xids)[0].recovery_only);
  Write("count 2\ngpu1.recovery_action 1\nxid_seq 101\nrecovery_gpu 1\nrecovery_seq 101\n");
  xids = (*probe)->WaitForXids(std::chrono::milliseconds(500));
  ASSERT_TRUE(xids.ok()) << xids.status();
  ASSERT_EQ(xids->size(), 1u);
  EXPECT_EQ((*xids)[0].gpu_index, 1u);
  EXPECT_EQ((*xids)[0].xid, 154u);
  EXPECT_EQ((*xids)[0].recovery_value, 1);  // GPU Reset Required
  EXPECT_TRUE((*xids)[0].recovery_only);
}

TEST_F(NvmlProbeTest, ADriverWithoutTheRecoveryEventStillDeliversXids) {
  Write("count 2\nno_recovery_event 1\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_TRUE((*probe)->EventsRegistered(0));
  EXPECT_FALSE((*probe)->RecoveryEventsRegistered(0));
  Write("count 2\nno_recovery_event 1\nxid_gpu 0\nxid 154\nrecovery_seq 201\nxid_seq 201\n");
  auto xids = (*probe)->WaitForXids(std::chrono::milliseconds(500));
  ASSERT_TRUE(xids.ok()) << xids.status();
  ASSERT_EQ(xids->size(), 1u);  // the XID; no recovery event from a driver that has none
  EXPECT_EQ((*xids)[0].recovery_value, -1);
}

TEST_F(NvmlProbeTest, MissingLibraryIsAClearError) {
  auto probe = NvmlProbe::Open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(probe.ok());
  EXPECT_THAT(std::string(probe.status().message()), HasSubstr("cannot load NVML"));
  EXPECT_THAT(std::string(probe.status().message()), HasSubstr("Is the NVIDIA driver installed?"));
  // No flag of one command: the agent and doctor each add their own word.
  EXPECT_THAT(std::string(probe.status().message()), ::testing::Not(HasSubstr("--gpu")));
}

TEST_F(NvmlProbeTest, MissingSymbolIsNamed) {
  auto probe = NvmlProbe::Open(FAKE_NVML_PARTIAL);
  ASSERT_FALSE(probe.ok());
  EXPECT_THAT(std::string(probe.status().message()), HasSubstr("no symbol nvmlEventSetWait_v2"));
}

TEST_F(NvmlProbeTest, DriverNotLoadedAndNoGpuAreClearErrors) {
  Write("init_error 9\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_FALSE(probe.ok());
  EXPECT_THAT(std::string(probe.status().message()),
              HasSubstr("nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)"));
  Write("count 0\n");
  probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_FALSE(probe.ok());
  EXPECT_THAT(std::string(probe.status().message()), HasSubstr("found no GPU"));
}

// Issue 16: MIG instances through NVML's MIG entry points, empty slots
// skipped; a GPU with MIG off, or a driver without the entry points, has none.
TEST_F(NvmlProbeTest, MigInstancesAreListedPerGpu) {
  Write("count 2\ngpu0.mig 7\ngpu0.mig3.gone 1\ngpu0.mig1.mem_total 21474836480\n");
  auto probe = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto devices = (*probe)->Devices();
  ASSERT_TRUE(devices.ok());
  const std::vector<SliceInfo>& slices = (*devices)[0].slices;
  ASSERT_EQ(slices.size(), 6u);  // slot 3 is empty
  EXPECT_EQ(slices[3].index, 4u);
  EXPECT_EQ(slices[0].name, "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
  EXPECT_EQ(slices[0].uuid.rfind("MIG-", 0), 0u) << slices[0].uuid;
  EXPECT_NE(slices[0].uuid, slices[1].uuid);
  EXPECT_EQ(slices[1].memory_total_bytes, 20ull << 30);
  EXPECT_EQ(slices[0].memory_total_bytes, 10ull << 30);
  EXPECT_TRUE((*devices)[1].slices.empty());  // MIG off
  // An instance destroyed after the agent listed it: its slot is lost in
  // the GPU's samples, and the GPU itself answers.
  auto sample = (*probe)->Sample(0);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_TRUE(sample->slices_lost.empty());
  Write("count 2\ngpu0.mig 7\ngpu0.mig3.gone 1\ngpu0.mig5.gone 1\n");
  sample = (*probe)->Sample(0);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->slices_lost, std::vector<uint32_t>{5});
  EXPECT_FALSE(sample->lost);
  Write("count 1\ngpu0.mig 7\nomit_optional 1\n");
  devices = (*probe)->Devices();
  ASSERT_TRUE(devices.ok());
  EXPECT_TRUE((*devices)[0].slices.empty());  // the driver answers NOT_SUPPORTED
}

}  // namespace
}  // namespace gpuha::gpu
