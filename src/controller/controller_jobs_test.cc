// Stateful jobs: a job moves only once its old placement is fenced.
// On a fake clock, a memory store, fake agent sinks and a fake fence hook:
// no sockets, no sleeps (controller/testing/controller_fixture.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "common/testing/temp_dir.h"
#include "controller/controller.h"
#include "controller/state_codec.h"
#include "controller/testing/controller_fixture.h"

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

class JobControllerTest : public ControllerTest {
 protected:
  // Every node's agent says it has one GPU (jobs need one).
  void StartWithGpus(ControllerConfig config = ThreePlusOne()) {
    Start(config);
    for (const NodeConfig& n : config.nodes) {
      sinks_[n.spec.id] = std::make_shared<FakeSink>();
      v1::Hello hello;
      hello.set_node(n.spec.id);
      hello.add_gpus()->set_index(0);
      ASSERT_TRUE(c_->AgentConnected(hello, sinks_[n.spec.id], /*proven=*/true).ok());
      Beat(n.spec.id);
    }
  }
  JobSpec Spec() {
    return {.id = "train-1",
            .command = {"trainer", "--dir", "{checkpoint_dir}", "--epoch", "{epoch}"},
            .gpus = 1,
            .checkpoint_dir = "/mnt/san/train-1",
            .checkpoint_every = 50};
  }
  // The StartJob messages sent to `node`.
  std::vector<v1::StartJob> Starts(const std::string& node) {
    std::vector<v1::StartJob> out;
    for (const auto& m : sinks_[node]->sent) {
      if (m.has_start_job()) out.push_back(m.start_job());
    }
    return out;
  }
  // The node's agent reports the job.
  void Report(const std::string& node, uint64_t job_epoch, bool running, bool fenced,
              uint64_t step = 0) {
    v1::Heartbeat hb;
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.set_fenced(fenced);
    hb.mutable_server()->set_running(!fenced);
    hb.mutable_server()->set_ready(!fenced);
    v1::JobStatus* j = hb.add_jobs();
    j->set_job("train-1");
    j->set_job_epoch(job_epoch);
    j->set_running(running);
    j->set_step(step);
    j->set_checkpoint_step(step / 50 * 50);
    j->set_resumed_from(step / 50 * 50);  // (as if it had just started)
    c_->AgentHeartbeat(node, hb);
  }
  nlohmann::json Job() { return *c_->JobJson("train-1"); }
};

TEST_F(JobControllerTest, AJobMovesOnlyOnceItsAgentConfirmsTheFence) {
  StartWithGpus();
  auto added = c_->AddJob(Spec());
  ASSERT_TRUE(added.ok()) << added.status();
  const std::string first = (*added)["node"];
  ASSERT_EQ(first.substr(0, 1), "a") << "active nodes take jobs first";
  ASSERT_EQ(Starts(first).size(), 1u);
  const v1::StartJob start = Starts(first)[0];
  EXPECT_EQ(start.argv(2), "/mnt/san/train-1");
  EXPECT_EQ(start.argv(4), std::to_string(start.job_epoch()));
  Report(first, start.job_epoch(), /*running=*/true, /*fenced=*/false, 120);
  EXPECT_EQ(Job()["phase"], "running");
  // The node fails: the job waits for the fence, and nothing starts it.
  Beat(first, v1::NODE_HEALTH_FAILED);
  EXPECT_EQ(Job()["phase"], "fencing");
  Report(first, start.job_epoch(), /*running=*/true, /*fenced=*/true, 130);
  EXPECT_EQ(Job()["phase"], "fencing") << "fenced, but its job still runs";
  EXPECT_TRUE(Starts("p1").empty());
  // The agent stopped it: the passive that took the node's place runs it.
  Report(first, start.job_epoch(), /*running=*/false, /*fenced=*/true, 130);
  const nlohmann::json moved = Job();
  EXPECT_EQ(moved["phase"], "starting");
  EXPECT_EQ(moved["node"], "p1");
  ASSERT_EQ(Starts("p1").size(), 1u);
  EXPECT_GT(Starts("p1")[0].job_epoch(), start.job_epoch());
  EXPECT_EQ(moved["last_takeover"]["from"], first);
  EXPECT_EQ(moved["last_takeover"]["last_step"], 130);
  EXPECT_EQ(c_->counters().job_takeovers, 1u);
  Report("p1", Starts("p1")[0].job_epoch(), /*running=*/true, /*fenced=*/false, 101);
  EXPECT_EQ(Job()["phase"], "running");
  EXPECT_EQ(Job()["last_takeover"]["resumed_from"], 100);
}

TEST_F(JobControllerTest, AJobWhoseNodeCannotBeFencedIsBlockedUntilAnOperatorConfirms) {
  StartWithGpus();  // no fence hook
  auto added = c_->AddJob(Spec());
  ASSERT_TRUE(added.ok());
  const std::string first = (*added)["node"];
  Report(first, Starts(first)[0].job_epoch(), true, false);
  c_->AgentDisconnected(first, sinks_[first].get());
  std::vector<std::string> alive;
  for (const std::string n : {"a1", "a2", "a3", "p1"}) {
    if (n != first) alive.push_back(n);
  }
  Run(milliseconds(3000), alive);
  const nlohmann::json blocked = Job();
  EXPECT_EQ(blocked["phase"], "blocked");
  EXPECT_THAT(blocked["why"].get<std::string>(), HasSubstr("no fence hook"));
  EXPECT_EQ(c_->counters().jobs_blocked, 1u);
  EXPECT_TRUE(Starts("p1").empty());
  EXPECT_THAT(c_->MetricsText(), HasSubstr("gpuha_controller_jobs{phase=\"blocked\"} 1"));
  auto confirmed = c_->ConfirmJobFence("train-1");
  ASSERT_TRUE(confirmed.ok()) << confirmed.status();
  EXPECT_EQ((*confirmed)["phase"], "starting");
  EXPECT_NE((*confirmed)["node"], first);
  EXPECT_EQ(c_->ConfirmJobFence("train-1").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobControllerTest, AnAgentThatDoesNotConfirmIsFencedByTheHookAfterTheTimeout) {
  ControllerConfig config = ThreePlusOne();
  config.fence_hook = "power-off {node}";
  config.fence_timeout = milliseconds(500);
  StartWithGpus(config);
  auto added = c_->AddJob(Spec());
  ASSERT_TRUE(added.ok());
  const std::string first = (*added)["node"];
  Report(first, Starts(first)[0].job_epoch(), true, false);
  Beat(first, v1::NODE_HEALTH_FAILED);  // its agent is told to fence, and never confirms
  EXPECT_EQ(Job()["phase"], "fencing");
  clock_.Advance(milliseconds(600));
  c_->Tick();
  for (int i = 0; i < 200 && Job()["phase"] == "fencing"; ++i) {
    std::this_thread::sleep_for(milliseconds(5));  // the hook runs on its own thread
  }
  EXPECT_EQ(Job()["phase"], "starting");
  std::lock_guard<std::mutex> lock(fencer_.mu);
  EXPECT_EQ(fencer_.commands, std::vector<std::string>{"power-off " + first});
}

TEST_F(JobControllerTest, ADrainWithNowhereForTheJobIsRefusedAndBadJobsNameTheField) {
  ControllerConfig config = ThreePlusOne();
  StartWithGpus(config);
  JobSpec big = Spec();
  big.gpus = 2;  // no node has two GPUs
  auto pending = c_->AddJob(big);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ((*pending)["phase"], "pending");
  EXPECT_EQ(c_->AddJob(Spec()).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(c_->RemoveJob("train-1").ok());
  ASSERT_TRUE(c_->AddJob(Spec()).ok());
  for (const std::string n : {"a1", "a2", "a3", "p1"}) {
    if (n != Job()["node"]) {
      ASSERT_TRUE(c_->Drain(n, /*force=*/true).ok());
    }
  }
  absl::Status s = c_->Drain(Job()["node"], /*force=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job train-1"));
  auto bad = ParseJobSpec(nlohmann::json{{"id", "j"}, {"command", {"x"}}, {"checkpoint_dir", "x"}});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("checkpoint_dir"));
  // Adversarial finding: "/" and a folder inside another job's were taken.
  JobSpec root = Spec();
  root.id = "root";
  for (const char* dir : {"/", "/.", "/mnt/.."}) {
    root.checkpoint_dir = dir;
    auto r = c_->AddJob(root);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << dir;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("is the root")) << dir;
  }
  for (const char* dir : {"/mnt/san/train-1/inner", "/mnt/san", "/mnt/san/train-1/"}) {
    root.checkpoint_dir = dir;
    auto r = c_->AddJob(root);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << dir;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("job train-1 already writes to"))
        << dir;
  }
  root.checkpoint_dir = "/mnt/san/train-10";  // a sibling whose name begins the same
  EXPECT_TRUE(c_->AddJob(root).ok());
}

TEST_F(JobControllerTest, AStoppedPlacementConfirmsAndEpochsOnlyGrow) {
  StartWithGpus();
  auto added = c_->AddJob(Spec());
  ASSERT_TRUE(added.ok());
  const std::string first = (*added)["node"];
  const uint64_t e1 = Starts(first)[0].job_epoch();
  Report(first, e1, true, false);
  Beat(first, v1::NODE_HEALTH_FAILED);
  // Fencing: it cannot be removed (and added again beside a live writer).
  EXPECT_EQ(c_->RemoveJob("train-1").code(), absl::StatusCode::kFailedPrecondition);
  // Its agent stopped it (the node may even have rejoined since).
  v1::Heartbeat hb;
  hb.set_health(v1::NODE_HEALTH_HEALTHY);
  hb.set_epoch(c_->epoch());
  v1::JobStatus* st = hb.add_jobs();
  st->set_job("train-1");
  st->set_job_epoch(e1);
  st->set_stopped(true);
  c_->AgentHeartbeat(first, hb);
  EXPECT_EQ(Job()["phase"], "starting");
  const std::string second = Job()["node"];
  const uint64_t e2 = Job()["job_epoch"];
  EXPECT_GT(e2, e1);
  // Removed and added again: a higher epoch still, whatever the cluster epoch.
  ASSERT_TRUE(c_->RemoveJob("train-1").ok());
  auto again = c_->AddJob(Spec());
  ASSERT_TRUE(again.ok());
  EXPECT_GT((*again)["job_epoch"].get<uint64_t>(), e2);
  // Refused by its storage (a later placement holds the directory): blocked.
  const std::string third = (*again)["node"];
  Report(third, (*again)["job_epoch"], true, false);
  v1::Heartbeat refused;
  refused.set_health(v1::NODE_HEALTH_HEALTHY);
  refused.set_epoch(c_->epoch());
  v1::JobStatus* r = refused.add_jobs();
  r->set_job("train-1");
  r->set_job_epoch((*again)["job_epoch"]);
  r->set_last_exit("exit 4");
  c_->AgentHeartbeat(third, refused);
  EXPECT_EQ(Job()["phase"], "blocked");
  EXPECT_THAT(Job()["why"].get<std::string>(), HasSubstr("later placement"));
  // A job its node runs that is placed nowhere there is stopped.
  size_t stops = 0;
  Report(second, e2, /*running=*/true, /*fenced=*/false);
  for (const auto& m : sinks_[second]->sent) stops += m.has_stop_job();
  EXPECT_GE(stops, 1u);
}

TEST_F(JobControllerTest, JobsComeBackFromTheStore) {
  JobRecord r;
  r.spec = Spec();
  r.phase = JobPhase::kFencing;
  r.node = "a2";
  r.job_epoch = 7;
  JobTakeover t;
  t.from = "a2";
  t.fault_ms = 5;
  t.last_step = 40;
  r.last = t;
  auto back = DecodeJob("train-1", EncodeJob(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(JobJson(*back), JobJson(r));
  EXPECT_FALSE(DecodeJob("other", EncodeJob(r)).ok()) << "a row under another job's key";
  EXPECT_THAT(std::string(DecodeJob("train-1", "{}").status().message()), HasSubstr("train-1"));
  auto store = std::make_unique<MemoryStore>();
  ASSERT_TRUE(store->Apply({{"job", "train-1", EncodeJob(r)}}).ok());
  Start(ThreePlusOne(), std::move(store));
  EXPECT_EQ(Job()["phase"], "fencing");
  EXPECT_EQ(Job()["job_epoch"], 7);
  EXPECT_EQ(Job()["last_takeover"]["last_step"], 40);
}

}  // namespace
}  // namespace gpuha::controller
