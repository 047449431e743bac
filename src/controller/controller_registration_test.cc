// Agents that register their nodes, the join token, removal, and the
// quarantine breaker.
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

}  // namespace
}  // namespace gpuha::controller
