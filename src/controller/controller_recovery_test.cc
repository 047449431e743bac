// Routers' acks and suspects, what enters through the API, and a controller
// that recovers its state from the store.
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
