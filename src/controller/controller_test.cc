// The controller's failover logic on a fake clock, a memory store, fake agent
// sinks and a fake fence hook: no sockets, no sleeps.
#include "controller/controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "common/testing/temp_dir.h"
#include "controller/state_codec.h"
#include "controller/testing/controller_fixture.h"

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

TEST_F(ControllerTest, StreamsGoToActivesWithThePassiveAsStandby) {
  Start();
  AddStreams(6);
  auto streams = c_->StreamsJson();
  ASSERT_EQ(streams.size(), 6u);
  for (const auto& s : streams) {
    EXPECT_EQ(s["standby"], "p1");
    EXPECT_NE(s["primary"], "p1");
  }
  v1::RouteSnapshot snap = c_->Snapshot();
  EXPECT_EQ(snap.routes_size(), 6);
  EXPECT_EQ(snap.routes(0).standby().address(), "127.0.0.1:8004");
}

TEST_F(ControllerTest, AdmissionPastNPlusOneIsRefusedWithTheArithmetic) {
  Start();
  AddStreams(30);
  auto refused = c_->AddStream({"one-too-many", "acme", 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("30 admitted + 1 > 30 survivable"));
  EXPECT_EQ(c_->AddStream({"x", "nobody", 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ControllerTest, HungAgentIsFencedAndItsStreamsMoveToThePassive) {
  Start();
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  uint64_t epoch = c_->epoch();
  uint64_t routes = c_->route_version();
  // a1 goes silent (SIGSTOP) while its stream stays open.
  Run(milliseconds(200), {"a2", "a3", "p1"});
  auto node = c_->NodeJson("a1");
  EXPECT_EQ((*node)["state"], "failed");
  EXPECT_GT(c_->epoch(), epoch);
  EXPECT_GT(c_->route_version(), routes);
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
  EXPECT_EQ((*c_->NodeJson("p1"))["role"], "active");
  std::vector<std::string> types = EventTypes("a1");
  EXPECT_THAT(types, ::testing::IsSupersetOf({"suspect", "fault_seen", "detected", "fenced",
                                              "streams_moved", "routes_pushed"}));
  EXPECT_LT(IndexOf("fenced"), IndexOf("streams_moved"));  // fence before moving (break)
  c_->RouterAck("r1", c_->route_version(), {});
  nlohmann::json failovers = c_->FailoversJson();
  ASSERT_EQ(failovers.size(), 1u);
  EXPECT_EQ(failovers[0]["node"], "a1");
  EXPECT_TRUE(failovers[0].contains("fault_to_detected_ms"));
  // Wall-clock milliseconds as doubles: exact to a microsecond or so.
  EXPECT_GE(failovers[0]["fault_to_detected_ms"].get<double>(), 150 - 1e-3);
  EXPECT_EQ(failovers[0]["detected_to_fenced_ms"], 0.0);
  EXPECT_TRUE(failovers[0].contains("detected_to_routers_acked_ms"));
}

TEST_F(ControllerTest, HangIsDetectedWithin200MsOfTheLastHeartbeat) {
  Start();
  Run(milliseconds(1000), {"a1", "a2", "a3", "p1"});
  common::TimePoint last = clock_.Now();  // a1's last heartbeat was at the last 50 ms mark
  milliseconds waited(0);
  while ((*c_->NodeJson("a1"))["state"] != "failed" && waited < milliseconds(1000)) {
    Run(milliseconds(10), {"a2", "a3", "p1"});
    waited += milliseconds(10);
  }
  EXPECT_LE(std::chrono::duration_cast<milliseconds>(clock_.Now() - last).count(), 200);
}

TEST_F(ControllerTest, AStalledControllerDoesNotBlameTheNodes) {
  Start();
  AddStreams(3);
  Run(milliseconds(600), {"a1", "a2", "a3", "p1"});
  clock_.Advance(milliseconds(400));  // the controller was starved: no tick, no heartbeat read
  c_->Tick();
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  for (const char* n : {"a1", "a2", "a3", "p1"})
    EXPECT_NE((*c_->NodeJson(n))["state"], "failed") << n;
  EXPECT_EQ(c_->counters().stalls, 1u);
  EXPECT_EQ(c_->counters().failovers, 0u);
  // Regression: the stall counter was counted but never shown in /metrics.
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_stalls_total 1\n"));
}

// Ticks on time, beats late: a loaded host (a chaos test beside a busy loop
// on two cores) read three of four nodes' heartbeats 152 to 168 ms apart and
// fenced all three. Silence most nodes share fences no one.
TEST_F(ControllerTest, SilenceMostNodesShareFencesNoOne) {
  Start();
  AddStreams(3);
  Run(milliseconds(600), {"a1", "a2", "a3", "p1"});
  Run(milliseconds(200), {"p1"});
  // Their beats are read again one by one, a tick apart: once a1's is, the
  // silence is no longer most nodes', and a2 and a3 still fail no one.
  Beat("a1");
  Run(milliseconds(10), {"p1"});
  Beat("a2");
  Run(milliseconds(10), {"p1"});
  Beat("a3");
  Run(milliseconds(200), {"a1", "a2", "a3", "p1"});
  for (const char* n : {"a1", "a2", "a3", "p1"})
    EXPECT_EQ((*c_->NodeJson(n))["state"], "alive") << n;
  EXPECT_EQ(c_->counters().failovers, 0u);
  EXPECT_EQ(c_->counters().stalls, 0u) << "the ticks came on time";
  EXPECT_EQ(c_->counters().silences_held, 3u);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("silence_held"));
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_silences_held_total 3\n"));
}

// A chaos run beside a busy loop: a node that had just taken a failed
// node's streams went unheard for 150 ms, was failed, and its streams had
// nowhere to go (the spare was out): 161 requests lost to a loaded host.
// Silence whose verdict would strand streams now waits for the ceiling; a
// node heard again meanwhile serves on, one unheard that long fails.
TEST_F(ControllerTest, ASilentNodeWhoseStreamsWouldHaveNowhereToGoIsHeldToTheCeiling) {
  Start();
  AddStreams(24);  // 8 units on each active node
  Run(milliseconds(600), {"a1", "a2", "a3", "p1"});
  Beat("p1", v1::NODE_HEALTH_FAILED);  // the spare is out: 2 + 2 units free
  Run(milliseconds(20), {"a1", "a2", "a3"});
  ASSERT_EQ((*c_->NodeJson("p1"))["state"], "failed");
  const uint64_t failovers = c_->counters().failovers;
  Run(milliseconds(300), {"a2", "a3"});  // a1 unheard past its threshold (150 ms)
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "suspect");
  EXPECT_EQ(c_->counters().failovers, failovers);
  EXPECT_THAT(EventDetails("a1"),
              ::testing::Contains(HasSubstr("held: failing it would leave 4 stream unit(s) with "
                                            "nowhere to go; it fails if unheard for 3000 ms")));
  Beat("a1");  // heard again: it serves on
  Run(milliseconds(200), {"a1", "a2", "a3"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
  EXPECT_EQ(c_->counters().failovers, failovers);
  // Unheard for the ceiling: failed, whatever it strands.
  Run(milliseconds(2900), {"a2", "a3"});
  EXPECT_NE((*c_->NodeJson("a1"))["state"], "failed");
  Run(milliseconds(200), {"a2", "a3"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_EQ(c_->counters().failovers, failovers + 1);
  EXPECT_THAT(EventDetails("a1"), ::testing::Contains(HasSubstr("held until unheard for 3000 ms")));
  EXPECT_GE(c_->counters().silences_held_no_capacity, 1u);
  EXPECT_EQ(c_->counters().silences_held, 0u);  // not the shared-silence alert's
}

TEST_F(ControllerTest, NewAgentGetsAWarmupBeforeSilenceCounts) {
  Start();
  Connect("a1");
  Run(milliseconds(600), {"a2", "a3", "p1"});  // a1 connected but has not beaten yet
  EXPECT_NE((*c_->NodeJson("a1"))["state"], "failed");
  Run(milliseconds(600), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
}

TEST_F(ControllerTest, ANodeWhoseAgentNeverConnectedIsNotFailedOver) {
  ControllerConfig config = ThreePlusOne();
  c_ = std::make_unique<Controller>(config, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  Connect("a1");
  Run(milliseconds(2000), {"a1"});
  EXPECT_EQ(c_->counters().failovers, 0u);
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "pending");
}

TEST_F(ControllerTest, BrokenStreamFailsTheNodeWithin100Ms) {
  Start();
  AddStreams(3);
  Run(milliseconds(200), {"a1", "a2", "a3", "p1"});
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  milliseconds waited(0);
  while ((*c_->NodeJson("a1"))["state"] != "failed" && waited < milliseconds(1000)) {
    Run(milliseconds(10), {"a2", "a3", "p1"});
    waited += milliseconds(10);
  }
  EXPECT_LE(waited.count(), 100);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("fence_unconfirmed"));
}

TEST_F(ControllerTest, UnreachableNodeIsFencedByTheHook) {
  ControllerConfig config = ThreePlusOne();
  config.fence_hook = "ipmitool -H {node}-bmc chassis power off";
  Start(config);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  c_->AgentDisconnected("a2", sinks_["a2"].get());
  Run(milliseconds(100), {"a1", "a3", "p1"});
  c_.reset();  // joins the hook thread
  ASSERT_EQ(fencer_.commands.size(), 1u);
  EXPECT_EQ(fencer_.commands[0], "ipmitool -H a2-bmc chassis power off");
}

TEST_F(ControllerTest, FailedFenceHookHoldsTheNodeOut) {
  ControllerConfig config = ThreePlusOne();
  config.fence_hook = "false";
  fencer_.result = absl::DeadlineExceededError("fence hook 'false' timed out");
  Start(config);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  c_->AgentDisconnected("a2", sinks_["a2"].get());
  Run(milliseconds(100), {"a1", "a3", "p1"});
  for (int i = 0; i < 200 && c_->counters().fence_hook_failures == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(1));  // the hook runs on its own thread
  }
  EXPECT_EQ(c_->counters().fence_hook_failures, 1u);
  EXPECT_EQ((*c_->NodeJson("a2"))["held_out"], true);
  // Even healthy again, it gets no work.
  Connect("a2");
  Run(milliseconds(2000), {"a1", "a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "held-out");
}

TEST_F(ControllerTest, AgentReportedFailureFailsOverAtOnce) {
  Start();
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  Beat("a2", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "failed");
  EXPECT_EQ(sinks_["a2"]->fences(), 1);
}

// Placement uses only nodes whose agent is connected and whose server is
// ready: a configured node that never started once got streams, and the
// router answered 502.
TEST_F(ControllerTest, ANodeJoinsOnlyOnceItsAgentConnectedWithAReadyServer) {
  ControllerConfig config = ThreePlusOne();
  std::string db = (gpuha::testing::TestTempDir() / "c.db").string();
  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  for (const char* n : {"a1", "a2", "a3", "p1"}) {
    EXPECT_EQ((*c_->NodeJson(n))["state"], "pending") << n;
    EXPECT_EQ((*c_->NodeJson(n))["lifecycle"], "pending") << n;
  }
  // No node has joined: nothing can be admitted, and nothing is placed.
  auto refused = c_->AddStream({"cam-0", "acme", 1});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_->Snapshot().routes_size(), 0);
  EXPECT_EQ(c_->Drain("a1", false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_->Fail("a1").code(), absl::StatusCode::kFailedPrecondition);

  // Connected, with a server still starting: it waits, and is not fenced
  // (its agent must start the server to become ready).
  for (const char* n : {"a1", "a2", "p1"}) Connect(n);
  EXPECT_FALSE(sinks_["a1"]->sent.at(0).welcome().fenced());
  v1::Heartbeat starting;
  starting.set_health(v1::NODE_HEALTH_HEALTHY);
  starting.set_epoch(c_->epoch());
  starting.mutable_server()->set_running(true);
  c_->AgentHeartbeat("a1", starting);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "pending");
  // A failed agent with a ready server does not join either.
  v1::Heartbeat failed = starting;
  failed.set_health(v1::NODE_HEALTH_FAILED);
  failed.mutable_server()->set_ready(true);
  c_->AgentHeartbeat("a1", failed);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "pending");

  // Ready: a1, a2 and p1 join; the stream goes on the joined actives, its
  // standby on the passive, and a3 (never connected) gets nothing.
  for (const char* n : {"a1", "a2", "p1"}) Beat(n);
  for (const char* n : {"a1", "a2", "p1"}) {
    EXPECT_EQ((*c_->NodeJson(n))["lifecycle"], "serving") << n;
  }
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "pending");
  ASSERT_TRUE(c_->AddStream({"cam-0", "acme", 1}).ok());
  auto a = c_->StreamJson("cam-0");
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(std::string((*a)["primary"]), ::testing::AnyOf("a1", "a2"));
  EXPECT_EQ((*a)["standby"], "p1");
  v1::RouteSnapshot snapshot = c_->Snapshot();
  for (const v1::Route& r : snapshot.routes()) {
    EXPECT_NE(r.primary().node(), "a3");
    EXPECT_NE(r.standby().node(), "a3");
  }
  EXPECT_GE(IndexOf("joined"), 0);

  // A restarted controller keeps a3 waiting and the others as they were.
  c_.reset();
  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ((*c_->NodeJson("a3"))["lifecycle"], "pending");
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_EQ((*c_->StreamJson("cam-0"))["standby"], "p1");
}

TEST_F(ControllerTest, HungInferenceServerOnAHealthyAgentFailsOver) {
  Start();
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  BeatServer("a2", true);
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "alive");
  // Ready, then not: the node goes, its streams move to the passive.
  BeatServer("a2", false);
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "failed");
  EXPECT_EQ(sinks_["a2"]->fences(), 1);
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a2") << s.dump();
  EXPECT_NE(c_->EventsJson(0, 100).dump().find("inference server not ready"), std::string::npos);
}

// Regression (ChaosTest.NodeCrashLosesNothing, in CI): a fenced node healthy
// again was put back at once, while its stopped server was still starting.
// Another node failing in that window had its streams moved onto it, and
// routers answered 502 for them. Now it is told to serve again and takes
// work only once its server answers ready.
TEST_F(ControllerTest, RejoiningNodeTakesNoWorkUntilItsServerIsReady) {
  Start();
  AddStreams(6);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  ASSERT_EQ((*c_->NodeJson("a1"))["lifecycle"], "fenced");
  // Healthy for healthy_for with its server stopped by the fence.
  for (int t = 10; t <= 600; t += 10) {
    clock_.Advance(milliseconds(10));
    if (t % 50 == 0) {
      for (const char* n : {"a2", "a3", "p1"}) Beat(n);
      Beat("a1", v1::NODE_HEALTH_HEALTHY, /*fenced=*/true);
    }
    c_->Tick();
  }
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "rejoining");
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "rejoining");
  EXPECT_EQ((*c_->NodeJson("a1"))["fenced"], false);  // its agent may start its server
  ASSERT_EQ(sinks_["a1"]->rejoins(), 1);
  EXPECT_EQ(sinks_["a1"]->sent.back().rejoin().role(), "passive");
  EXPECT_EQ(sinks_["a1"]->sent.back().rejoin().epoch(), c_->epoch());
  // Unfenced, its server starting; another node fails meanwhile.
  BeatServer("a1", false);
  Beat("a2", v1::NODE_HEALTH_FAILED);
  for (const auto& s : c_->StreamsJson()) {
    EXPECT_NE(s["primary"], "a1") << s.dump();
    EXPECT_NE(s["standby"], "a1") << s.dump();
    EXPECT_NE(s["primary"], "a2") << s.dump();
  }
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "rejoining");
  // Its server ready: it is back, as passive, and stands by.
  BeatServer("a1", true);
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_EQ((*c_->NodeJson("a1"))["role"], "passive");
  EXPECT_GT(IndexOf("rejoined"), IndexOf("rejoining"));
  bool stands_by = false;
  for (const auto& s : c_->StreamsJson()) stands_by |= s["standby"] == "a1";
  EXPECT_TRUE(stands_by);
  EXPECT_EQ(sinks_["a1"]->rejoins(), 1);
}

// Liveness, role and lifecycle are separate series: a failover changes the
// role and the state, never which series says whether the node is up.
TEST_F(ControllerTest, NodeLivenessRoleAndStateAreSeriesOfTheirOwn) {
  Start();
  AddStreams(3);
  std::string m = c_->MetricsText();
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_up{node=\"a1\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_role{node=\"p1\",role=\"passive\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_state{node=\"a1\",state=\"serving\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_state{node=\"a1\",state=\"fenced\"} 0\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_connected{node=\"a1\"} 1\n"));
  Beat("a1", v1::NODE_HEALTH_FAILED);
  m = c_->MetricsText();
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_up{node=\"a1\"} 0\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_role{node=\"p1\",role=\"active\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_state{node=\"a1\",state=\"fenced\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_state{node=\"a1\",state=\"serving\"} 0\n"));
}

// Regression: node_up was 1 for a listed node whose agent never connected.
// Up means it serves: such a node is down, and pending, until it joins.
TEST_F(ControllerTest, ANodeWhoseAgentNeverConnectedIsNotUp) {
  c_ = std::make_unique<Controller>(ThreePlusOne(), std::make_unique<MemoryStore>(), &clock_,
                                    &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  Connect("a1");
  Beat("a1");
  std::string m = c_->MetricsText();
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_up{node=\"a1\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_up{node=\"a2\"} 0\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_state{node=\"a2\",state=\"pending\"} 1\n"));
  EXPECT_THAT(m, HasSubstr("\ngpuha_controller_node_connected{node=\"a2\"} 0\n"));
}

// A rejoining node that fails again before it took work is fenced again,
// and must be healthy for healthy_for once more.
TEST_F(ControllerTest, RejoiningNodeThatFailsIsFencedAgain) {
  Start();
  AddStreams(3);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  for (int t = 10; t <= 600; t += 10) {
    clock_.Advance(milliseconds(10));
    if (t % 50 == 0) Beat("a1", v1::NODE_HEALTH_HEALTHY, /*fenced=*/true);
    c_->Tick();
  }
  ASSERT_EQ((*c_->NodeJson("a1"))["lifecycle"], "rejoining");
  const int fences = sinks_["a1"]->fences();
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "fenced");
  EXPECT_EQ(sinks_["a1"]->fences(), fences + 1);
  BeatServer("a1", true);  // healthy at once: not enough
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "fenced");
  // Each failure while rejoining counts: the failover and two such failures
  // are max_failures (3), and the node is held out, not cycled for ever.
  for (int t = 10; t <= 600; t += 10) {
    clock_.Advance(milliseconds(10));
    if (t % 50 == 0) Beat("a1", v1::NODE_HEALTH_HEALTHY, /*fenced=*/true);
    c_->Tick();
  }
  ASSERT_EQ((*c_->NodeJson("a1"))["lifecycle"], "rejoining");
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "held-out");
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("held_out"));
}

TEST_F(ControllerTest, DrainingIsMakeBeforeBreak) {
  Start();
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  Beat("a3", v1::NODE_HEALTH_DRAINING);
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "failed");
  int64_t pushed = -1, fenced = -1;
  for (const Event& e : c_->EventsSince(0)) {
    if (e.type == "routes_pushed" && e.detail.find("failover of a3") != std::string::npos)
      pushed = e.id;
    if (e.type == "fenced" && e.node == "a3") fenced = e.id;
  }
  ASSERT_GT(pushed, 0);
  ASSERT_GT(fenced, 0);
  EXPECT_LT(pushed, fenced) << "new routes must go out before the node stops serving";
}

// A store that counts the writes of each node row.
class CountingStore : public MemoryStore {
 public:
  absl::Status Apply(const std::vector<StoreWrite>& batch) override {
    for (const StoreWrite& w : batch) {
      if (w.table == "node") node_writes[w.key]++;
    }
    return MemoryStore::Apply(batch);
  }
  std::map<std::string, int> node_writes;
};

// Regression: Drain committed the node twice (once in the take-out, once
// itself). One transition, one commit, and the row says "drained".
TEST_F(ControllerTest, OperatorDrainCommitsTheNodeOnceAsDrained) {
  auto store = std::make_unique<CountingStore>();
  CountingStore* counted = store.get();
  Start(ThreePlusOne(), std::move(store));
  AddStreams(2);
  counted->node_writes.clear();
  ASSERT_TRUE(c_->Drain("a3", /*force=*/false).ok());
  EXPECT_EQ(counted->node_writes["a3"], 1);
  absl::StatusOr<NodeRecord> row = DecodeNode("a3", (*counted->Load("node"))["a3"]);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->lifecycle, NodeLifecycle::kDrained);
  EXPECT_FALSE(row->available);
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "drained");
  // A drained node does not rejoin by itself, however healthy.
  Run(milliseconds(1000), {"a1", "a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "drained");
  ASSERT_TRUE(c_->Undrain("a3").ok());
  EXPECT_EQ((*c_->NodeJson("a3"))["lifecycle"], "rejoining");
  Beat("a3");  // its server is ready again
  EXPECT_EQ((*c_->NodeJson("a3"))["lifecycle"], "serving");
  EXPECT_EQ((*c_->NodeJson("a3"))["role"], "passive");
}

// Adversarial finding: an API write was answered 201 though its store
// write failed (a deposed leader's, a full disk), and lost. A write is
// confirmed only once it is stored; until then it is 503 naming the store's
// error, and a deposed leader says it no longer leads.
TEST_F(ControllerTest, AnApiWriteIsConfirmedOnlyOnceItIsStored) {
  auto store = std::make_unique<MemoryStore>();
  MemoryStore* raw = store.get();
  Start(ThreePlusOne(), std::move(store));
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  raw->FailWrites(true);
  absl::StatusOr<Assignment> added = c_->AddStream({"cam-x", "acme", 1});
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(added.status().message()),
              HasSubstr("the store did not take the change"));
  absl::Status role = c_->SetRole("p1", Role::kActive);
  EXPECT_EQ(role.code(), absl::StatusCode::kUnavailable) << role;
  raw->FailWrites(false);
  // The next write stores the one before with it, and both are confirmed.
  ASSERT_TRUE(c_->AddStream({"cam-y", "acme", 1}).ok());
  EXPECT_EQ((*raw->Load("stream")).count("cam-x"), 1u);
  EXPECT_EQ((*raw->Load("stream")).count("cam-y"), 1u);
  c_->StopActing("deposed");
  absl::Status removed = c_->RemoveStream("cam-y");
  EXPECT_EQ(removed.code(), absl::StatusCode::kUnavailable) << removed;
}

// The store failing under the controller: the failover still happens in
// memory, every failed write is counted and shown, and the next write lands.
TEST_F(ControllerTest, FailedStoreWritesAreCountedAndFailoverGoesOn) {
  auto store = std::make_unique<MemoryStore>();
  MemoryStore* raw = store.get();
  Start(ThreePlusOne(), std::move(store));
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  raw->FailWrites(true);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
  uint64_t errors = c_->counters().store_errors;
  EXPECT_GT(errors, 0u);
  EXPECT_THAT(c_->MetricsText(),
              HasSubstr("\ngpuha_controller_store_errors_total " + std::to_string(errors) + "\n"));
  // It still leads (and says so) while its store fails: the store alert
  // fires, not the no-leader one.
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_leader{store=\"memory\"} 1\n"));
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_store_up{store=\"memory\"} 0\n"));
  EXPECT_EQ((*raw->Load("stream")).count("cam-0"), 1u);  // the stream row is still the old one
  raw->FailWrites(false);
  ASSERT_TRUE(c_->AddStream({"cam-new", "acme", 1}).ok());
  EXPECT_EQ((*raw->Load("stream")).count("cam-new"), 1u);
  // The rows the failed commits left out went with this one: the store
  // holds the failover, and the route version it holds names those rows.
  const std::map<std::string, std::string> streams = *raw->Load("stream");
  for (const auto& [id, text] : streams) {
    absl::StatusOr<StreamRecord> r = DecodeStream(id, text);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->primary, "a1") << id;
  }
  absl::StatusOr<NodeRecord> a1 = DecodeNode("a1", (*raw->Load("node"))["a1"]);
  ASSERT_TRUE(a1.ok()) << a1.status();
  EXPECT_FALSE(a1->available);
  EXPECT_EQ((*raw->Load("meta"))["route_version"], std::to_string(c_->route_version()));
  EXPECT_EQ(c_->counters().store_errors, errors);
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_store_up{store=\"memory\"} 1\n"));
}

// A leader deposed (its etcd lease lapsed) while it stops acts no more: a
// node that fails meanwhile is not fenced, no routes go out, no agent is
// welcomed, no change is taken and nothing more is written to the store.
TEST_F(ControllerTest, ADeposedControllerActsNoMore) {
  auto store = std::make_unique<CountingStore>();
  CountingStore* raw = store.get();
  Start(ThreePlusOne(), std::move(store));
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  const uint64_t epoch = c_->epoch();
  const uint64_t routes = c_->route_version();
  const nlohmann::json streams = c_->StreamsJson();
  const std::map<std::string, int> writes = raw->node_writes;
  const size_t events = (*raw->LoadEvents(0, SIZE_MAX)).size();
  c_->StopActing("lease lapsed");
  EXPECT_FALSE(c_->acting());
  // a1 reports a failed GPU, then a2 goes silent.
  Beat("a1", v1::NODE_HEALTH_FAILED);
  Run(milliseconds(1000), {"a1", "a3", "p1"});
  EXPECT_EQ(sinks_["a1"]->fences(), 0);
  EXPECT_EQ(sinks_["a2"]->fences(), 0);
  EXPECT_EQ(c_->epoch(), epoch);
  EXPECT_EQ(c_->route_version(), routes);
  EXPECT_EQ(c_->StreamsJson(), streams);
  EXPECT_EQ(c_->AddStream({"cam-new", "acme", 1}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c_->Drain("a3", true).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c_->Fail("a3").code(), absl::StatusCode::kUnavailable);
  v1::Hello hello;
  hello.set_node("a2");
  auto sink = std::make_shared<FakeSink>();
  absl::Status refused = c_->AgentConnected(hello, sink, /*proven=*/true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("no longer leads"));
  EXPECT_TRUE(sink->sent.empty());
  EXPECT_EQ(raw->node_writes, writes);
  EXPECT_EQ((*raw->LoadEvents(0, SIZE_MAX)).size(), events);
  EXPECT_THAT(c_->MetricsText(), HasSubstr("\ngpuha_controller_leader{store=\"memory\"} 0\n"));
}

// While the leader's lease may have run out (its keep-alive thread late, the
// process paused), nothing acts, even before the keep-alive thread notices;
// once the lease is renewed in time, it acts again.
TEST_F(ControllerTest, ALeaderWhoseLeaseMayHaveRunOutActsNoMoreUntilItIsRenewed) {
  Start(ThreePlusOne());
  auto holds = std::make_shared<std::atomic<bool>>(true);
  c_->SetLeaseCheck([holds] { return holds->load(); });
  AddStreams(3);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  const uint64_t routes = c_->route_version();
  *holds = false;
  EXPECT_FALSE(c_->acting());
  Beat("a1", v1::NODE_HEALTH_FAILED);
  Run(milliseconds(200), {"a2", "a3", "p1"});
  EXPECT_EQ(sinks_["a1"]->fences(), 0);
  EXPECT_EQ(c_->route_version(), routes);
  EXPECT_EQ(c_->AddStream({"cam-new", "acme", 1}).status().code(), absl::StatusCode::kUnavailable);
  *holds = true;
  Beat("a1", v1::NODE_HEALTH_FAILED);
  Run(milliseconds(200), {"a2", "a3", "p1"});
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
  EXPECT_GT(c_->route_version(), routes);
}

TEST_F(ControllerTest, DegradedRaisesAnAlertOnly) {
  Start();
  AddStreams(3);
  Beat("a1", v1::NODE_HEALTH_DEGRADED);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("alert"));
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
}

TEST_F(ControllerTest, RecoveredNodeRejoinsAsPassiveAndWorkStays) {
  Start();
  AddStreams(6);
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  Beat("a1", v1::NODE_HEALTH_FAILED);
  auto before = c_->StreamsJson();
  Connect("a1");
  Run(milliseconds(1000), {"a1", "a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["role"], "passive");
  EXPECT_EQ((*c_->NodeJson("a1"))["fenced"], false);
  EXPECT_EQ(sinks_["a1"]->rejoins(), 1);
  auto after = c_->StreamsJson();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i]["primary"], before[i]["primary"]);
  // Regression: the rejoined passive is every stream's standby again, in
  // the routes routers get.
  for (const auto& s : after) EXPECT_EQ(s["standby"], "a1") << s.dump();
  v1::RouteSnapshot snap = c_->Snapshot();
  for (const auto& r : snap.routes()) EXPECT_EQ(r.standby().node(), "a1");
}

// A DaemonSet upgrade: the agent says goodbye and its server serves on. Its
// silence fails nothing over for the restart grace, and it comes back.
TEST_F(ControllerTest, AnAgentsPlannedRestartFailsNothingOver) {
  Start();
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  const uint64_t epoch = c_->epoch();
  const auto streams = c_->StreamsJson();
  v1::Goodbye bye;
  bye.set_reason("SIGTERM");
  c_->AgentGoodbye("a1", sinks_["a1"].get(), bye);
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(20000), {"a2", "a3", "p1"});  // the new agent takes its time
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  EXPECT_EQ(sinks_["a1"]->fences(), 0);
  EXPECT_EQ(c_->epoch(), epoch);
  EXPECT_EQ(c_->StreamsJson(), streams);
  Connect("a1");
  Run(milliseconds(40000), {"a1", "a2", "a3", "p1"});  // past the grace: watched again
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
  EXPECT_EQ(c_->StreamsJson(), streams);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("agent_goodbye"));
  // A crash after it is back still fails over at once.
  Run(milliseconds(300), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
}

TEST_F(ControllerTest, APlannedRestartThatDoesNotComeBackFailsOverAfterTheGrace) {
  ControllerConfig config = ThreePlusOne();
  config.restart_grace = milliseconds(5000);
  Start(config);
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(4900), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  Run(milliseconds(200), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
}

// The grace of a planned agent restart is in the store: a leader that
// takes over meanwhile keeps it, rather than failing the node over once its
// own startup grace ends, and fails over only when it runs out.
TEST_F(ControllerTest, APlannedRestartsGraceOutlivesALeaderChange) {
  ControllerConfig config = ThreePlusOne();
  config.restart_grace = milliseconds(5000);
  const std::string db = (gpuha::testing::TestTempDir() / "grace.db").string();
  Start(config, std::move(*SqliteStore::Open(db)));
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(1000), {"a2", "a3", "p1"});
  const auto streams = c_->StreamsJson();
  // The leader goes; the next one reads the grace back.
  c_.reset();  // lets go of the store's lock
  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  for (const char* n : {"a2", "a3", "p1"}) Connect(n);
  Run(milliseconds(3000), {"a2", "a3", "p1"});  // ThreePlusOne has no startup grace
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  EXPECT_THAT(EventTypes("a1"), ::testing::Not(::testing::Contains("detected")));
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_EQ(c_->StreamsJson()[i]["primary"], streams[i]["primary"]);
  }
  Run(milliseconds(1200), {"a2", "a3", "p1"});  // 5.2 s since the goodbye
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("detected"));
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
}

// A grace nearly spent when a new leader starts lasts at least that
// leader's startup grace: the agent gets a window to reconnect to it.
TEST_F(ControllerTest, ARestoredRestartGraceLastsAtLeastTheStartupGrace) {
  ControllerConfig config = ThreePlusOne();
  config.restart_grace = milliseconds(5000);
  const std::string db = (gpuha::testing::TestTempDir() / "grace2.db").string();
  Start(config, std::move(*SqliteStore::Open(db)));
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(4800), {"a2", "a3", "p1"});  // 200 ms of the grace left
  c_.reset();
  config.startup_grace = milliseconds(2000);
  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  for (const char* n : {"a2", "a3", "p1"}) Connect(n);
  Run(milliseconds(1500), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  Connect("a1");  // its agent is back in time
  Run(milliseconds(3000), {"a1", "a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
  EXPECT_THAT(EventTypes("a1"), ::testing::Not(::testing::Contains("detected")));
}

// An agent that hangs on its way out, its stream still open, does not keep
// the grace going: the node fails over when it ends.
TEST_F(ControllerTest, AnAgentThatHangsAfterItsGoodbyeFailsOverWhenTheGraceEnds) {
  ControllerConfig config = ThreePlusOne();
  config.restart_grace = milliseconds(2000);
  Start(config);
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  Run(milliseconds(2100), {"a2", "a3", "p1"});  // no disconnect, no heartbeat
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
}

// A goodbye whose server stops, from a node with no work (here, failed
// already): the agent still gets its fence, so it need not wait it out.
TEST_F(ControllerTest, AGoodbyeFromANodeWithNoWorkIsStillFenced) {
  Start();
  Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
  Beat("a1", v1::NODE_HEALTH_FAILED);
  const int fences = sinks_["a1"]->fences();
  v1::Goodbye bye;
  bye.set_server_stops(true);
  c_->AgentGoodbye("a1", sinks_["a1"].get(), bye);
  EXPECT_EQ(sinks_["a1"]->fences(), fences + 1);
}

// During the grace the routers are the node's witnesses: one that sees its
// server fail fails it over at once.
TEST_F(ControllerTest, ARouterThatSeesTheServerFailEndsTheRestartGrace) {
  Start();
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(1000), {"a2", "a3", "p1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "restarting");
  c_->RouterAck("r1", c_->route_version(), {"a1"});
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
}

// An ack whose suspect ends a restart grace moves the routes on: that ack
// is of the old routes, and routers_acked waits for the new ones (it was
// once logged for the old version right after the move's routes_pushed,
// and a failover's detected-to-routers-acked read about 0 ms).
TEST_F(ControllerTest, AnAckThatMovesTheRoutesIsNotTheirAcknowledgement) {
  Start();
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  c_->AgentGoodbye("a1", sinks_["a1"].get(), v1::Goodbye());
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Run(milliseconds(1000), {"a2", "a3", "p1"});
  const uint64_t before = c_->route_version();
  c_->RouterAck("r1", before, {"a1"});
  const uint64_t after = c_->route_version();
  ASSERT_GT(after, before);  // a1 taken out: new routes
  auto acked = [&] {
    std::vector<std::string> out;
    for (const Event& e : c_->EventsSince(0)) {
      if (e.type == "routers_acked") out.push_back(e.detail);
    }
    return out;
  };
  for (const std::string& d : acked()) {
    EXPECT_EQ(d.find(absl::StrCat("version ", before, " ")), std::string::npos) << d;
  }
  c_->RouterAck("r1", after, {});
  ASSERT_FALSE(acked().empty());
  EXPECT_EQ(acked().back(), absl::StrCat("version ", after, " by 1 router(s)"));
}

// An agent that supervises its server stops it on the way out: the work
// moves first, then the node is fenced, as a planned move (no failure
// counted), and it rejoins once its agent is back and healthy.
TEST_F(ControllerTest, AGoodbyeWhoseServerStopsMovesTheWorkFirst) {
  Start();
  AddStreams(6);
  Run(milliseconds(500), {"a1", "a2", "a3", "p1"});
  const uint64_t routes = c_->route_version();
  v1::Goodbye bye;
  bye.set_server_stops(true);
  c_->AgentGoodbye("a1", sinks_["a1"].get(), bye);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
  EXPECT_GT(c_->route_version(), routes);
  for (const auto& s : c_->StreamsJson()) EXPECT_NE(s["primary"], "a1");
  // Routes went out before the fence (make-before-break).
  const std::vector<std::string> types = EventTypes("a1");
  auto pushed = std::find(types.begin(), types.end(), "routes_pushed");
  auto fenced = std::find(types.begin(), types.end(), "fenced");
  ASSERT_NE(pushed, types.end());
  ASSERT_NE(fenced, types.end());
  EXPECT_LT(pushed, fenced);
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  Connect("a1");
  Run(milliseconds(1500), {"a1", "a2", "a3", "p1"});
  EXPECT_EQ(sinks_["a1"]->rejoins(), 1);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
  EXPECT_EQ((*c_->NodeJson("a1"))["role"], "passive");
  // Planned stops are not failures: max_failures (3) of them hold nothing out.
  for (int i = 0; i < 3; ++i) {
    c_->AgentGoodbye("a1", sinks_["a1"].get(), bye);
    c_->AgentDisconnected("a1", sinks_["a1"].get());
    Connect("a1");
    Run(milliseconds(1500), {"a1", "a2", "a3", "p1"});
  }
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "alive");
}

TEST_F(ControllerTest, FlappingNodeIsHeldOutAfterMaxFailures) {
  Start();
  for (int round = 0; round < 3; ++round) {
    Run(milliseconds(100), {"a1", "a2", "a3", "p1"});
    Beat("a1", v1::NODE_HEALTH_FAILED);
    Connect("a1");
    Run(milliseconds(700), {"a1", "a2", "a3", "p1"});
  }
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "held-out");
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("held_out"));
  EXPECT_EQ(sinks_["a1"]->rejoins(), 0);  // each Connect made a new sink; the last saw none
  ASSERT_TRUE(c_->Undrain("a1").ok());
  Beat("a1");  // its server is ready again
  EXPECT_EQ((*c_->NodeJson("a1"))["role"], "passive");
}

TEST_F(ControllerTest, TwoFailuresInNPlusOneReportTheOverflow) {
  Start();
  AddStreams(30);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  Beat("a2", v1::NODE_HEALTH_FAILED);
  auto cap = c_->CapacityJson();
  EXPECT_EQ(cap["unplaced_streams"], 10);
  EXPECT_THAT(EventTypes(), ::testing::Contains("streams_unplaced"));
  int unplaced = 0;
  v1::RouteSnapshot snap = c_->Snapshot();
  for (const auto& r : snap.routes()) unplaced += r.primary().node().empty();
  EXPECT_EQ(unplaced, 10);
  EXPECT_THAT(c_->MetricsText(), HasSubstr("gpuha_controller_unplaced_streams 10"));
}

TEST_F(ControllerTest, DrainIsRefusedAtPeakUnlessForced) {
  ControllerConfig config = ThreePlusOne();
  config.nodes.pop_back();  // no passive: three actives, N+1
  Start(config);
  AddStreams(20);
  absl::Status s = c_->Drain("a1", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("use force"));
  EXPECT_TRUE(c_->Drain("a1", true).ok());
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "drained");
  ASSERT_TRUE(c_->Undrain("a1").ok());
  Beat("a1");  // its server is ready again
  EXPECT_EQ((*c_->NodeJson("a1"))["role"], "passive");
  EXPECT_EQ(c_->Drain("ghost", false).code(), absl::StatusCode::kNotFound);
}

TEST_F(ControllerTest, StaleAgentServingWhileFencedIsFencedAgain) {
  Start();
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
  Beat("a1", v1::NODE_HEALTH_FAILED, /*fenced=*/false, /*epoch=*/1);
  EXPECT_EQ(sinks_["a1"]->fences(), 2);
  EXPECT_EQ(c_->counters().stale_agents_corrected, 1u);
}

// Regression: an agent that never confirmed its fence got a fence, an event
// and a store write on every heartbeat (20 a second). Now the fence is
// re-sent with backoff, and only the first is an event.
TEST_F(ControllerTest, UnconfirmedFenceIsResentWithBackoffAndLoggedOnce) {
  Start();
  Beat("a1", v1::NODE_HEALTH_FAILED);
  ASSERT_EQ(sinks_["a1"]->fences(), 1);
  size_t fenced_events = 0;
  for (int i = 0; i < 200; ++i) {  // 10 s of 50 ms heartbeats, never confirming
    Beat("a1", v1::NODE_HEALTH_FAILED, /*fenced=*/false, /*epoch=*/1);
    clock_.Advance(milliseconds(50));
  }
  for (const std::string& t : EventTypes()) fenced_events += t == "fenced";
  // 100 ms, 200, 400, ... capped at 5 s: about 7 re-sends in 10 s, not 200.
  EXPECT_GE(sinks_["a1"]->fences(), 5);
  EXPECT_LE(sinks_["a1"]->fences(), 10);
  EXPECT_EQ(fenced_events, 2u);  // the fence, and the first correction
  EXPECT_EQ(c_->counters().stale_agents_corrected, 1u);
  EXPECT_GE(c_->counters().fence_repeats, 4u);
  // A confirmation ends the run; the next disobedience is logged again.
  Beat("a1", v1::NODE_HEALTH_FAILED, /*fenced=*/true, /*epoch=*/1);
  Beat("a1", v1::NODE_HEALTH_FAILED, /*fenced=*/false, /*epoch=*/1);
  EXPECT_EQ(c_->counters().stale_agents_corrected, 2u);
}

// Regression: any agent could claim any node's name; an impostor took the
// real agent's fences. Without mTLS, a second stream for a connected node
// is refused; a proven (mTLS) one replaces the old stream.
TEST_F(ControllerTest, SecondAgentForAConnectedNodeIsRefusedUnlessProven) {
  Start();
  v1::Hello hello;
  hello.set_node("a1");
  auto impostor = std::make_shared<FakeSink>();
  absl::Status s = c_->AgentConnected(hello, impostor, /*proven=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("already has a connected agent"));
  EXPECT_EQ(c_->counters().agents_refused, 1u);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ(impostor->fences(), 0);  // the fence went to the real agent
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
  // Once the first stream ends, a new one (a reconnect) is taken.
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  EXPECT_TRUE(c_->AgentConnected(hello, impostor, /*proven=*/false).ok());
}

// Regression: a controller on an empty store (epoch 1) faced agents at
// epoch 35, which ignored all its fences. It moves past the epoch an agent
// reports in its hello.
TEST_F(ControllerTest, AgentHelloWithALaterEpochMovesTheControllerPastIt) {
  Start();
  c_->AgentDisconnected("a1", sinks_["a1"].get());
  v1::Hello hello;
  hello.set_node("a1");
  hello.set_last_epoch(35);
  ASSERT_TRUE(c_->AgentConnected(hello, sinks_["a1"], /*proven=*/false).ok());
  EXPECT_EQ(c_->epoch(), 36u);
  EXPECT_THAT(EventTypes(), ::testing::Contains("epoch_advanced"));
  Beat("a1", v1::NODE_HEALTH_FAILED);
  EXPECT_EQ(sinks_["a1"]->last_fence_epoch(), c_->epoch());  // the failover's, past 36
  EXPECT_GT(c_->epoch(), 36u);
}

TEST_F(ControllerTest, RouterAcksAreRecorded) {
  Start();
  AddStreams(1);
  c_->RouterAck("r1", 0, {});
  c_->RouterAck("r1", c_->route_version(), {});
  EXPECT_THAT(EventTypes(), ::testing::Contains("routers_acked"));
}

// Several routers: "routers_acked" is recorded once, when the last of them
// holds the current version; a router that leaves no longer holds it back.
// Suspect hints become events naming the node and the router.
TEST_F(ControllerTest, AcksFromSeveralRoutersAndTheirSuspectHints) {
  Start();
  AddStreams(1);
  auto acked = [&] {
    int n = 0;
    for (const std::string& t : EventTypes()) n += t == "routers_acked";
    return n;
  };
  uint64_t v = c_->route_version();
  c_->RouterAck("r1", 0, {});
  c_->RouterAck("r2", 0, {});
  c_->RouterAck("r1", v, {});
  EXPECT_EQ(acked(), 0) << "r2 still holds an older version";
  c_->RouterAck("r2", v, {"a2"});
  EXPECT_EQ(acked(), 1);
  c_->RouterAck("r2", v, {});  // a repeated ack is not a new event
  EXPECT_EQ(acked(), 1);
  bool hint = false;
  for (const Event& e : c_->EventsSince(0)) {
    hint = hint || (e.type == "router_hint" && e.node == "a2" && e.detail == "from r2");
  }
  EXPECT_TRUE(hint);
  // A new version; r3 joins and never acks, then leaves: the others decide.
  ASSERT_TRUE(c_->AddStream({"cam-x", "acme", 1}).ok());
  v = c_->route_version();
  c_->RouterAck("r3", 0, {});
  c_->RouterAck("r1", v, {});
  c_->RouterAck("r2", v, {});
  EXPECT_EQ(acked(), 1);
  c_->RouterGone("r3");
  c_->RouterAck("r1", v, {});
  EXPECT_EQ(acked(), 2);
}

// A router that holds routes of an epoch the controller has not reached (its
// last epoch was lost with a failed store write) would refuse every
// snapshot: the controller moves past that epoch, persists it, and pushes.
TEST_F(ControllerTest, RouterHoldingANewerEpochMovesTheControllerPastIt) {
  auto store = std::make_unique<MemoryStore>();
  MemoryStore* raw = store.get();
  Start(ThreePlusOne(), std::move(store));
  uint64_t epoch = c_->epoch();
  uint64_t version = c_->route_version();
  c_->RouterHello("r1", epoch - 1, 99);  // older: nothing to do
  EXPECT_EQ(c_->epoch(), epoch);
  // This epoch, at most this version: the router takes these routes (a
  // router back from a standby holds exactly them).
  c_->RouterHello("r1", epoch, version);
  EXPECT_EQ(c_->epoch(), epoch);
  EXPECT_EQ(c_->route_version(), version);
  c_->RouterHello("r1", epoch + 3, 1);
  EXPECT_EQ(c_->epoch(), epoch + 4);
  EXPECT_GT(c_->route_version(), version);
  EXPECT_EQ(c_->Snapshot().epoch(), epoch + 4);
  EXPECT_EQ((*raw->Load("meta"))["epoch"], std::to_string(epoch + 4));
  EXPECT_THAT(EventTypes(), ::testing::Contains("epoch_advanced"));
}

// Regression: "victim\0evil", "a/b", spaces and 100,000-character IDs were
// admitted; routers can route none of them, and SQLite cut the first at the
// NUL. IDs enter by the router's rule, tenants by the name rule.
TEST_F(ControllerTest, StreamIdsAndTenantsAreCheckedWhereTheyEnter) {
  Start();
  for (const std::string& id :
       {std::string("victim\0evil", 11), std::string("a/b"), std::string("a b"),
        std::string("a\nb"), std::string(100000, 'x'), std::string()}) {
    auto a = c_->AddStream({id, "acme", 1});
    ASSERT_FALSE(a.ok()) << id.size();
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("id: "));
    EXPECT_LT(a.status().message().size(), 400u);  // the error does not echo 100,000 bytes
  }
  EXPECT_THAT(std::string(c_->AddStream({"cam-1", "ac\0me", 1}).status().message()),
              HasSubstr("tenant: "));
  EXPECT_THAT(std::string(c_->AddStream({"cam-1", "acme", 5000000}).status().message()),
              HasSubstr("weight: must be between 1 and 1000000"));
  EXPECT_TRUE(c_->AddStream({"cam-1", "acme", 1}).ok());
}

// Regression: a damaged store aborted the controller (exit 134), read a
// negative epoch as 18446744073709551615, and loaded a stream of weight 5000
// onto a node of capacity 10. Every row is checked as API input is. A
// damaged meta row stops recovery (no epoch can be trusted); a damaged
// stream, node or job row is set aside, named, and left in the store, and
// the rest is served (adversarial finding: one corrupt row took the whole
// control plane down at the next leader change, each standby failing its
// takeover the same way, and each failed takeover moved meta.epoch).
TEST_F(ControllerTest, DamagedMetaRowsStopRecoveryWithAClearError) {
  struct Case {
    std::vector<StoreWrite> rows;
    std::string error;
  };
  std::vector<Case> cases = {
      {{{"meta", "epoch", "abc"}}, "meta.epoch: 'abc' is not an epoch"},
      {{{"meta", "epoch", "-5"}}, "meta.epoch: '-5' is not an epoch"},
  };
  for (const Case& k : cases) {
    auto store = std::make_unique<MemoryStore>();
    ASSERT_TRUE(store->Apply(k.rows).ok());
    Controller c(ThreePlusOne(), std::move(store), &clock_, &fencer_);
    absl::Status s = c.Recover();
    ASSERT_FALSE(s.ok()) << k.error;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.error));
  }
}

TEST_F(ControllerTest, DamagedRowsAreSetAsideNamedAndTheRestIsServed) {
  struct Case {
    std::vector<StoreWrite> rows;
    std::string error;
  };
  std::vector<Case> cases = {
      {{{"stream", "s1", R"({"tenant":"acme","weight":"heavy"})"}}, "weight: wrong type"},
      {{{"stream", "s1", R"([1,2])"}}, "is corrupt"},
      {{{"node", "a1", R"({"role":7})"}}, "role: wrong type"},
      {{{"stream", std::string("s\0x", 3), R"({"tenant":"acme"})"}}, "id: "},
      {{{"stream", "s1", R"({"tenant":"initech"})"}}, "'initech' is not a known tenant"},
      {{{"stream", "s1", R"({"tenant":"acme","weight":5000,"primary":"a1"})"}},
       "weight 5000 exceeds node a1's capacity"},
      {{{"job", "j1", "{"}}, "store: job 'j1': not a JSON object"},
  };
  for (const Case& k : cases) {
    auto store = std::make_unique<MemoryStore>();
    // A good stream beside the damaged row, and the epoch before.
    std::vector<StoreWrite> rows = k.rows;
    rows.push_back({"stream", "good", R"({"tenant":"acme","weight":1})"});
    rows.push_back({"meta", "epoch", "7"});
    ASSERT_TRUE(store->Apply(rows).ok());
    MemoryStore* kept = store.get();
    Controller c(ThreePlusOne(), std::move(store), &clock_, &fencer_);
    absl::Status s = c.Recover();
    ASSERT_TRUE(s.ok()) << k.error << ": " << s;
    EXPECT_EQ(c.epoch(), 8u) << k.error;
    EXPECT_EQ(c.counters().store_rows_set_aside, 1u) << k.error;
    bool named = false;
    for (const Event& e : c.EventsSince(0)) {
      named |= e.type == "store_row_set_aside" && e.detail.find(k.error) != std::string::npos;
    }
    EXPECT_TRUE(named) << k.error;
    EXPECT_TRUE(c.StreamJson("good").ok()) << k.error;
    // The damaged row is left as it was, for the operator to see or mend.
    const StoreWrite& bad = k.rows.front();
    EXPECT_EQ((*kept->Load(bad.table))[bad.key], bad.value) << k.error;
  }
}

// Adversarial finding: a stream row whose standby is its primary was
// loaded as it was, a standby that protects nothing.
TEST_F(ControllerTest, AStreamRowWhoseStandbyIsItsPrimaryLosesThatStandby) {
  auto store = std::make_unique<MemoryStore>();
  ASSERT_TRUE(store->Apply({{"stream", "cam-0", EncodeStream({"acme", 1, "a1", "a1"})}}).ok());
  Controller c(ThreePlusOne(), std::move(store), &clock_, &fencer_);
  ASSERT_TRUE(c.Recover().ok());
  absl::StatusOr<nlohmann::json> s = c.StreamJson("cam-0");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)["primary"], "a1");
  EXPECT_NE((*s)["standby"], "a1") << s->dump();
}

// A takeover that fails while reading (a store that errors) moves no
// epoch: the epoch is recorded once every row has been read.
TEST_F(ControllerTest, AFailedRecoveryMovesNoEpoch) {
  // Reads the jobs' table last, and fails there (etcd gone mid-takeover).
  struct FailingJobs : MemoryStore {
    absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& table) override {
      if (table == "job") return absl::UnavailableError("store unreachable");
      return MemoryStore::Load(table);
    }
  };
  auto store = std::make_unique<FailingJobs>();
  ASSERT_TRUE(store->Apply({{"meta", "epoch", "7"}}).ok());
  MemoryStore* kept = store.get();
  Controller c(ThreePlusOne(), std::move(store), &clock_, &fencer_);
  ASSERT_FALSE(c.Recover().ok());
  EXPECT_EQ((*kept->Load("meta"))["epoch"], "7");
}

TEST_F(ControllerTest, RestartKeepsRoutesStartsANewEpochAndWaitsOutTheGrace) {
  std::string db = (gpuha::testing::TestTempDir() / "c.db").string();
  ControllerConfig config = ThreePlusOne();
  config.startup_grace = milliseconds(300);
  Start(config, std::move(*SqliteStore::Open(db)));
  AddStreams(6);
  Run(milliseconds(350), {"a1", "a2", "a3", "p1"});  // past the first grace
  Beat("a1", v1::NODE_HEALTH_FAILED);
  ASSERT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  auto streams = c_->StreamsJson();
  uint64_t epoch = c_->epoch();
  c_.reset();  // kill: nothing but the store survives

  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ(c_->StreamsJson(), streams);
  // A new epoch: routers holding the old controller's later versions still
  // take the restarted one's snapshots.
  EXPECT_EQ(c_->epoch(), epoch + 1);
  EXPECT_EQ((*c_->NodeJson("a1"))["fenced"], true);
  // Nobody has reconnected yet; within the grace nothing fails over.
  Run(milliseconds(250), {});
  EXPECT_EQ((*c_->NodeJson("a2"))["role"], "active");
  EXPECT_NE((*c_->NodeJson("a2"))["state"], "failed");
  // Agents that come back in time keep their work.
  for (const char* n : {"a2", "a3", "p1"}) Connect(n);
  Run(milliseconds(500), {"a2", "a3", "p1"});
  EXPECT_EQ(c_->StreamsJson(), streams);
  // The failover history came back from the store with the rest.
  nlohmann::json failovers = c_->FailoversJson();
  ASSERT_GE(failovers.size(), 1u) << failovers.dump();
  EXPECT_EQ(failovers[0]["node"], "a1");
  EXPECT_TRUE(failovers[0].contains("detected_to_routes_pushed_ms")) << failovers.dump();
}

// The XIDs an agent reports are kept in its node's stored row, so the API's
// recent XIDs outlive a controller restart (the demo's last fault) and the
// node's own reboot; the same XID on the same GPU within a minute is kept
// once (a flood would be a store write each).
TEST_F(ControllerTest, RecentXidsAreStoredWithTheirNodeAndOutliveARestart) {
  std::string db = (gpuha::testing::TestTempDir() / "xid.db").string();
  ControllerConfig config = ThreePlusOne();
  Start(config, std::move(*SqliteStore::Open(db)));
  const int64_t t0 = 1'700'000'000'000;  // the agent's clock, in ms
  auto beat = [&](std::optional<std::pair<uint32_t, uint32_t>> xid, int64_t unix_ms) {
    v1::Heartbeat hb;
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.mutable_server()->set_running(true);
    hb.mutable_server()->set_ready(true);
    for (uint32_t i : {0u, 1u}) hb.add_gpus()->set_index(i);
    if (xid) {
      v1::XidEvent* x = hb.add_xids();
      x->set_gpu_index(xid->first);
      x->set_xid(xid->second);
      x->set_unix_nanos(unix_ms * 1'000'000);
    }
    c_->AgentHeartbeat("a1", hb);
  };
  auto xids_of = [&](int gpu) { return (*c_->NodeJson("a1"))["gpus"][gpu]["xids"]; };
  beat(std::pair{0u, 79u}, t0);
  beat(std::pair{0u, 79u}, t0 + 50);  // again within the minute: not logged again
  beat(std::pair{1u, 13u}, t0 + 100);
  ASSERT_EQ(xids_of(0).size(), 1u);
  EXPECT_EQ(xids_of(0)[0]["xid"], 79);
  EXPECT_EQ(xids_of(0)[0]["unix_ms"], static_cast<double>(t0));
  ASSERT_EQ(xids_of(1).size(), 1u);
  EXPECT_EQ(xids_of(1)[0]["xid"], 13);
  beat(std::pair{0u, 79u}, t0 + 61'000);  // a minute on: kept
  EXPECT_EQ(xids_of(0).size(), 2u);

  c_.reset();  // kill: nothing but the store survives
  c_ = std::make_unique<Controller>(config, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  Connect("a1");
  beat(std::nullopt, t0 + 70'000);  // telemetry again, no new XID
  ASSERT_EQ(xids_of(0).size(), 2u);
  EXPECT_EQ(xids_of(0)[1]["unix_ms"], static_cast<double>(t0 + 61'000));
  EXPECT_EQ(xids_of(1).size(), 1u);
}

}  // namespace
}  // namespace gpuha::controller

namespace gpuha::controller {
namespace {

// Agents add their own nodes: the config holds policy, not an inventory.
class RegistrationTest : public ControllerTest {
 protected:
  static ControllerConfig Policy() {
    ControllerConfig c;
    c.redundancy = 1;
    c.registration.enabled = true;
    c.registration.join_token_sha256 = Sha256Hex("join-me");
    c.tenants = {"acme"};
    c.startup_grace = milliseconds(0);
    return c;
  }
  absl::Status Register(const std::string& node, const std::string& address,
                        const std::string& role = "", const std::string& token = "join-me",
                        int64_t capacity = 10, bool proven = true, bool fenced = false,
                        const std::string& peer_ip = "") {
    v1::Hello hello;
    hello.set_node(node);
    hello.set_fenced(fenced);
    v1::Registration* r = hello.mutable_registration();
    r->set_address(address);
    r->set_capacity(capacity);
    r->set_join_token(token);
    if (!role.empty()) (*r->mutable_labels())["gpuha.io/role"] = role;
    auto sink = std::make_shared<FakeSink>();
    absl::Status s = c_->AgentConnected(hello, sink, proven, peer_ip);
    if (s.ok()) sinks_[node] = sink;
    return s;
  }
  // An agent at `ip`, without mTLS, with the join token.
  absl::Status RegisterFrom(const std::string& ip, const std::string& node,
                            const std::string& address) {
    return Register(node, address, "", "join-me", 10, /*proven=*/false, false, ip);
  }
};

// Adversarial finding: wrong join tokens were checked (and logged) as fast
// as they came, 4,267 a second. Past kMaxWrongJoinTokens in a second from one
// IP, its hellos are refused unchecked for the rest of the second, the
// right token too; other sources are not slowed.
TEST_F(RegistrationTest, WrongJoinTokensFromOneSourceAreThrottled) {
  c_ = std::make_unique<Controller>(Policy(), std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  auto from = [&](const std::string& ip, const std::string& token) {
    return Register("g1", "10.0.0.1:8000", "", token, 10, /*proven=*/false, false, ip);
  };
  for (int i = 0; i < Controller::kMaxWrongJoinTokens; ++i) {
    EXPECT_EQ(from("10.9.9.9", "guess").code(), absl::StatusCode::kPermissionDenied) << i;
  }
  absl::Status s = from("10.9.9.9", "join-me");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("too many wrong join tokens from 10.9.9.9"));
  EXPECT_TRUE(c_->NodesJson().empty());
  EXPECT_EQ(c_->counters().join_tokens_throttled, 1u);
  // Another source is not slowed; the first one is heard again a second on.
  EXPECT_EQ(Register("g2", "10.0.0.2:8000", "", "join-me", 10, false, false, "10.0.0.2").code(),
            absl::StatusCode::kOk);
  clock_.Advance(std::chrono::milliseconds(1001));
  EXPECT_TRUE(from("10.9.9.9", "join-me").ok());
}

// Adversarial finding: anyone with the cluster's join token took over a
// registered node whose agent was away, and moved its routes to an address
// of their own. A registered node is bound to the IP it registered from;
// an agent elsewhere is refused, token or not, until an admin frees it
// (the node's host moved); the binding outlives a controller restart.
TEST_F(RegistrationTest, ARegisteredNodeIsBoundToItsAgentsIpAndAnAdminFreesIt) {
  std::string db = (gpuha::testing::TestTempDir() / "c.db").string();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  ASSERT_TRUE(RegisterFrom("10.0.0.1", "g1", "10.0.0.1:8000").ok());
  EXPECT_EQ((*c_->NodeJson("g1"))["agent_ip"], "10.0.0.1");
  c_->AgentDisconnected("g1", sinks_["g1"].get());
  absl::Status s = RegisterFrom("10.6.6.6", "g1", "10.6.6.6:8000");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("registered from 10.0.0.1"));
  EXPECT_THAT(s.message(), HasSubstr("/api/v1/nodes/g1/rebind"));
  EXPECT_EQ((*c_->NodeJson("g1"))["address"], "10.0.0.1:8000");
  EXPECT_GE(IndexOf("registration_refused"), 0);
  // Its own agent, back from the same IP, moves its server's address.
  ASSERT_TRUE(RegisterFrom("10.0.0.1", "g1", "10.0.0.1:8001").ok());
  EXPECT_EQ((*c_->NodeJson("g1"))["address"], "10.0.0.1:8001");
  c_->AgentDisconnected("g1", sinks_["g1"].get());
  // Kept across a restart.
  c_.reset();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ(RegisterFrom("10.6.6.6", "g1", "10.6.6.6:8000").code(),
            absl::StatusCode::kPermissionDenied);
  // The admin frees it; the next agent binds it.
  ASSERT_TRUE(c_->RebindNode("g1").ok());
  EXPECT_TRUE((*c_->NodeJson("g1"))["agent_ip"].is_null());
  ASSERT_TRUE(RegisterFrom("10.0.0.7", "g1", "10.0.0.7:8000").ok());
  EXPECT_EQ((*c_->NodeJson("g1"))["agent_ip"], "10.0.0.7");
  EXPECT_EQ((*c_->NodeJson("g1"))["address"], "10.0.0.7:8000");
  EXPECT_EQ(c_->RebindNode("nope").code(), absl::StatusCode::kNotFound);
}

// Issue finding: a node that left the cluster could not be removed, so its
// failed state (and the alert on it) stayed for ever. An admin forgets a
// registered node once its agent is gone and it is out of service; its
// routes never named it again and its name can register anew.
TEST_F(RegistrationTest, ARegisteredNodeThatLeftIsRemovedOnceItIsOut) {
  std::string db = (gpuha::testing::TestTempDir() / "c.db").string();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  ASSERT_TRUE(Register("g1", "10.0.0.1:8000", "active").ok());
  ASSERT_TRUE(Register("g2", "10.0.0.2:8000", "active").ok());
  ASSERT_TRUE(Register("g3", "10.0.0.3:8000", "passive").ok());
  for (const char* n : {"g1", "g2", "g3"}) Beat(n);
  ASSERT_TRUE(c_->AddStream({"cam-0", "acme", 1}).ok());
  const std::string primary = c_->Snapshot().routes(0).primary().node();

  absl::Status s = c_->RemoveNode(primary);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("agent is connected"));
  c_->AgentDisconnected(primary, sinks_[primary].get());
  s = c_->RemoveNode(primary);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("in service"));
  ASSERT_TRUE(c_->Fail(primary).ok());
  ASSERT_TRUE(c_->RemoveNode(primary).ok());
  EXPECT_EQ(c_->NodeJson(primary).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->NodesJson().size(), 2u);
  EXPECT_GE(IndexOf("node_removed"), 0);
  v1::RouteSnapshot snap = c_->Snapshot();
  ASSERT_EQ(snap.routes_size(), 1);
  EXPECT_NE(snap.routes(0).primary().node(), primary);
  EXPECT_NE(snap.routes(0).standby().node(), primary);
  EXPECT_EQ(c_->RemoveNode(primary).code(), absl::StatusCode::kNotFound);

  // Gone from the store too; its name registers again as a new node.
  c_.reset();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ(c_->NodesJson().size(), 2u);
  ASSERT_TRUE(Register(primary, "10.0.0.8:8000", "passive").ok());
  EXPECT_EQ((*c_->NodeJson(primary))["address"], "10.0.0.8:8000");
}

TEST_F(ControllerTest, AListedNodeIsTheConfigsToRemove) {
  Start();
  absl::Status s = c_->RemoveNode("a1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("listed in the config"));
}

TEST_F(RegistrationTest, AgentsRegisterTheirNodesWhichJoinOnceReadyAndSurviveARestart) {
  std::string db = (gpuha::testing::TestTempDir() / "c.db").string();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_TRUE(c_->NodesJson().empty());

  // What is refused, each with a reason that names it.
  absl::Status s = Register("g1", "10.0.0.1:8000", "", "guess");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("join token is wrong"));
  s = Register("g1", "10.0.0.1:8000", "", "");
  EXPECT_THAT(s.message(), HasSubstr("join token is missing"));
  s = Register("g1", "10.0.0.1:8000", "", "join-me", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("capacity"));
  s = Register("g1", "nowhere", "");
  EXPECT_THAT(s.message(), HasSubstr("'nowhere' is not HOST:PORT"));
  s = Register("g1", "10.0.0.1:8000", "leader");
  EXPECT_THAT(s.message(), HasSubstr("gpuha.io/role='leader'"));
  EXPECT_TRUE(c_->NodesJson().empty()) << c_->NodesJson().dump();

  ASSERT_TRUE(Register("g1", "10.0.0.1:8000").ok());
  ASSERT_TRUE(Register("g2", "10.0.0.2:8000", "active").ok());
  ASSERT_TRUE(Register("g3", "10.0.0.3:8000", "passive").ok());
  EXPECT_EQ((*c_->NodeJson("g3"))["role"], "passive");
  EXPECT_EQ((*c_->NodeJson("g1"))["state"], "pending");
  EXPECT_FALSE(c_->AddStream({"cam-0", "acme", 1}).ok());  // nothing has joined
  for (const char* n : {"g1", "g2", "g3"}) Beat(n);
  ASSERT_TRUE(c_->AddStream({"cam-0", "acme", 1}).ok());
  v1::RouteSnapshot snap = c_->Snapshot();
  ASSERT_EQ(snap.routes_size(), 1);
  EXPECT_THAT(snap.routes(0).primary().address(),
              ::testing::AnyOf("10.0.0.1:8000", "10.0.0.2:8000"));
  EXPECT_EQ(snap.routes(0).standby().address(), "10.0.0.3:8000");
  EXPECT_GE(IndexOf("registered"), 0);

  // Restarted: the registered nodes come back from the store.
  c_.reset();
  c_ = std::make_unique<Controller>(Policy(), std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  ASSERT_EQ(c_->NodesJson().size(), 3u);
  EXPECT_EQ((*c_->NodeJson("g3"))["address"], "10.0.0.3:8000");
  EXPECT_EQ((*c_->NodeJson("g3"))["role"], "passive");
  EXPECT_EQ((*c_->NodeJson("g1"))["lifecycle"], "serving");
  // A rescheduled server: the node's new address reaches the routes, but
  // only with the token.
  EXPECT_EQ(Register("g3", "10.0.0.9:8000", "passive", "guess").code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(Register("g3", "10.0.0.9:8000", "passive").ok());
  EXPECT_EQ(c_->Snapshot().routes(0).standby().address(), "10.0.0.9:8000");
  EXPECT_GE(IndexOf("address_changed"), 0);
  // A second stream for the connected node, token and all, is refused
  // before it can move the node's traffic.
  EXPECT_EQ(Register("g3", "10.6.6.6:8000", "passive", "join-me", 10, /*proven=*/false).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(c_->Snapshot().routes(0).standby().address(), "10.0.0.9:8000");

  // Registration turned off: the registered nodes are refused.
  ControllerConfig off = Policy();
  off.registration.enabled = false;
  c_.reset();
  c_ = std::make_unique<Controller>(off, std::move(*SqliteStore::Open(db)), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  absl::Status refused = Register("g1", "10.0.0.1:8000");
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.message(), HasSubstr("registration is now off"));
}

// Adversarial finding: an agent that claimed a node the config lists was
// never asked the join token, so a tokenless impostor for a dead listed
// node was welcomed. Where a token is set, a listed node's agent proves it
// too, unless mTLS proved its name.
TEST_F(RegistrationTest, AListedNodesAgentProvesTheJoinTokenToo) {
  ControllerConfig c = Policy();
  c.nodes = {{{"n1", Role::kActive, 4}, "127.0.0.1:9001"}};
  c_ = std::make_unique<Controller>(c, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  auto hello = [](const std::string& token) {
    v1::Hello h;
    h.set_node("n1");
    if (!token.empty()) h.mutable_registration()->set_join_token(token);
    return h;
  };
  absl::Status s = c_->AgentConnected(hello(""), std::make_shared<FakeSink>(), /*proven=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("join token is missing"));
  s = c_->AgentConnected(hello("guess"), std::make_shared<FakeSink>(), /*proven=*/false);
  EXPECT_THAT(s.message(), HasSubstr("join token is wrong"));
  EXPECT_TRUE(c_->AgentConnected(hello("join-me"), std::make_shared<FakeSink>(), false).ok());
  // mTLS proved the name: no token needed.
  EXPECT_TRUE(c_->AgentConnected(hello(""), std::make_shared<FakeSink>(), true).ok());
}

// A pending node's agent that still holds a fence (the controller lost its
// state) is told to rejoin, so that its server can start and the node join.
TEST_F(RegistrationTest, APendingNodesFencedAgentIsToldToRejoin) {
  c_ = std::make_unique<Controller>(Policy(), std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  ASSERT_TRUE(
      Register("g1", "10.0.0.1:8000", "", "join-me", 10, /*proven=*/true, /*fenced=*/true).ok());
  EXPECT_EQ(sinks_["g1"]->rejoins(), 1);
  ASSERT_TRUE(Register("g2", "10.0.0.2:8000").ok());
  EXPECT_EQ(sinks_["g2"]->rejoins(), 0);
}

// A store written before nodes waited to join: a listed node with no row
// that stored streams name keeps serving them (and is watched), instead of
// holding them while pending.
TEST_F(ControllerTest, StreamsStoredOnANodeWithNoRowKeepItServing) {
  auto store = std::make_unique<MemoryStore>();
  ASSERT_TRUE(store
                  ->Apply({{"stream", "cam-0", EncodeStream({"acme", 1, "a1", "p1"})},
                           {"meta", "epoch", "4"}})
                  .ok());
  c_ = std::make_unique<Controller>(ThreePlusOne(), std::move(store), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_EQ((*c_->NodeJson("p1"))["lifecycle"], "serving");
  EXPECT_EQ((*c_->NodeJson("a2"))["lifecycle"], "pending");
  v1::RouteSnapshot snap = c_->Snapshot();
  ASSERT_EQ(snap.routes_size(), 1);
  EXPECT_EQ(snap.routes(0).primary().node(), "a1");
}

TEST_F(RegistrationTest, WithRegistrationOffAnUnlistedNodeIsNotFound) {
  ControllerConfig c = ThreePlusOne();
  c_ = std::make_unique<Controller>(c, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  absl::Status s = Register("stranger", "10.0.0.1:8000");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("registration is off"));
}

TEST_F(RegistrationTest, MaxNodesBoundsTheCluster) {
  ControllerConfig c = Policy();
  c.registration.max_nodes = 1;
  c_ = std::make_unique<Controller>(c, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  ASSERT_TRUE(Register("g1", "10.0.0.1:8000").ok());
  EXPECT_EQ(Register("g2", "10.0.0.2:8000").code(), absl::StatusCode::kResourceExhausted);
}

// A flood of health verdicts (false alarms on half the fleet) is held by
// the quarantine breaker: no more than half the nodes out; an operator
// can still fail a node; a lost agent is never held.
TEST_F(ControllerTest, TheQuarantineBreakerHoldsAFloodOfHealthVerdicts) {
  Start();  // four nodes, quarantine_max_share 0.5
  Beat("a1", v1::NODE_HEALTH_FAILED);
  Beat("a2", v1::NODE_HEALTH_DRAINING);
  EXPECT_EQ((*c_->NodeJson("a1"))["state"], "failed");
  EXPECT_EQ((*c_->NodeJson("a2"))["state"], "failed");
  Beat("a3", v1::NODE_HEALTH_FAILED);
  Beat("a3", v1::NODE_HEALTH_FAILED);
  EXPECT_NE((*c_->NodeJson("a3"))["state"], "failed") << "a third of four went out";
  EXPECT_EQ(c_->counters().quarantines_held, 1u) << "one event per hold";
  auto types = EventTypes("a3");
  EXPECT_NE(std::find(types.begin(), types.end(), "quarantine_held"), types.end());
  ASSERT_TRUE(c_->Fail("a3").ok());  // the operator decides
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "failed");
}

// Drained nodes count as out; a node whose server stopped is never held.
TEST_F(ControllerTest, TheQuarantineBreakerCountsDrainedNodesAndNeverHoldsADeadServer) {
  Start();
  ASSERT_TRUE(c_->Drain("a1", /*force=*/true).ok());
  Beat("a2", v1::NODE_HEALTH_FAILED);
  Beat("a3", v1::NODE_HEALTH_FAILED);
  EXPECT_NE((*c_->NodeJson("a3"))["state"], "failed");
  EXPECT_THAT(c_->MetricsText(), HasSubstr("gpuha_controller_quarantine_held_nodes 1"));
  v1::Heartbeat hb;  // its server stopped answering too
  hb.set_health(v1::NODE_HEALTH_FAILED);
  hb.set_epoch(c_->epoch());
  hb.mutable_server()->set_running(true);
  hb.mutable_server()->set_ready(false);
  c_->AgentHeartbeat("a3", hb);
  EXPECT_EQ((*c_->NodeJson("a3"))["state"], "failed");
  EXPECT_THAT(c_->MetricsText(), HasSubstr("gpuha_controller_quarantine_held_nodes 0"));
}

// --- stateful jobs -----------------------------------------------------------

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
