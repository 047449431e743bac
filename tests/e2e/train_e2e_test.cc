// `gpuha worker --train` as real processes on one shared directory (what a
// SAN or NFS mount is to several nodes): a kill -9 mid-run and a takeover by
// the next epoch end exactly where an uninterrupted run ends; SIGTERM (a
// planned move) checkpoints the step reached, so no step is lost; and an old
// owner that keeps running (a partitioned node) is fenced by the new owner's
// claim and stops, its writes refused, while the new owner's state is exact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/run_command.h"

namespace gpuha::e2e {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::string Dir(const std::string& name) { return (gpuha::testing::TestTempDir() / name).string(); }

std::vector<std::string> Argv(const std::string& dir, int epoch, int steps, int step_ms) {
  return {GPUHA_BINARY,           "worker",  "--train",
          "--checkpoint-dir",     dir,       "--epoch",
          std::to_string(epoch),  "--steps", std::to_string(steps),
          "--checkpoint-every",   "20",      "--step-ms",
          std::to_string(step_ms)};
}

// Runs a job to its end; its JSON result line.
nlohmann::json RunToEnd(const std::string& dir, int epoch, int steps) {
  std::string cmd;
  for (const std::string& a : Argv(dir, epoch, steps, 0)) cmd += a + " ";
  CommandResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.out << r.err;
  return j;
}

// Waits until the job's log shows a checkpoint at `step` or later.
bool CheckpointedPast(ChildProcess& p, int step) {
  for (int i = 0; i < 1000; ++i) {
    const std::string err = p.err();
    for (size_t at = err.find("checkpoint at step "); at != std::string::npos;
         at = err.find("checkpoint at step ", at + 1)) {
      if (std::atoi(err.c_str() + at + 19) >= step) return true;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

TEST(TrainE2eTest, AKilledJobTakenOverByTheNextEpochEndsExactly) {
  const nlohmann::json whole = RunToEnd(Dir("whole"), 1, 300);
  ASSERT_EQ(whole.value("done", false), true);

  ChildProcess first(Argv(Dir("job"), 1, 300, 10));  // 3 s to its end
  ASSERT_TRUE(CheckpointedPast(first, 60)) << first.err();
  first.Signal(SIGKILL);
  ASSERT_TRUE(first.Wait(milliseconds(5000)).has_value());
  const nlohmann::json taken = RunToEnd(Dir("job"), 2, 300);
  EXPECT_GE(taken.value("resumed_from", 0), 60);
  EXPECT_LT(taken.value("resumed_from", 0), 300);
  EXPECT_EQ(taken.value("done", false), true);
  EXPECT_EQ(taken.value("state", "a"), whole.value("state", "b"));
}

TEST(TrainE2eTest, ASigtermCheckpointsTheStepReachedAndLosesNone) {
  ChildProcess first(Argv(Dir("job"), 1, 1000000, 2));
  ASSERT_TRUE(CheckpointedPast(first, 20)) << first.err();
  first.Signal(SIGTERM);
  std::optional<std::string> line = first.WaitForLine("{\"done\":", milliseconds(10000));
  ASSERT_TRUE(line.has_value()) << first.err();
  // Not done: its own exit code, so whoever supervises it resumes it.
  ASSERT_EQ(first.Wait(milliseconds(5000)), 5) << first.err();
  const nlohmann::json stopped = nlohmann::json::parse("{\"done\":" + *line, nullptr, false);
  ASSERT_TRUE(stopped.is_object()) << first.out();
  EXPECT_EQ(stopped.value("done", true), false);
  const int reached = stopped.value("step", 0);
  ASSERT_GE(reached, 20);
  const nlohmann::json moved = RunToEnd(Dir("job"), 2, reached + 50);
  EXPECT_EQ(moved.value("resumed_from", -1), reached) << "steps were lost in the move";
  EXPECT_EQ(moved.value("state", "a"), RunToEnd(Dir("whole"), 1, reached + 50).value("state", "b"));
}

TEST(TrainE2eTest, AnOldOwnerThatKeepsRunningIsFencedByTheNewOne) {
  // The same job (400 steps), slower than the new owner by far.
  ChildProcess old_owner(Argv(Dir("job"), 1, 400, 10));
  ASSERT_TRUE(CheckpointedPast(old_owner, 40)) << old_owner.err();
  // The job moves while the old node still runs it (a partition).
  const nlohmann::json moved = RunToEnd(Dir("job"), 2, 400);
  EXPECT_EQ(moved.value("state", "a"), RunToEnd(Dir("whole"), 1, 400).value("state", "b"));
  // The old owner's next checkpoint is refused, and it stops by itself.
  std::optional<int> code = old_owner.Wait(milliseconds(10000));
  ASSERT_TRUE(code.has_value()) << "the fenced owner kept running";
  EXPECT_EQ(*code, 4) << "fenced: its own exit code, so it is not restarted";
  EXPECT_THAT(old_owner.err(), HasSubstr("the job moved; this writer is fenced"));
  // Nothing of it landed after the move: the newest checkpoint is epoch 2's.
  const nlohmann::json again = RunToEnd(Dir("job"), 3, 400);
  EXPECT_EQ(again.value("resumed_from", 0), 400);
  EXPECT_EQ(again.value("state", "a"), moved.value("state", "b"));
}

TEST(TrainE2eTest, BadFlagsNameTheFlag) {
  CommandResult r = RunCommand(absl::StrCat(GPUHA_BINARY, " worker --train --steps 10"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--checkpoint-dir: required with --train"));
  r = RunCommand(absl::StrCat(GPUHA_BINARY, " worker --epoch 3"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--epoch: only with --train"));
  r = RunCommand(
      absl::StrCat(GPUHA_BINARY, " worker --train --checkpoint-dir ", Dir("x"), " --steps 0"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--steps"));
}

}  // namespace
}  // namespace gpuha::e2e
