// Stateful jobs through the whole cluster, as real processes on loopback
// (LocalCluster: controller, agents, `gpuha worker --train` as the job, a
// directory as the shared storage): a crashed node's job restarts on another
// node only after the fence is confirmed, from its last complete checkpoint
// (a torn one is skipped), and ends in exactly the state of a run never
// interrupted; a fence hook that fails blocks the restart with an alert
// until an operator confirms; a drain checkpoints first and loses no step;
// an old node that keeps running (its agent frozen, cut off) is fenced by
// the storage, its writes refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "cluster/local_cluster.h"
#include "common/file_util.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/run_command.h"
#include "worker/checkpoint.h"
#include "worker/trainer.h"

namespace gpuha::e2e {
namespace {

using cluster::LocalCluster;
using cluster::LocalClusterOptions;
using json = nlohmann::json;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr int kSteps = 300;
constexpr int kEvery = 20;

class JobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    if (cluster_) cluster_->Stop();
    LocalCluster::Reap();
  }

  // Three nodes (two active, one passive), one sim GPU each.
  void StartCluster(const std::string& hook, int fence_timeout_ms = 5000) {
    ckpt_ = (gpuha::testing::TestTempDir() / "san" / "train-1").string();
    std::filesystem::create_directories(gpuha::testing::TestTempDir() / "cluster");
    std::filesystem::create_directories(gpuha::testing::TestTempDir() / "san");  // the mount
    cluster_ =
        std::make_unique<LocalCluster>(LocalClusterOptions{.exe = GPUHA_BINARY,
                                                           .nodes = 3,
                                                           .fence_hook = hook,
                                                           .fence_timeout_ms = fence_timeout_ms},
                                       (gpuha::testing::TestTempDir() / "cluster").string());
    absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
    ASSERT_TRUE(cluster_->WaitGraceOver(milliseconds(15000)));
    ASSERT_TRUE(cluster_->WaitFor(
        [&] {
          auto nodes = cluster_->Api("GET", "/api/v1/nodes");
          if (!nodes.ok()) return false;
          for (const json& n : *nodes) {
            if (!n.value("connected", false) || n.value("state", "") != "alive") return false;
          }
          return true;
        },
        milliseconds(20000)));
  }

  json AddJob(int step_ms) {
    json body = {
        {"id", "train-1"},
        {"command",
         {GPUHA_BINARY, "worker", "--train", "--checkpoint-dir", "{checkpoint_dir}", "--epoch",
          "{epoch}", "--steps", std::to_string(kSteps), "--checkpoint-every", "{checkpoint_every}",
          "--step-ms", std::to_string(step_ms), "--progress-file", "{progress_file}"}},
        {"gpus", 1},
        {"checkpoint_dir", ckpt_},
        {"checkpoint_every", kEvery}};
    auto j = cluster_->Api("POST", "/api/v1/jobs", body.dump());
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : json();
  }

  json Job() {
    auto j = cluster_->Api("GET", "/api/v1/jobs/train-1");
    return j.ok() ? *j : json::object();
  }

  bool WaitJob(const std::function<bool(const json&)>& done, milliseconds timeout) {
    return cluster_->WaitFor([&] { return done(Job()); }, timeout);
  }
  bool WaitPhase(const std::string& phase, milliseconds timeout) {
    return WaitJob([&](const json& j) { return j.value("phase", "") == phase; }, timeout);
  }

  uint64_t ProgressOf(const std::string& node, uint64_t epoch) {
    return cluster_->JobProgress(*cluster_->FindNode(node), "train-1", epoch);
  }

  // The job ended where an uninterrupted run ends.
  void ExpectExactEnd() {
    auto dir = worker::CheckpointDir::Open(ckpt_);
    ASSERT_TRUE(dir.ok());
    auto latest = dir->Latest();
    ASSERT_TRUE(latest.ok() && latest->has_value());
    EXPECT_EQ((*latest)->step, static_cast<uint64_t>(kSteps));
    EXPECT_EQ((*latest)->state, worker::TrainStateAfter(kSteps));
  }

  std::vector<std::string> EventTypes() {
    std::vector<std::string> out;
    auto ev = cluster_->Api("GET", "/api/v1/events");
    if (ev.ok()) {
      for (const json& e : *ev) out.push_back(e.value("type", ""));
    }
    return out;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::string ckpt_;
};

TEST_F(JobTest, ANodeCrashRestartsTheJobElsewhereAfterTheFenceAndItEndsExactly) {
  // The hook stands in for a BMC power-off; it takes 300 ms, in which the
  // storage shows what a node killed mid-checkpoint leaves.
  StartCluster("sleep 0.3");
  const json added = AddJob(10);  // 3 s of steps in all
  ASSERT_EQ(added.value("phase", ""), "starting") << added.dump();
  const std::string first = added.value("node", "");
  ASSERT_TRUE(WaitJob([](const json& j) { return j.value("checkpoint_step", 0) >= 3 * kEvery; },
                      milliseconds(20000)))
      << Job().dump();
  const uint64_t epoch1 = Job().value("job_epoch", uint64_t{0});
  cluster_->KillNode(*cluster_->FindNode(first));
  const uint64_t reached = ProgressOf(first, epoch1);
  // A checkpoint torn by the crash: named as complete, its bytes cut short.
  // It must be skipped and the one before it used.
  const std::string torn = absl::StrCat(ckpt_, "/ckpt-", std::string(17, '0'), "999");
  ASSERT_TRUE(
      common::WriteFileAtomic(torn, "gpuha-ckpt 1 epoch=1 step=999 bytes=32 sha256=ab").ok());
  ASSERT_TRUE(WaitPhase("done", milliseconds(30000))) << Job().dump();
  ExpectExactEnd();
  const json job = Job();
  ASSERT_TRUE(job.contains("last_takeover")) << job.dump();
  const json& t = job["last_takeover"];
  EXPECT_EQ(t.value("from", ""), first);
  EXPECT_NE(t.value("to", ""), first);
  EXPECT_EQ(t.value("planned", true), false);
  // Pacemaker's order: fenced, then started elsewhere, then running.
  EXPECT_GT(t.value("fenced_unix_ms", 0.0), 0);
  EXPECT_GE(t.value("fenced_unix_ms", 0.0), t.value("fault_unix_ms", 0.0));
  EXPECT_GE(t.value("started_unix_ms", 0.0), t.value("fenced_unix_ms", 0.0));
  EXPECT_GE(t.value("running_unix_ms", 0.0), t.value("started_unix_ms", 0.0));
  // Steps lost: at most one checkpoint interval. The crashed run reached
  // at least the step of its last checkpoint: it writes its progress file
  // after each checkpoint, so a crash between the two leaves the file one
  // step behind (read once as "reached 99" beside checkpoint 100, an
  // unsigned -1; the demo's own measure had the same fault, 089fae2).
  const uint64_t resumed = t.value("resumed_from", uint64_t{0});
  EXPECT_GE(resumed, static_cast<uint64_t>(3 * kEvery));
  EXPECT_LE(std::max(reached, resumed) - resumed, static_cast<uint64_t>(kEvery))
      << "reached " << reached;
  EXPECT_EQ(job.value("takeovers", 0), 1);
  EXPECT_GT(job.value("job_epoch", uint64_t{0}), epoch1);
  std::vector<std::string> types = EventTypes();
  auto at = [&](const std::string& type) {
    return std::find(types.begin(), types.end(), type) - types.begin();
  };
  EXPECT_LT(at("job_fence_confirmed"), static_cast<long>(types.size()));
  EXPECT_LT(at("job_fencing"), at("job_fence_confirmed"));
}

TEST_F(JobTest, AFenceHookThatFailsBlocksTheRestartWithAnAlertUntilAnOperatorConfirms) {
  StartCluster("exit 3");
  const json added = AddJob(10);
  const std::string first = added.value("node", "");
  ASSERT_TRUE(WaitJob([](const json& j) { return j.value("checkpoint_step", 0) >= kEvery; },
                      milliseconds(20000)));
  cluster_->KillNode(*cluster_->FindNode(first));
  ASSERT_TRUE(WaitPhase("blocked", milliseconds(20000))) << Job().dump();
  const json blocked = Job();
  EXPECT_THAT(blocked.value("why", ""), HasSubstr("fence hook failed"));
  EXPECT_THAT(blocked.value("why", ""), HasSubstr("confirm-fenced train-1"));
  // Nothing starts it meanwhile.
  ASSERT_TRUE(cluster_->Sleep(milliseconds(1500)));
  EXPECT_EQ(Job().value("phase", ""), "blocked");
  EXPECT_EQ(Job().value("node", ""), first);
  EXPECT_EQ(Job().value("takeovers", -1), 0);
  auto metrics =
      RunCommand(absl::StrCat("curl -s http://127.0.0.1:", cluster_->api_port(), "/metrics"));
  EXPECT_THAT(metrics.out, HasSubstr("gpuha_controller_jobs{phase=\"blocked\"} 1"));
  EXPECT_THAT(metrics.out, HasSubstr("gpuha_controller_jobs_blocked_total 1"));
  std::vector<std::string> types = EventTypes();
  EXPECT_NE(std::find(types.begin(), types.end(), "job_blocked"), types.end());
  // The operator confirms the node is off: it restarts, and ends exactly.
  CommandResult ok = RunCommand(absl::StrCat(GPUHA_BINARY, " ctl --controller http://127.0.0.1:",
                                             cluster_->api_port(), " confirm-fenced train-1"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  ASSERT_TRUE(WaitPhase("done", milliseconds(30000))) << Job().dump();
  ExpectExactEnd();
  // A second confirm has nothing to confirm, and says why.
  CommandResult again = RunCommand(absl::StrCat(GPUHA_BINARY, " ctl --controller http://127.0.0.1:",
                                                cluster_->api_port(), " confirm-fenced train-1"));
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.err, HasSubstr("is done"));
}

TEST_F(JobTest, ADrainCheckpointsFirstAndLosesNoStep) {
  StartCluster("");
  const json added = AddJob(10);
  const std::string first = added.value("node", "");
  ASSERT_TRUE(WaitJob([](const json& j) { return j.value("checkpoint_step", 0) >= kEvery; },
                      milliseconds(20000)));
  const uint64_t epoch1 = Job().value("job_epoch", uint64_t{0});
  auto drained = cluster_->Api("POST", absl::StrCat("/api/v1/nodes/", first, "/drain?force=true"));
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_TRUE(WaitPhase("done", milliseconds(30000))) << Job().dump();
  ExpectExactEnd();
  const json t = Job()["last_takeover"];
  EXPECT_EQ(t.value("planned", false), true);
  EXPECT_NE(t.value("to", ""), first);
  // The old placement checkpointed the step it reached; the new one
  // started there.
  const uint64_t reached = ProgressOf(first, epoch1);
  EXPECT_GT(reached, static_cast<uint64_t>(kEvery));
  EXPECT_EQ(t.value("resumed_from", uint64_t{0}), reached) << "steps were lost in the drain";
}

TEST_F(JobTest, AnOldNodeThatKeepsRunningIsFencedByTheStorage) {
  // The agent is frozen: it confirms nothing, its job runs on. After 1 s
  // the hook "fences" the node (a fabric fence that reports success while
  // the host still runs): the storage fence is what stops the old writer.
  StartCluster("true", /*fence_timeout_ms=*/1000);
  const json added = AddJob(20);  // 6 s of steps
  const std::string first = added.value("node", "");
  ASSERT_TRUE(WaitJob([](const json& j) { return j.value("checkpoint_step", 0) >= kEvery; },
                      milliseconds(20000)));
  const uint64_t epoch1 = Job().value("job_epoch", uint64_t{0});
  cluster::LocalNode* old_node = cluster_->FindNode(first);
  ASSERT_EQ(::kill(old_node->agent, SIGSTOP), 0);
  ASSERT_TRUE(WaitPhase("done", milliseconds(40000))) << Job().dump();
  ExpectExactEnd();
  // The old placement ran past the takeover, and none of its writes landed
  // after it: every checkpoint left is the new placement's.
  const uint64_t epoch2 = Job().value("job_epoch", uint64_t{0});
  EXPECT_GT(epoch2, epoch1);
  auto dir = worker::CheckpointDir::Open(ckpt_);
  ASSERT_TRUE(dir.ok());
  auto all = dir->List();
  ASSERT_TRUE(all.ok());
  for (const worker::Checkpoint& c : *all) EXPECT_EQ(c.epoch, epoch2) << "step " << c.step;
  // The old writer ran on past the point its successor resumed from, and
  // stopped at its first refused write (exit 4), which its agent sees once
  // it runs again.
  const uint64_t resumed = Job()["last_takeover"].value("resumed_from", uint64_t{0});
  EXPECT_GT(ProgressOf(first, epoch1), resumed);
  ::kill(old_node->agent, SIGCONT);
  EXPECT_TRUE(cluster_->WaitFor(
      [&] {
        auto log = common::ReadFile(absl::StrCat(cluster_->dir(), "/", first, ".log"));
        return log.ok() && log->find("the job moved; this writer is fenced") != std::string::npos &&
               log->find("(exit 4)") != std::string::npos;
      },
      milliseconds(10000)));
}

TEST_F(JobTest, APlannedAgentStopMovesTheJobWithoutTheHookAndLosesNoStep) {
  // A hook that fails: were it needed, the job would be blocked.
  StartCluster("exit 3");
  const json added = AddJob(10);
  const std::string first = added.value("node", "");
  ASSERT_TRUE(WaitJob([](const json& j) { return j.value("checkpoint_step", 0) >= kEvery; },
                      milliseconds(20000)));
  const uint64_t epoch1 = Job().value("job_epoch", uint64_t{0});
  cluster_->StopAgent(*cluster_->FindNode(first));  // SIGTERM: a DaemonSet upgrade
  ASSERT_TRUE(WaitPhase("done", milliseconds(30000))) << Job().dump();
  ExpectExactEnd();
  const json t = Job()["last_takeover"];
  EXPECT_EQ(t.value("planned", false), true);
  EXPECT_EQ(t.value("resumed_from", uint64_t{0}), ProgressOf(first, epoch1))
      << "steps were lost in the move";
  EXPECT_EQ(Job().value("takeovers", 0), 1);
}

TEST_F(JobTest, BadJobsAreRefusedNamingTheField) {
  StartCluster("");
  struct Case {
    std::string body, field;
  };
  const std::vector<Case> cases = {
      {R"({"id":"j","command":[],"checkpoint_dir":"/x"})", "command"},
      {R"({"id":"j","command":["a"],"checkpoint_dir":"rel/x"})", "checkpoint_dir"},
      {R"({"id":"j","command":["a"],"checkpoint_dir":"/x","gpus":0})", "gpus"},
      {R"({"id":"-j","command":["a"],"checkpoint_dir":"/x"})", "id"},
      {R"({"id":"j","command":["a",3],"checkpoint_dir":"/x"})", "command[1]"},
      {R"({"id":"j","command":["a"],"checkpoint_dir":"/x","colour":1})", "colour"},
      {R"({"id":"j","command":["a"],"checkpoint_dir":"/x","checkpoint_every":0})",
       "checkpoint_every"},
      {R"([1])", "body"},
  };
  for (const Case& c : cases) {
    auto r = cluster_->Api("POST", "/api/v1/jobs", c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.field)) << c.body;
  }
  EXPECT_EQ(cluster_->Api("GET", "/api/v1/jobs")->size(), 0u);
}

}  // namespace
}  // namespace gpuha::e2e
