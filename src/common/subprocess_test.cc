#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"

namespace gpuha::common {
namespace {

using std::chrono::milliseconds;

// Waits for `pid` and returns its raw wait status.
int Reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(SpawnProcessTest, OutputGoesToTheLogAndExecFailureIsAnError) {
  auto log = gpuha::testing::TestTempDir() / "out.log";
  auto pid = SpawnProcess({"/bin/sh", "-c", "echo hello; echo oops >&2"}, log.string());
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = Reap(*pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(common::ReadFile(log).value_or(""), "hello\noops\n");
  auto missing = SpawnProcess({"/nonexistent/program"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot run '/nonexistent/program'"), std::string::npos)
      << missing.status();
  EXPECT_FALSE(SpawnProcess({}).ok());
}

TEST(SpawnProcessTest, ChildStartsWithNoSignalBlocked) {
  auto log = gpuha::testing::TestTempDir() / "mask.log";
  absl::StatusOr<pid_t> pid;
  std::thread t([&] {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    pid = SpawnProcess({"/bin/grep", "SigBlk", "/proc/self/status"}, log.string(),
                       /*die_with_parent=*/false);
  });
  t.join();
  ASSERT_TRUE(pid.ok()) << pid.status();
  Reap(*pid);
  EXPECT_EQ(common::ReadFile(log).value_or(""), "SigBlk:\t0000000000000000\n");
}

// PR_SET_PDEATHSIG follows the spawning thread: when it ends, the child is
// killed, unless it was spawned not to die with its parent.
TEST(SpawnProcessTest, ChildDiesWithItsSpawningThreadUnlessToldNotTo) {
  pid_t tied = -1, free = -1;
  std::thread([&] { tied = *SpawnProcess({"/bin/sleep", "30"}); }).join();
  int status = Reap(tied);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  std::thread([&] {
    free = *SpawnProcess({"/bin/sleep", "30"}, "", /*die_with_parent=*/false);
  }).join();
  std::this_thread::sleep_for(milliseconds(100));  // give a wrong SIGKILL time to land
  EXPECT_EQ(::waitpid(free, &status, WNOHANG), 0) << "the untied child died with its thread";
  ::kill(free, SIGKILL);
  Reap(free);
}

TEST(ChildPidsTest, ListsTheDirectChildren) {
  auto pid = SpawnProcess({"/bin/sh", "-c", "sleep 30 & sleep 30 & wait"});
  ASSERT_TRUE(pid.ok());
  EXPECT_TRUE(gpuha::testing::Eventually([&] { return ChildPids(*pid).size() == 2; }));
  ::kill(-*pid, SIGKILL);  // its own process group (session)
  Reap(*pid);
  EXPECT_TRUE(ChildPids(999999999).empty());
}

}  // namespace
}  // namespace gpuha::common
