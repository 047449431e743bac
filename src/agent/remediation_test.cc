// Remediation in steps on a fake clock and fake processes.
#include "agent/remediation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "agent/testing/fake_process_runner.h"
#include "common/file_util.h"
#include "common/testing/temp_dir.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeProcessRunner;
using ::testing::HasSubstr;

const std::map<uint32_t, std::string> kPci = {{0, "0000:3b:00.0"}, {1, "0000:5e:00.0"}};

class RemediationTest : public ::testing::Test {
 protected:
  RemediationOptions Options() {
    RemediationOptions o;
    o.gpu_reset = {"nvidia-smi", "--gpu-reset", "-i", "{gpu}"};
    o.reboot = {"reboot-hook", "{node}", "{pci}"};
    o.timeout = seconds(30);
    o.window = seconds(600);
    return o;
  }
  common::FakeClock clock_;
  FakeProcessRunner runner_;
};

TEST_F(RemediationTest, ResetThenRebootThenHeldForAHuman) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  EXPECT_TRUE(r.Tick({}, kPci).empty());
  EXPECT_EQ(runner_.spawns, 0);  // nothing failed, nothing runs
  EXPECT_TRUE(r.Tick({1}, kPci).empty());
  EXPECT_EQ(runner_.last_argv, (std::vector<std::string>{"nvidia-smi", "--gpu-reset", "-i", "1"}));
  EXPECT_TRUE(r.State().at(1).running);
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);                         // the reset ends, exit 0
  EXPECT_EQ(r.Tick({1}, kPci), std::vector<uint32_t>{1});  // to be judged again
  EXPECT_EQ(r.State().at(1).result, "exit 0");
  // Still failed right after: the verdict from before the reset settles.
  clock_.Advance(seconds(1));
  r.Tick({1}, kPci);
  EXPECT_EQ(runner_.spawns, 1);
  // Failed again well after: the next step, the node's reboot hook.
  clock_.Advance(seconds(5));
  r.Tick({1}, kPci);
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_EQ(runner_.last_argv, (std::vector<std::string>{"reboot-hook", "gpu-7", "0000:5e:00.0"}));
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kReboot);
  runner_.exit_text = "exit 1";
  runner_.Crash(runner_.last_pid);
  r.Tick({1}, kPci);  // the hook failed: no more steps
  r.Tick({1}, kPci);
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kHeld);
  EXPECT_THAT(r.State().at(1).result,
              HasSubstr("held out for a human after 2 step(s): reset: exit 0; reboot: exit 1"));
  clock_.Advance(seconds(3600));
  r.Tick({}, kPci);
  r.Tick({1}, kPci);
  EXPECT_EQ(runner_.spawns, 2);  // held stays held until the node rejoins
  r.Reset();
  r.Tick({1}, kPci);
  EXPECT_EQ(runner_.spawns, 3);  // a new run of steps
}

TEST_F(RemediationTest, AStepThatHangsIsKilledAtItsTimeoutAndEscalates) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  r.Tick({0}, kPci);
  pid_t reset = runner_.last_pid;
  clock_.Advance(seconds(29));
  r.Tick({0}, kPci);
  EXPECT_TRUE(r.State().at(0).running);
  clock_.Advance(seconds(2));
  r.Tick({0}, kPci);
  EXPECT_FALSE(runner_.alive[reset]);  // SIGKILL
  // At once, in the same tick: the reset failed, the reboot hook runs.
  EXPECT_EQ(r.State().at(0).step, RemedyStep::kReboot);
  ASSERT_EQ(r.State().at(0).log.size(), 1u);
  EXPECT_EQ(r.State().at(0).log[0], "reset: timed out after 30000 ms");
}

TEST_F(RemediationTest, AGpuHealthyForAWindowStartsOverAtTheReset) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  r.Tick({0}, kPci);
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);
  r.Tick({}, kPci);
  clock_.Advance(seconds(601));
  r.Tick({}, kPci);
  r.Tick({0}, kPci);
  EXPECT_EQ(r.State().at(0).step, RemedyStep::kReset);
  EXPECT_EQ(runner_.spawns, 2);
}

TEST_F(RemediationTest, APassthroughHostRebindsTheGpusPciFunction) {
  namespace fs = std::filesystem;
  fs::path root = gpuha::testing::TestTempDir() / "pci";
  fs::create_directories(root / "drivers" / "nvidia");
  std::ofstream(root / "drivers" / "nvidia" / "bind").flush();
  std::ofstream(root / "drivers" / "nvidia" / "unbind").flush();
  fs::create_directories(root / "devices" / "0000:3b:00.0");
  std::ofstream(root / "devices" / "0000:3b:00.0" / "driver_override").flush();
  fs::create_directory_symlink("../../drivers/nvidia",
                               root / "devices" / "0000:3b:00.0" / "driver");
  RemediationOptions o = Options();
  o.gpu_reset.clear();
  o.rebind_driver = "nvidia";
  o.sysfs_pci = root.string();
  Remediator r(o, &runner_, &clock_, "gpu-7");
  EXPECT_EQ(r.Tick({0}, kPci), std::vector<uint32_t>{0});
  EXPECT_EQ(runner_.spawns, 0);  // in-process: sysfs writes
  EXPECT_EQ(r.State().at(0).result, "rebound 0000:3b:00.0 to nvidia");
  EXPECT_EQ(common::ReadFile((root / "drivers" / "nvidia" / "bind").string()).value_or(""),
            "0000:3b:00.0");
  // GPU 1 is not in the tree: the rebind fails and the reboot hook is next.
  r.Tick({1}, kPci);
  EXPECT_THAT(r.State().at(1).result, HasSubstr("rebind failed: no PCI device 0000:5e:00.0"));
  r.Tick({1}, kPci);
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kReboot);
  EXPECT_EQ(runner_.last_argv[0], "reboot-hook");
}

}  // namespace
}  // namespace gpuha::agent
