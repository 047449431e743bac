// GPUs as placement units (issue 16): nodes that run a server per GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "controller/state_codec.h"
#include "controller/testing/controller_fixture.h"

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

// Two active nodes and a passive one, each 4 GPUs of 2 streams with a
// server per GPU on port 9<node><gpu>.
ControllerConfig FourGpuNodes() {
  ControllerConfig c;
  c.redundancy = 1;
  int node = 1;
  for (const char* id : {"a1", "a2", "p1"}) {
    NodeConfig n{{id, id[0] == 'p' ? Role::kPassive : Role::kActive, 8}, "127.0.0.1:8000"};
    for (uint32_t g = 0; g < 4; ++g) {
      n.gpu_servers.push_back({g, absl::StrCat("127.0.0.1:9", node, g), 2});
    }
    c.nodes.push_back(n);
    ++node;
  }
  c.tenants = {"acme"};
  c.startup_grace = milliseconds(0);
  c.healthy_for = milliseconds(500);
  return c;
}

class GpuUnitsTest : public ControllerTest {
 protected:
  void StartGpus(ControllerConfig config = FourGpuNodes(),
                 std::unique_ptr<Store> store = std::make_unique<MemoryStore>()) {
    config_ = config;
    c_ = std::make_unique<Controller>(config, std::move(store), &clock_, &fencer_);
    ASSERT_TRUE(c_->Recover().ok());
    for (const NodeConfig& n : config.nodes) Connect(n.spec.id);
    for (const NodeConfig& n : config.nodes) BeatGpus(n.spec.id);
  }
  // A healthy agent whose GPU servers are all ready, but for `down` (the
  // server's place in the node's gpu_servers -> its health, HEALTHY meaning
  // only its server is not ready).
  void BeatGpus(const std::string& node, const std::map<uint32_t, v1::NodeHealth>& down = {}) {
    v1::Heartbeat hb;
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.mutable_server()->set_running(true);
    hb.mutable_server()->set_ready(true);
    uint32_t place = 0;
    for (const GpuServerConfig& g : NodeCfg(node).gpu_servers) {
      v1::GpuHealth* h = hb.add_gpu_health();
      h->set_index(g.index);
      if (g.slice) h->set_slice(*g.slice);
      h->set_health(v1::NODE_HEALTH_HEALTHY);
      h->set_server_ready(true);
      if (auto it = down.find(place++); it != down.end()) {
        h->set_health(it->second);
        h->set_server_ready(it->second != v1::NODE_HEALTH_HEALTHY);
        v1::HealthReason* r = h->add_reasons();
        r->set_code(g.slice ? absl::StrCat("gpu", g.index, ".mig", *g.slice, ".lost")
                            : absl::StrCat(g.Name(), ".xid48"));
        r->set_detail(g.slice ? "MIG instance is gone" : "double-bit ECC error");
      }
    }
    c_->AgentHeartbeat(node, hb);
  }
  const NodeConfig& NodeCfg(const std::string& node) const {
    return *std::find_if(config_.nodes.begin(), config_.nodes.end(),
                         [&](const NodeConfig& n) { return n.spec.id == node; });
  }
  ControllerConfig config_;
  std::map<std::string, std::string> Primaries() {
    std::map<std::string, std::string> out;
    for (const auto& s : c_->StreamsJson()) out[s["id"]] = s["primary"];
    return out;
  }
  nlohmann::json Unit(const std::string& node, int gpu) {
    auto n = c_->NodeJson(node);
    EXPECT_TRUE(n.ok());
    return (*n)["gpu_units"][gpu];
  }
};

TEST_F(GpuUnitsTest, StreamsArePlacedOnGpusWithRoutesToEachGpusServer) {
  StartGpus();
  AddStreams(8);
  for (const auto& [stream, unit] : Primaries()) {
    EXPECT_TRUE(unit.rfind("a1/gpu", 0) == 0 || unit.rfind("a2/gpu", 0) == 0) << unit;
  }
  v1::RouteSnapshot snap = c_->Snapshot();
  ASSERT_EQ(snap.routes_size(), 8);
  for (const v1::Route& r : snap.routes()) {
    const std::string node = NodeOfUnit(r.primary().node());
    const GpuServerConfig* gpu = GpuServerOfUnit(NodeCfg(node), r.primary().node());
    ASSERT_NE(gpu, nullptr) << r.primary().node();
    EXPECT_EQ(r.primary().address(), absl::StrCat("127.0.0.1:9", node == "a1" ? 1 : 2, gpu->index));
    EXPECT_EQ(NodeOfUnit(r.standby().node()), "p1");  // the passive, another host
  }
  // Each active GPU is an endpoint; the passive's are not.
  EXPECT_EQ(snap.active_size(), 8);
  auto cap = c_->CapacityJson();
  EXPECT_EQ(cap["total_units"], 24);
  EXPECT_EQ(cap["failover_reserve_units"], 8);  // a whole node, not a GPU
  EXPECT_EQ(cap["headroom_units"], 24 - 8 - 8);
  EXPECT_EQ(cap["gpu_failures_absorbed"], 4);  // 8 units of headroom, 2 per GPU
}

// A store that counts the batches written to it.
class BatchCountingStore : public MemoryStore {
 public:
  absl::Status Apply(const std::vector<StoreWrite>& batch) override {
    ++batches;
    return MemoryStore::Apply(batch);
  }
  int batches = 0;
};

// A call into the controller writes what it changed once (Controller::Step):
// a heartbeat that takes two GPUs out, their streams moved, is one store
// batch, which holds both GPUs' streams where they went.
TEST_F(GpuUnitsTest, AHeartbeatThatTakesTwoGpusOutIsOneStoreBatch) {
  auto store = std::make_unique<BatchCountingStore>();
  BatchCountingStore* counted = store.get();
  StartGpus(FourGpuNodes(), std::move(store));
  AddStreams(8);
  counted->batches = 0;
  BeatGpus("a1", {{0, v1::NODE_HEALTH_FAILED}, {1, v1::NODE_HEALTH_FAILED}});
  EXPECT_FALSE(Unit("a1", 0)["in_service"]);
  EXPECT_FALSE(Unit("a1", 1)["in_service"]);
  EXPECT_EQ(counted->batches, 1);
  const std::map<std::string, std::string> rows = *counted->Load("stream");
  for (const auto& [stream, unit] : Primaries()) {
    EXPECT_NE(unit, "a1/gpu0");
    EXPECT_NE(unit, "a1/gpu1");
    absl::StatusOr<StreamRecord> r = DecodeStream(stream, rows.at(stream));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->primary, unit) << stream;
  }
}

TEST_F(GpuUnitsTest, OneGpusFaultMovesThatGpusStreamsOnly) {
  StartGpus();
  AddStreams(8);
  std::map<std::string, std::string> before = Primaries();
  int on_gpu = 0;
  for (const auto& [s, unit] : before) on_gpu += unit == "a1/gpu2";
  ASSERT_GT(on_gpu, 0);
  BeatGpus("a1", {{2, v1::NODE_HEALTH_FAILED}});
  std::map<std::string, std::string> after = Primaries();
  int moved = 0;
  for (const auto& [s, unit] : before) {
    if (unit == "a1/gpu2") {
      EXPECT_EQ(NodeOfUnit(after[s]), "p1") << s;
      ++moved;
    } else {
      EXPECT_EQ(after[s], unit) << s;  // a1's other GPUs serve on
    }
  }
  EXPECT_EQ(moved, on_gpu);
  auto node = c_->NodeJson("a1");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ((*node)["state"], "alive");
  EXPECT_EQ((*node)["lifecycle"], "serving");
  EXPECT_FALSE(Unit("a1", 2)["in_service"]);
  EXPECT_TRUE(Unit("a1", 1)["in_service"]);
  EXPECT_EQ(Unit("a1", 2)["health"], "failed");
  EXPECT_EQ(Unit("a1", 2)["reasons"][0]["code"], "gpu2.xid48");
  EXPECT_EQ(c_->counters().gpu_failovers, 1u);
  EXPECT_EQ(c_->counters().failovers, 0u);  // no node failed over
  EXPECT_THAT(c_->MetricsText(), HasSubstr("gpuha_controller_gpu_up{node=\"a1\",gpu=\"2\"} 0"));
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("gpu_out"));
  EXPECT_TRUE(sinks_["a1"]->fences() == 0);

  // Healthy and ready again: back after healthy_for, nothing moves back.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(milliseconds(50));
    BeatGpus("a1");
  }
  EXPECT_TRUE(Unit("a1", 2)["in_service"]);
  EXPECT_THAT(EventTypes("a1"), ::testing::Contains("gpu_back"));
  EXPECT_EQ(Primaries(), after);
}

// Two active nodes and a passive one, each one GPU in four MIG instances
// of one stream, a server per instance.
ControllerConfig MigNodes() {
  ControllerConfig c = FourGpuNodes();
  for (NodeConfig& n : c.nodes) {
    for (GpuServerConfig& g : n.gpu_servers) {
      g.slice = g.index;
      g.index = 0;
      g.capacity = 1;
      g.profile = "1g.10gb";
    }
  }
  return c;
}

TEST_F(GpuUnitsTest, ALostMigInstanceMovesThatSlicesStreamsOnly) {
  StartGpus(MigNodes());
  AddStreams(6);
  std::map<std::string, std::string> before = Primaries();
  for (const auto& [s, unit] : before) {
    EXPECT_THAT(unit, ::testing::MatchesRegex("a[12]/gpu0/mig[0-3]")) << s;
  }
  std::string hit_unit;
  for (const auto& [s, unit] : before) {
    if (NodeOfUnit(unit) == "a1") hit_unit = unit;
  }
  ASSERT_FALSE(hit_unit.empty());
  const uint32_t slot = static_cast<uint32_t>(hit_unit.back() - '0');
  // The agent reports the lost instance on its own entry; GPU 0 serves on.
  BeatGpus("a1", {{slot, v1::NODE_HEALTH_FAILED}});
  std::map<std::string, std::string> after = Primaries();
  for (const auto& [s, unit] : before) {
    if (unit == hit_unit) {
      EXPECT_EQ(NodeOfUnit(after[s]), "p1") << s;
    } else {
      EXPECT_EQ(after[s], unit) << s;  // the GPU's other slices serve on
    }
  }
  nlohmann::json lost = Unit("a1", static_cast<int>(slot));
  EXPECT_EQ(lost["unit"], hit_unit);
  EXPECT_EQ(lost["slice"], slot);
  EXPECT_EQ(lost["profile"], "1g.10gb");
  EXPECT_FALSE(lost["in_service"]);
  EXPECT_EQ(lost["reasons"][0]["code"], absl::StrCat("gpu0.mig", slot, ".lost"));
  EXPECT_EQ(c_->counters().failovers, 0u);
  EXPECT_THAT(c_->MetricsText(),
              HasSubstr(absl::StrCat("gpuha_controller_gpu_up{node=\"a1\",gpu=\"0\",slice=\"", slot,
                                     "\"} 0")));
  EXPECT_THAT(
      EventDetails("a1"),
      ::testing::Contains(HasSubstr(absl::StrCat("gpu0/mig", slot, ": 1 stream(s) moved"))));
  auto cap = c_->CapacityJson();
  EXPECT_EQ(cap["gpu_failures_absorbed"], 0);  // a whole GPU is 4 slices
  EXPECT_EQ(cap["slice_failures_absorbed"], cap["headroom_units"]);
}

TEST_F(GpuUnitsTest, AGpuWhoseServerIsNotReadyIsTakenOutAlone) {
  StartGpus();
  AddStreams(8);
  BeatGpus("a2", {{0, v1::NODE_HEALTH_HEALTHY}});  // GPU fine, its server stuck
  EXPECT_FALSE(Unit("a2", 0)["in_service"]);
  EXPECT_TRUE(Unit("a2", 3)["in_service"]);
  EXPECT_EQ(Unit("a2", 0)["server_ready"], false);
  for (const auto& [s, unit] : Primaries()) EXPECT_NE(unit, "a2/gpu0") << s;
}

TEST_F(GpuUnitsTest, ANodeLevelFaultTakesAllItsGpus) {
  StartGpus();
  AddStreams(8);
  Beat("a1", v1::NODE_HEALTH_FAILED);
  for (const auto& [s, unit] : Primaries()) EXPECT_NE(NodeOfUnit(unit), "a1") << s;
  for (int g = 0; g < 4; ++g) EXPECT_FALSE(Unit("a1", g)["in_service"]) << g;
  EXPECT_EQ(c_->counters().failovers, 1u);
  EXPECT_EQ(sinks_["a1"]->fences(), 1);
}

TEST_F(GpuUnitsTest, ANodeJoinsOnceEachGpuServerIsReadyOrItsGpuIsDown) {
  ControllerConfig config = config_ = FourGpuNodes();
  c_ = std::make_unique<Controller>(config, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  Connect("a1");
  // Its node server answers, but GPU 1's server is still starting.
  v1::Heartbeat hb;
  hb.set_health(v1::NODE_HEALTH_HEALTHY);
  hb.set_epoch(c_->epoch());
  hb.mutable_server()->set_ready(true);
  for (uint32_t g = 0; g < 4; ++g) {
    v1::GpuHealth* h = hb.add_gpu_health();
    h->set_index(g);
    h->set_health(v1::NODE_HEALTH_HEALTHY);
    h->set_server_ready(g != 1);
  }
  c_->AgentHeartbeat("a1", hb);
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "pending");
  // GPU 1 is found failed: the node joins without it.
  BeatGpus("a1", {{1, v1::NODE_HEALTH_FAILED}});
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_TRUE(Unit("a1", 0)["in_service"]);
  EXPECT_FALSE(Unit("a1", 1)["in_service"]);
}

TEST_F(GpuUnitsTest, TheQuarantineBreakerCountsGpus) {
  StartGpus();  // 12 GPUs; 0.5 allows 6 out
  // a1's four go out; two more of a2's may go, the third is held.
  BeatGpus("a1", {{0, v1::NODE_HEALTH_DRAINING},
                  {1, v1::NODE_HEALTH_DRAINING},
                  {2, v1::NODE_HEALTH_DRAINING},
                  {3, v1::NODE_HEALTH_DRAINING}});
  BeatGpus("a2", {{0, v1::NODE_HEALTH_DRAINING},
                  {1, v1::NODE_HEALTH_DRAINING},
                  {2, v1::NODE_HEALTH_DRAINING}});
  EXPECT_FALSE(Unit("a2", 0)["in_service"]);
  EXPECT_FALSE(Unit("a2", 1)["in_service"]);
  EXPECT_TRUE(Unit("a2", 2)["in_service"]);  // held: its server still answers
  EXPECT_EQ(c_->counters().quarantines_held, 1u);
  EXPECT_THAT(EventTypes("a2"), ::testing::Contains("quarantine_held"));
}

TEST_F(GpuUnitsTest, ARegisteredNodeKeepsItsGpuServersAndDomainAcrossARestart) {
  ControllerConfig config;
  config.redundancy = 1;
  config.registration.enabled = true;
  config.registration.domain_labels = {"rack", "zone"};
  config.tenants = {"acme"};
  config.startup_grace = milliseconds(0);
  auto store = std::make_unique<MemoryStore>();
  MemoryStore* raw = store.get();
  c_ = std::make_unique<Controller>(config, std::move(store), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  v1::Hello hello;
  hello.set_node("g1");
  v1::Registration* reg = hello.mutable_registration();
  reg->set_address("127.0.0.1:8000");
  (*reg->mutable_labels())["rack"] = "r7";
  // GPU 0 whole, GPU 1 as two MIG instances.
  for (uint32_t i = 0; i < 3; ++i) {
    v1::GpuServer* s = reg->add_gpu_servers();
    s->set_index(i == 0 ? 0 : 1);
    if (i > 0) {
      s->set_slice(i - 1);
      s->set_profile("3g.40gb+me");
    }
    s->set_address(absl::StrCat("127.0.0.1:910", i));
    s->set_grpc_address(absl::StrCat("127.0.0.1:920", i));
    s->set_capacity(3);
  }
  sinks_["g1"] = std::make_shared<FakeSink>();
  ASSERT_TRUE(c_->AgentConnected(hello, sinks_["g1"], true).ok());
  auto node = c_->NodeJson("g1");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ((*node)["capacity"], 9);
  EXPECT_EQ((*node)["domain"], "r7");
  ASSERT_EQ((*node)["gpu_units"].size(), 3u);
  EXPECT_EQ((*node)["gpu_units"][1]["address"], "127.0.0.1:9101");
  EXPECT_EQ((*node)["gpu_units"][2]["unit"], "g1/gpu1/mig1");
  EXPECT_EQ((*node)["gpu_units"][2]["profile"], "3g.40gb+me");
  EXPECT_TRUE((*node)["gpu_units"][0]["slice"].is_null());
  auto rows = raw->Load("node");
  ASSERT_TRUE(rows.ok());
  absl::StatusOr<NodeRecord> r = DecodeNode("g1", rows->at("g1"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->registered.has_value());
  EXPECT_EQ(r->registered->domain, "r7");
  ASSERT_EQ(r->registered->gpu_servers.size(), 3u);
  EXPECT_EQ(r->registered->gpu_servers[0].capacity, 3);
  EXPECT_EQ(r->registered->gpu_servers[2].slice, 1u);
  EXPECT_EQ(r->registered->gpu_servers[2].profile, "3g.40gb+me");
  EXPECT_FALSE(r->registered->gpu_servers[0].slice.has_value());
  EXPECT_EQ(r->registered->gpu_servers[1].grpc_address, "127.0.0.1:9201");
  // The gRPC port of each unit is kept for the routes (issue 18).
  NodeConfig cfg{
      {"g1", Role::kActive, 9, false, "", ""}, "127.0.0.1:8000", r->registered->gpu_servers};
  EXPECT_EQ(UnitGrpcAddress(cfg, "g1/gpu1/mig1"), "127.0.0.1:9202");
  EXPECT_EQ(UnitGrpcAddress(cfg, "g1"), "");

  // Bad registrations name the field.
  v1::Hello bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->mutable_gpu_servers(2)->set_slice(0);
  absl::Status s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gpu_servers[2].slice: gpu1/mig0 is listed twice"));
  bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->mutable_gpu_servers(1)->set_index(0);
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gpu_servers[1].slice: GPU 0 is listed both whole and by slices"));
  bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->mutable_gpu_servers(1)->set_profile("3g 40gb");
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gpu_servers[1].profile: '3g 40gb' must be"));
  bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->mutable_gpu_servers(0)->set_index(1);
  bad.mutable_registration()->mutable_gpu_servers(1)->set_index(1);
  bad.mutable_registration()->mutable_gpu_servers(1)->clear_slice();
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gpu_servers[1].index: gpu1 is listed twice"));
  bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->mutable_gpu_servers(1)->set_grpc_address("nowhere");
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gpu_servers[1].grpc_address: 'nowhere' is not HOST:PORT"));
  bad = hello;
  bad.set_node("g2");
  bad.mutable_registration()->set_grpc_address("nowhere");
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("registration grpc_address 'nowhere' is not HOST:PORT"));
  bad = hello;
  bad.set_node("g3");
  (*bad.mutable_registration()->mutable_labels())["rack"] = "r 7";
  s = c_->AgentConnected(bad, std::make_shared<FakeSink>(), true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("label rack='r 7' must be"));
}

// A GPU whose server never comes up, or that its agent does not list,
// holds its node back for kGpuJoinWait only; it then stays out alone.
TEST_F(GpuUnitsTest, AGpuThatNeverComesUpHoldsTheJoinBackOnlySoLong) {
  ControllerConfig config = config_ = FourGpuNodes();
  c_ = std::make_unique<Controller>(config, std::make_unique<MemoryStore>(), &clock_, &fencer_);
  ASSERT_TRUE(c_->Recover().ok());
  Connect("a1");
  auto beat = [&] {  // GPU 1's server crash-loops; GPU 3 is not listed at all
    v1::Heartbeat hb;
    hb.set_health(v1::NODE_HEALTH_HEALTHY);
    hb.set_epoch(c_->epoch());
    hb.mutable_server()->set_ready(true);
    for (uint32_t g : {0u, 1u, 2u}) {
      v1::GpuHealth* h = hb.add_gpu_health();
      h->set_index(g);
      h->set_health(v1::NODE_HEALTH_HEALTHY);
      h->set_server_ready(g != 1);
    }
    c_->AgentHeartbeat("a1", hb);
  };
  beat();
  clock_.Advance(std::chrono::seconds(9));
  beat();
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "pending");
  clock_.Advance(std::chrono::seconds(2));
  beat();
  EXPECT_EQ((*c_->NodeJson("a1"))["lifecycle"], "serving");
  EXPECT_TRUE(Unit("a1", 0)["in_service"]);
  EXPECT_FALSE(Unit("a1", 1)["in_service"]);
  EXPECT_FALSE(Unit("a1", 3)["in_service"]);
}

}  // namespace
}  // namespace gpuha::controller
