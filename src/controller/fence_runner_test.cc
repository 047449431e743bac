// The real fence runner: exit codes, timeouts that kill the hook's whole
// process group, and a hook started from a thread that blocks SIGTERM.
#include "controller/fence_runner.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "common/testing/temp_dir.h"

namespace gpuha::controller {
namespace {

using std::chrono::milliseconds;

// True while `pid` exists and is not a zombie.
bool Running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

TEST(ShellFenceRunnerTest, ExitZeroConfirmsTheFence) {
  ShellFenceRunner runner;
  EXPECT_TRUE(runner.Run("true", std::chrono::seconds(5)).ok());
}

TEST(ShellFenceRunnerTest, NonZeroExitIsAnErrorNamingTheCode) {
  ShellFenceRunner runner;
  absl::Status s = runner.Run("exit 3", std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("exit 3"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'exit 3'"), std::string::npos) << s;
}

TEST(ShellFenceRunnerTest, HookKilledBySignalIsAnError) {
  ShellFenceRunner runner;
  absl::Status s = runner.Run("kill -KILL $$", std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("signal 9"), std::string::npos) << s;
}

TEST(ShellFenceRunnerTest, TimeoutKillsTheHookAndEverythingItStarted) {
  auto pidfile = gpuha::testing::TestTempDir() / "child.pid";
  ShellFenceRunner runner;
  auto t0 = std::chrono::steady_clock::now();
  absl::Status s =
      runner.Run("sleep 30 & echo $! > " + pidfile.string() + "; wait", milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("timed out after 300 ms"), std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  std::string text = common::ReadFile(pidfile).value_or("");
  ASSERT_FALSE(text.empty());
  pid_t child = std::stoi(text);
  // The grandchild got the process group's SIGKILL; its reaper may take a moment.
  for (int i = 0; i < 400 && Running(child); ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_FALSE(Running(child)) << "the hook's child " << child << " outlived the timeout";
}

// Regression: the controller blocks SIGINT and SIGTERM for its signal thread,
// and its own fork/exec kept that mask in the hook, so `kubectl` or
// `ipmitool` ignored termination.
TEST(ShellFenceRunnerTest, HookRunsWithNoSignalBlockedEvenFromABlockingThread) {
  auto out = gpuha::testing::TestTempDir() / "mask";
  absl::Status s;
  std::thread t([&] {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    ShellFenceRunner runner;
    s = runner.Run("grep SigBlk /proc/self/status > " + out.string(), std::chrono::seconds(5));
  });
  t.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(common::ReadFile(out).value_or(""), "SigBlk:\t0000000000000000\n");
}

TEST(ShellFenceRunnerTest, HookThatCannotStartIsAnError) {
  ShellFenceRunner runner;
  absl::Status s = runner.Run("/nonexistent/fence-hook", std::chrono::seconds(5));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/fence-hook"), std::string::npos) << s;
}

}  // namespace
}  // namespace gpuha::controller
