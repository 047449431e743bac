// Remediation in steps on a fake clock and fake processes.
#include "agent/remediation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
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

// `failed` GPUs, no server running, the node fenced (every guard open).
Remediator::Input In(std::set<uint32_t> failed, bool node_fenced = true) {
  return {std::move(failed), kPci, {}, node_fenced};
}

class RemediationTest : public ::testing::Test {
 protected:
  RemediationOptions Options() {
    RemediationOptions o;
    o.gpu_reset = {"nvidia-smi", "--gpu-reset", "-i", "{gpu}"};
    o.reboot = {"reboot-hook", "{node}", "{pci}"};
    o.timeout = seconds(30);
    o.window = seconds(600);
    o.reboot_history = history_;
    return o;
  }
  // `failed` GPUs and the node's own verdict asking for a reboot.
  static Remediator::Input Reboot(bool node_fenced = true) {
    Remediator::Input in = In({}, node_fenced);
    in.reboot_for = "gpu0.xid79: XID 79: GPU has fallen off the bus";
    return in;
  }
  common::FakeClock clock_;
  FakeProcessRunner runner_;
  const std::string history_ = (gpuha::testing::TestTempDir() / "reboots").string();
};

TEST_F(RemediationTest, ResetThenRebootThenHeldForAHuman) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  EXPECT_TRUE(r.Tick(In({})).empty());
  EXPECT_EQ(runner_.spawns, 0);  // nothing failed, nothing runs
  EXPECT_TRUE(r.Tick(In({1})).empty());
  EXPECT_EQ(runner_.last_argv, (std::vector<std::string>{"nvidia-smi", "--gpu-reset", "-i", "1"}));
  EXPECT_TRUE(r.State().at(1).running);
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);                       // the reset ends, exit 0
  EXPECT_EQ(r.Tick(In({1})), std::vector<uint32_t>{1});  // to be judged again
  EXPECT_EQ(r.State().at(1).result, "exit 0");
  // Still failed right after: the verdict from before the reset settles.
  clock_.Advance(seconds(1));
  r.Tick(In({1}));
  EXPECT_EQ(runner_.spawns, 1);
  // Failed again well after: the next step, the node's reboot hook.
  clock_.Advance(seconds(5));
  r.Tick(In({1}));
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_EQ(runner_.last_argv, (std::vector<std::string>{"reboot-hook", "gpu-7", "0000:5e:00.0"}));
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kReboot);
  runner_.exit_text = "exit 1";
  runner_.Crash(runner_.last_pid);
  r.Tick(In({1}));  // the hook failed: no more steps
  r.Tick(In({1}));
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kHeld);
  EXPECT_THAT(r.State().at(1).result,
              HasSubstr("held out for a human after 2 step(s): reset: exit 0; reboot: exit 1"));
  clock_.Advance(seconds(3600));
  r.Tick(In({1}));
  EXPECT_EQ(runner_.spawns, 2);  // held while it stays failed
  r.Reset();
  r.Tick(In({1}));
  EXPECT_EQ(runner_.spawns, 3);  // a new run of steps
}

TEST_F(RemediationTest, AStepThatHangsIsKilledAtItsTimeoutAndEscalates) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  r.Tick(In({0}));
  pid_t reset = runner_.last_pid;
  clock_.Advance(seconds(29));
  r.Tick(In({0}));
  EXPECT_TRUE(r.State().at(0).running);
  clock_.Advance(seconds(2));
  r.Tick(In({0}));
  EXPECT_FALSE(runner_.alive[reset]);  // SIGKILL
  // At once, in the same tick: the reset failed, the reboot hook runs.
  EXPECT_EQ(r.State().at(0).step, RemedyStep::kReboot);
  ASSERT_EQ(r.State().at(0).log.size(), 1u);
  EXPECT_EQ(r.State().at(0).log[0], "reset: timed out after 30000 ms");
}

TEST_F(RemediationTest, AGpuHealthyForAWindowStartsOverAtTheReset) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  r.Tick(In({0}));
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);
  r.Tick(In({}));
  clock_.Advance(seconds(601));
  r.Tick(In({}));
  r.Tick(In({0}));
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
  EXPECT_EQ(r.Tick(In({0})), std::vector<uint32_t>{0});
  EXPECT_EQ(runner_.spawns, 0);  // in-process: sysfs writes
  EXPECT_EQ(r.State().at(0).result, "rebound 0000:3b:00.0 to nvidia");
  EXPECT_EQ(common::ReadFile((root / "drivers" / "nvidia" / "bind").string()).value_or(""),
            "0000:3b:00.0");
  // GPU 1 is not in the tree: the rebind fails and the reboot hook is next.
  r.Tick(In({1}));
  EXPECT_THAT(r.State().at(1).result, HasSubstr("rebind failed: no PCI device 0000:5e:00.0"));
  r.Tick(In({1}));
  EXPECT_EQ(r.State().at(1).step, RemedyStep::kReboot);
  EXPECT_EQ(runner_.last_argv[0], "reboot-hook");
}

// Guard rails: the reset waits for the GPU's server to stop, the reboot
// hook for the node's fence (after the agent reported it draining).
TEST_F(RemediationTest, StepsWaitForTheServerToStopAndTheNodeToBeFenced) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  Remediator::Input busy = In({0});
  busy.busy = {0};
  r.Tick(busy);
  EXPECT_EQ(runner_.spawns, 0);
  EXPECT_TRUE(r.State().at(0).waiting);
  EXPECT_EQ(r.State().at(0).result, "waiting for the GPU's server to stop");
  r.Tick(In({0}, /*node_fenced=*/false));  // the server stopped: the reset runs
  EXPECT_EQ(runner_.spawns, 1);
  runner_.Crash(runner_.last_pid);  // exit 1: the reboot is next
  r.Tick(In({0}, /*node_fenced=*/false));
  EXPECT_EQ(runner_.spawns, 1);
  EXPECT_TRUE(r.RebootWanted());  // the agent reports the node draining
  EXPECT_EQ(r.State().at(0).result, "waiting for the node's work to move and its fence");
  r.Tick(In({0}, /*node_fenced=*/true));
  EXPECT_EQ(runner_.spawns, 2);
  EXPECT_EQ(runner_.last_argv[0], "reboot-hook");
  EXPECT_TRUE(r.RebootWanted());  // running
}

TEST_F(RemediationTest, AHeldGpuHealthyForAWindowStartsOver) {
  RemediationOptions o = Options();
  o.reboot.clear();
  Remediator r(o, &runner_, &clock_, "gpu-7");
  r.Tick(In({0}));
  runner_.Crash(runner_.last_pid);  // exit 1
  r.Tick(In({0}));
  EXPECT_EQ(r.State().at(0).step, RemedyStep::kHeld);
  clock_.Advance(seconds(601));  // a human replaced it; healthy since
  r.Tick(In({}));
  r.Tick(In({0}));
  EXPECT_EQ(r.State().at(0).step, RemedyStep::kReset);
  EXPECT_EQ(runner_.spawns, 2);
}

// Issue 52, item 9: the node's own verdict asks for a reboot (XID 79):
// the hook runs directly, once the node is fenced, and each run is written
// to the history first; within the cool-down a reboot waits, and after
// max_reboots within the window it is held for a human, across the
// reboots themselves (a new Remediator reads the same history).
TEST_F(RemediationTest, ARebootTheNodeAsksForRunsOnceFencedAndIsBoundedAcrossReboots) {
  RemediationOptions o = Options();
  o.max_reboots = 2;
  auto r = std::make_unique<Remediator>(o, &runner_, &clock_, "gpu-7");
  r->Tick(Reboot(/*node_fenced=*/false));
  EXPECT_EQ(runner_.spawns, 0);
  EXPECT_TRUE(r->RebootWanted());  // the agent reports the node draining
  EXPECT_THAT(r->NodeState().result, HasSubstr("waiting for the node's work to move"));
  EXPECT_THAT(r->NodeState().result, HasSubstr("gpu0.xid79"));
  r->Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 1);
  EXPECT_EQ(runner_.last_argv, (std::vector<std::string>{"reboot-hook", "gpu-7", ""}));
  EXPECT_TRUE(r->NodeState().running);
  EXPECT_EQ(common::ReadFile(history_).value_or(""),
            absl::StrCat(clock_.UnixNanos() / 1'000'000'000, "\n"));
  runner_.exit_text = "exit 0";
  runner_.Crash(runner_.last_pid);
  r->Tick(Reboot());
  EXPECT_EQ(r->NodeState().result, "exit 0");
  // The node came back (the agent restarted: a new Remediator) and XID 79
  // again: within the cool-down the reboot waits.
  clock_.Advance(seconds(600));
  r = std::make_unique<Remediator>(o, &runner_, &clock_, "gpu-7");
  r->Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 1);
  EXPECT_EQ(r->NodeState().step, RemedyStep::kReboot);
  EXPECT_THAT(r->NodeState().result, HasSubstr("reboot waits for its cool-down"));
  clock_.Advance(seconds(3000));  // an hour since the first
  r->Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 2);
  runner_.Crash(runner_.last_pid);
  clock_.Advance(seconds(3600));
  r = std::make_unique<Remediator>(o, &runner_, &clock_, "gpu-7");
  r->Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 2);  // max_reboots within the window: held
  EXPECT_EQ(r->NodeState().step, RemedyStep::kHeld);
  EXPECT_THAT(r->NodeState().result, HasSubstr("held for a human: the hook ran 2 times"));
  // The GPU steps' reboot is bounded by the same history.
  r->Tick(In({0}));                 // the reset
  runner_.Crash(runner_.last_pid);  // exit 0, and GPU 0 still failed after
  r->Tick(In({0}));
  clock_.Advance(seconds(10));
  r->Tick(In({0}));
  EXPECT_EQ(runner_.spawns, 3);  // the reset only; its reboot is held
  EXPECT_EQ(r->State().at(0).step, RemedyStep::kHeld);
  // A week on, the window is clear.
  clock_.Advance(std::chrono::hours(24 * 7));
  r = std::make_unique<Remediator>(o, &runner_, &clock_, "gpu-7");
  r->Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 4);
}

// A hook that fails holds the node for a human; a history that cannot be
// read or written holds it too (a loop it could not bound).
TEST_F(RemediationTest, ARebootHookThatFailsOrAnUnusableHistoryHoldsTheNode) {
  Remediator r(Options(), &runner_, &clock_, "gpu-7");
  r.Tick(Reboot());
  runner_.Crash(runner_.last_pid);  // exit 1
  r.Tick(Reboot());
  r.Tick(Reboot());
  EXPECT_EQ(r.NodeState().step, RemedyStep::kHeld);
  EXPECT_THAT(r.NodeState().result, HasSubstr("held out for a human: reboot: exit 1"));
  EXPECT_EQ(runner_.spawns, 1);
  RemediationOptions o = Options();
  o.reboot_history = (gpuha::testing::TestTempDir() / "no" / "such" / "dir").string();
  Remediator unwritable(o, &runner_, &clock_, "gpu-7");
  unwritable.Tick(Reboot());
  EXPECT_EQ(runner_.spawns, 1);
  EXPECT_EQ(unwritable.NodeState().step, RemedyStep::kHeld);
  EXPECT_THAT(unwritable.NodeState().result, HasSubstr("cannot write remediation.reboot_history"));
  ASSERT_TRUE(common::WriteFileAtomic(history_, "yesterday\n").ok());
  Remediator garbled(Options(), &runner_, &clock_, "gpu-7");
  garbled.Tick(Reboot());
  EXPECT_THAT(garbled.NodeState().result, HasSubstr("line 1: 'yesterday' is not a time"));
  EXPECT_EQ(runner_.spawns, 1);
}

}  // namespace
}  // namespace gpuha::agent
