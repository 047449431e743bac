// WatchedProbe against the fake libnvidia-ml.so.1 (tests/fake_nvml), whose
// "gpuN.hang 1" makes every call on that GPU block as a driver stuck in the
// kernel does, and against the sim backend's driver_hang fault.
#include "gpu/watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "gpu/nvml_probe.h"
#include "gpu/sim_probe.h"

namespace gpuha::gpu {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

int64_t MillisSince(steady_clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - t).count();
}

class WatchdogNvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = (gpuha::testing::TestTempDir() / "nvml_state").string();
    Write("count 2\ngpu0.temp 47\ngpu1.temp 52\n");
    ::setenv("FAKE_NVML_STATE", state_.c_str(), 1);
  }
  void Write(const std::string& text) { std::ofstream(state_) << text; }
  std::string state_;
};

TEST_F(WatchdogNvmlTest, AHungCallFailsItsGpuAndTheOthersAreStillSampled) {
  auto nvml = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto probe = WatchedProbe::Wrap(std::move(*nvml), milliseconds(200));
  EXPECT_EQ(probe->Backend(), "nvml");
  ASSERT_TRUE(probe->Devices().ok());
  EXPECT_FALSE(probe->Sample(0)->lost);

  Write("count 2\ngpu0.temp 47\ngpu1.temp 52\ngpu0.hang 1\n");
  auto t = steady_clock::now();
  auto s = probe->Sample(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(MillisSince(t), 190);
  EXPECT_LT(MillisSince(t), 2000);  // the deadline, not the driver, ended the call
  EXPECT_TRUE(s->lost);
  EXPECT_THAT(s->lost_detail, HasSubstr("nvml driver has not answered for 200 ms"));
  EXPECT_EQ(probe->hung_calls(), 1u);

  // gpu1 answers on its own thread; gpu0 answers "lost" at once while its
  // first call is still stuck, without starting another.
  auto s1 = probe->Sample(1);
  ASSERT_TRUE(s1.ok());
  EXPECT_FALSE(s1->lost);
  EXPECT_DOUBLE_EQ(s1->temperature_c, 52);
  t = steady_clock::now();
  s = probe->Sample(0);
  EXPECT_LT(MillisSince(t), 150);
  EXPECT_TRUE(s->lost);
  EXPECT_THAT(s->lost_detail, HasSubstr("watchdog deadline 200 ms"));
  EXPECT_EQ(probe->hung_calls(), 1u);

  // The driver comes back: the stuck call returns and gpu0 is sampled again.
  Write("count 2\ngpu0.temp 48\ngpu1.temp 52\n");
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    s = probe->Sample(0);
    back = s.ok() && !s->lost;
  }
  EXPECT_TRUE(back);
  EXPECT_DOUBLE_EQ(s->temperature_c, 48);
}

TEST_F(WatchdogNvmlTest, ADriverThatHangsWhileListingIsAnErrorNotAHang) {
  auto nvml = NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto probe = WatchedProbe::Wrap(std::move(*nvml), milliseconds(150));
  Write("count 2\ngpu1.hang 1\n");
  auto devices = probe->Devices();
  ASSERT_FALSE(devices.ok());
  EXPECT_THAT(devices.status().message(), HasSubstr("did not list its GPUs within 150 ms"));
  Write("count 2\n");  // let the stuck call return before the library unloads
  std::this_thread::sleep_for(milliseconds(100));
}

TEST(WatchdogSimTest, TheSimulatedDriverHangIsCaughtAndEndsWithItsFault) {
  auto sim = SimProbe::Create(
      {.count = 2,
       .faults = {Fault{.at_ms = 0, .gpu = 1, .kind = FaultKind::kDriverHang, .for_ms = 400}}},
      common::RealClock::Get());
  ASSERT_TRUE(sim.ok());
  auto probe = WatchedProbe::Wrap(std::move(*sim), milliseconds(100));
  EXPECT_FALSE(probe->Sample(0)->lost);
  EXPECT_TRUE(probe->Sample(1)->lost);
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(probe->Sample(1)->lost);
  EXPECT_EQ(probe->hung_calls(), 1u);
}

// A probe whose Sample() blocks until released, recording what happened.
class BlockingProbe : public GpuProbe {
 public:
  struct Log {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false, returned = false, destroyed_after_return = false;
  };
  explicit BlockingProbe(std::shared_ptr<Log> log) : log_(std::move(log)) {}
  ~BlockingProbe() override {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->destroyed_after_return = log_->returned;
  }
  std::string Backend() const override { return "blocking"; }
  absl::StatusOr<std::vector<DeviceInfo>> Devices() override { return std::vector<DeviceInfo>(1); }
  absl::StatusOr<GpuSample> Sample(uint32_t index) override {
    std::unique_lock<std::mutex> lock(log_->mu);
    log_->cv.wait(lock, [&] { return log_->release; });
    log_->returned = true;
    GpuSample s;
    s.index = index;
    return s;
  }
  absl::StatusOr<std::vector<XidEvent>> WaitForXids(std::chrono::milliseconds) override {
    std::unique_lock<std::mutex> lock(log_->mu);
    log_->cv.wait(lock, [&] { return log_->release; });
    return std::vector<XidEvent>{};
  }

 private:
  std::shared_ptr<Log> log_;
};

TEST(WatchdogTest, ADestroyedProbeKeepsTheWrappedOneUntilTheStuckCallReturns) {
  auto log = std::make_shared<BlockingProbe::Log>();
  {
    auto probe = WatchedProbe::Wrap(std::make_unique<BlockingProbe>(log), milliseconds(50));
    EXPECT_TRUE(probe->Sample(0)->lost);
  }  // the stuck caller thread is detached, holding the wrapped probe
  {
    std::lock_guard<std::mutex> lock(log->mu);
    log->release = true;
  }
  log->cv.notify_all();
  // The wrapped probe goes only after its call returned (no use after free).
  EXPECT_TRUE(gpuha::testing::Eventually(
      [&] {
        std::lock_guard<std::mutex> lock(log->mu);
        return log->destroyed_after_return;
      },
      milliseconds(2000), milliseconds(5)));
}

TEST(WatchdogTest, AHungEventWaitIsAnErrorAfterItsTimeoutAndTheDeadline) {
  auto log = std::make_shared<BlockingProbe::Log>();
  auto probe = WatchedProbe::Wrap(std::make_unique<BlockingProbe>(log), milliseconds(100));
  auto t = steady_clock::now();
  auto xids = probe->WaitForXids(milliseconds(50));
  ASSERT_FALSE(xids.ok());
  EXPECT_GE(MillisSince(t), 140);
  EXPECT_THAT(xids.status().message(), HasSubstr("event wait has not returned for 150 ms"));
  // While it is still stuck, the next wait is refused at once.
  t = steady_clock::now();
  EXPECT_FALSE(probe->WaitForXids(milliseconds(50)).ok());
  EXPECT_LT(MillisSince(t), 50);
  EXPECT_EQ(probe->hung_calls(), 1u);
  {
    std::lock_guard<std::mutex> lock(log->mu);
    log->release = true;
  }
  log->cv.notify_all();
}

TEST(WatchdogTest, AllGpusHungCostOneDeadlineNotOneEach) {
  auto log = std::make_shared<BlockingProbe::Log>();
  auto probe = WatchedProbe::Wrap(std::make_unique<BlockingProbe>(log), milliseconds(200));
  auto t = steady_clock::now();
  auto samples = probe->SampleAll({0, 1, 2, 3});
  EXPECT_LT(MillisSince(t), 600);  // one deadline (200 ms), not four (800 ms)
  ASSERT_EQ(samples.size(), 4u);
  for (const auto& s : samples) EXPECT_TRUE(s->lost);
  EXPECT_EQ(probe->hung_calls(), 4u);
  {
    std::lock_guard<std::mutex> lock(log->mu);
    log->release = true;
  }
  log->cv.notify_all();
}

}  // namespace
}  // namespace gpuha::gpu
