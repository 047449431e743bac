// The controller's writes: a drain, an API change confirmed once stored, failed
// store writes, and a leader whose lease ended acting no more.
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

}  // namespace
}  // namespace gpuha::controller
