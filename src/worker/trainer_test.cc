// The checkpoint directory's epoch fence and the deterministic trainer on a
// real directory: a resumed run ends exactly as an uninterrupted one, a torn
// checkpoint is skipped for the one before it, a stop checkpoints the step
// reached, and a writer of an older epoch is refused once a later one claims.
#include "worker/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "common/file_util.h"
#include "common/testing/temp_dir.h"
#include "worker/checkpoint.h"

namespace gpuha::worker {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::string Dir(const std::string& name) { return (gpuha::testing::TestTempDir() / name).string(); }

TrainOptions Options(const std::string& dir, uint64_t epoch, uint64_t steps) {
  TrainOptions o;
  o.checkpoint_dir = dir;
  o.epoch = epoch;
  o.steps = steps;
  o.checkpoint_every = 10;
  o.step_time = milliseconds(0);
  return o;
}

// What an uninterrupted run of `steps` ends in, computed here step by step.
std::string Expected(uint64_t steps) { return absl::BytesToHexString(TrainStateAfter(steps)); }

TEST(TrainerTest, AResumedRunEndsExactlyAsAnUninterruptedOne) {
  auto whole = Train(Options(Dir("whole"), 1, 95), nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->done);
  EXPECT_EQ(whole->state, Expected(95));
  EXPECT_EQ(whole->checkpoints, 10u);  // 10, 20 ... 90, and 95 at the end

  // Stopped at step 37, between checkpoints (a drain): the step reached is
  // checkpointed too.
  std::atomic<bool> stop{false};
  TrainOptions first = Options(Dir("moved"), 1, 95);
  auto stopped = Train(first, &stop, [&](uint64_t step, bool) {
    if (step == 37) stop = true;
  });
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_FALSE(stopped->done);
  EXPECT_EQ(stopped->step, 37u);
  EXPECT_EQ(stopped->checkpoints, 4u);  // 10, 20, 30, and 37 on the stop
  // The next placement (epoch 2) resumes there and loses no step.
  auto resumed = Train(Options(Dir("moved"), 2, 95), nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from, 37u);
  EXPECT_TRUE(resumed->done);
  EXPECT_EQ(resumed->state, whole->state);
}

TEST(TrainerTest, ATornCheckpointIsSkippedForThePreviousOne) {
  const std::string dir = Dir("torn");
  auto d = CheckpointDir::Open(dir);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->Claim(1).ok());
  ASSERT_TRUE(Train(Options(dir, 1, 20), nullptr).ok());  // checkpoints at 10 and 20
  // Storage tore step 30 (its state cut short), and a crash left a write
  // unfinished at 40.
  std::string good = *common::ReadFile(dir + "/ckpt-00000000000000000020");
  std::ofstream(dir + "/ckpt-00000000000000000030")
      << "gpuha-ckpt 1 epoch=1 step=30 bytes=32 sha256=00\nshort";
  std::ofstream(dir + "/ckpt-00000000000000000040.tmp") << good.substr(0, 10);
  std::vector<std::string> skipped;
  auto latest = d->Latest(&skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->step, 20u);
  // (Torn files at later steps do not count toward the three kept, so the
  // checkpoints written next are not pruned as soon as they land.)
  EXPECT_THAT(skipped, ::testing::UnorderedElementsAre(
                           HasSubstr("40.tmp: an unfinished write"),
                           HasSubstr("00030: 5 byte(s) of state, the header says 32 (torn)")));
  // A resumed run starts from 20 and still ends exactly.
  auto resumed = Train(Options(dir, 2, 50), nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from, 20u);
  EXPECT_EQ(resumed->state, Expected(50));
  // Its claim removed the unfinished write no writer would finish.
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt-00000000000000000040.tmp"));
}

TEST(TrainerTest, AWriterOfAnOlderEpochIsRefusedOnceALaterOneClaims) {
  const std::string dir = Dir("fenced");
  auto d = CheckpointDir::Open(dir);
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(std::string(d->Write(1, 10, "x").message()), HasSubstr("claim it first"));
  ASSERT_TRUE(d->Claim(1).ok());
  ASSERT_TRUE(d->Write(1, 10, "state-10").ok());
  ASSERT_TRUE(d->Claim(2).ok());  // the job moved
  absl::Status refused = d->Write(1, 20, "state-20");
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("epoch 1 is refused: the directory is claimed by epoch 2 (the job moved"));
  absl::Status back = d->Claim(1);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(back.message()), HasSubstr("claimed by epoch 2, later than 1"));
  EXPECT_EQ(*d->FenceEpoch(), 2u);
  auto latest = d->Latest();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->step, 10u);
  EXPECT_EQ((*latest)->state, "state-10");
}

// A partitioned old owner keeps running while the job moves: from the
// claim on, none of its checkpoints lands, it stops by itself, and the new
// owner's run ends exactly.
TEST(TrainerTest, APartitionedOldOwnerStopsAtItsFirstRefusedWrite) {
  const std::string dir = Dir("partition");
  TrainOptions old = Options(dir, 1, 1000000);
  old.checkpoint_every = 5;
  old.step_time = milliseconds(1);
  std::atomic<uint64_t> old_checkpoints{0};
  absl::StatusOr<TrainResult> old_result;
  std::atomic<bool> old_ended{false};
  std::atomic<bool> give_up{false};  // only if an assertion below fails
  std::thread old_owner([&] {
    old_result = Train(old, &give_up, [&](uint64_t, bool checkpointed) {
      if (checkpointed) old_checkpoints++;
    });
    old_ended = true;
  });
  absl::Cleanup join = [&] {
    give_up = true;
    if (old_owner.joinable()) old_owner.join();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (old_checkpoints < 3 && !old_ended && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(!old_ended && old_checkpoints >= 3)
      << "the old owner never checkpointed: " << old_result.status();
  auto d = CheckpointDir::Open(dir);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->Claim(2).ok());
  const std::vector<Checkpoint> at_claim = *d->List();
  old_owner.join();
  ASSERT_FALSE(old_result.ok());
  EXPECT_EQ(old_result.status().code(), absl::StatusCode::kAborted) << old_result.status();
  const std::vector<Checkpoint> after = *d->List();
  ASSERT_EQ(after.size(), at_claim.size()) << "a fenced writer's checkpoint landed";
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].step, at_claim[i].step) << "a fenced writer's checkpoint landed";
    EXPECT_EQ(after[i].epoch, 1u);
  }
  // However far the old owner got before the claim, the new one goes on.
  ASSERT_FALSE(at_claim.empty());
  const uint64_t end = at_claim.back().step + 100;
  auto resumed = Train(Options(dir, 2, end), nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state, Expected(end));
  EXPECT_EQ(d->List()->back().epoch, 2u);
}

TEST(TrainerTest, BadInputNamesTheFieldOrTheByte) {
  EXPECT_THAT(std::string(Train(Options(Dir("a"), 0, 10), nullptr).status().message()),
              HasSubstr("--epoch: must be at least 1"));
  EXPECT_THAT(std::string(Train(Options(Dir("a"), 1, 0), nullptr).status().message()),
              HasSubstr("--steps"));
  TrainOptions o = Options(Dir("a"), 1, 10);
  o.checkpoint_every = 0;
  EXPECT_THAT(std::string(Train(o, nullptr).status().message()), HasSubstr("--checkpoint-every"));
  const std::string file = Dir("plain");
  std::ofstream(file) << "x";
  EXPECT_THAT(std::string(CheckpointDir::Open(file).status().message()),
              HasSubstr("not a directory"));
  const std::string dir = Dir("badfence");
  ASSERT_TRUE(CheckpointDir::Open(dir).ok());
  std::ofstream(dir + "/FENCE") << "12x\n";
  auto status = Train(Options(dir, 13, 10), nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("FENCE: byte 2 ('x') is not a digit"));
  // Another job's directory: its checkpoint is past this job's steps.
  const std::string other = Dir("other");
  ASSERT_TRUE(Train(Options(other, 1, 30), nullptr).ok());
  status = Train(Options(other, 2, 20), nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("step 30, past this job's 20 steps"));
  // A later epoch already holds the directory: this placement never starts.
  const std::string taken = Dir("taken");
  ASSERT_TRUE(CheckpointDir::Open(taken)->Claim(5).ok());
  status = Train(Options(taken, 4, 10), nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(
          ParseCheckpoint("f", "gpuha-ckpt 1 epoch=1 step=2 bytes=1 md5=x\nz").status().message()),
      HasSubstr("header field 6 is not sha256=HEX"));
}

}  // namespace
}  // namespace gpuha::worker
