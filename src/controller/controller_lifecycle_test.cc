// A node's lifecycle after its failover: recovery, planned agent restarts and
// their grace, flapping, N+1 overflow, refused drains, stale and second agents.
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

}  // namespace
}  // namespace gpuha::controller
