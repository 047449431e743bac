// The controller's failover logic: placement, admission, detection, fencing
// and joining. On a fake clock, a memory store, fake agent sinks and a fake
// fence hook: no sockets, no sleeps. Its other behaviours are in the
// controller_*_test.cc files beside it.
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

}  // namespace
}  // namespace gpuha::controller
