// The controller's network faces: the HTTP API's auth and validation, and a
// real agent (the library, in-process) and route watcher over gRPC.
#include "controller/service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/agent.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_certs.h"
#include "controller/operator_api.h"
#include "controller/standby_server.h"

namespace gpuha::controller {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

ControllerConfig Config() {
  ControllerConfig c;
  c.redundancy = 1;
  c.nodes = {{{"n1", Role::kActive, 4}, "127.0.0.1:9001"},
             {{"n2", Role::kActive, 4}, "127.0.0.1:9002"},
             {{"n3", Role::kPassive, 4}, "127.0.0.1:9003"}};
  c.tenants = {"acme"};
  c.grpc_listen = "127.0.0.1:0";
  c.http_listen = "127.0.0.1:0";
  c.startup_grace = milliseconds(0);
  c.tokens[Sha256Hex("admin-token")] = {"admin", ApiRole::kAdmin};
  c.tokens[Sha256Hex("op-token")] = {"ops", ApiRole::kOperator};
  c.tokens[Sha256Hex("view-token")] = {"dash", ApiRole::kViewer};
  return c;
}

class ApiTest : public ::testing::Test {
 protected:
  ApiTest()
      : config_(Config()),
        controller_(
            config_,
            [this] {
              auto store = std::make_unique<MemoryStore>();
              store_ = store.get();
              return store;
            }(),
            common::RealClock::Get(), &fencer_),
        server_(&controller_, config_) {
    EXPECT_TRUE(controller_.Recover().ok());
    // Every node joins: its agent connects and its server is ready.
    for (const NodeConfig& n : config_.nodes) {
      v1::Hello hello;
      hello.set_node(n.spec.id);
      EXPECT_TRUE(controller_.AgentConnected(hello, std::make_shared<NullSink>(), true).ok());
      v1::Heartbeat hb;
      hb.set_health(v1::NODE_HEALTH_HEALTHY);
      hb.mutable_server()->set_running(true);
      hb.mutable_server()->set_ready(true);
      controller_.AgentHeartbeat(n.spec.id, hb);
    }
  }
  struct NullSink : AgentSink {
    void Send(const v1::ControllerMessage&) override {}
  };
  static common::HttpRequest Request(const std::string& method, const std::string& target,
                                     const std::string& token, const std::string& body) {
    common::HttpRequest r;
    r.method = method;
    r.target = target;
    r.path = target.substr(0, target.find('?'));
    if (!token.empty()) r.headers["authorization"] = "Bearer " + token;
    r.body = body;
    return r;
  }
  common::HttpResponse Call(const std::string& method, const std::string& target,
                            const std::string& token, const std::string& body = "") {
    return server_.HandleHttp(Request(method, target, token, body));
  }
  ShellFenceRunner fencer_;
  MemoryStore* store_ = nullptr;  // controller_'s
  ControllerConfig config_;
  Controller controller_;
  ControllerServer server_;
};

// Another controller's view of the same store, as standbys on etcd share it.
class BorrowedStore : public Store {
 public:
  explicit BorrowedStore(Store* s) : s_(s) {}
  const char* Kind() const override { return "etcd"; }
  absl::Status Apply(const std::vector<StoreWrite>& batch) override { return s_->Apply(batch); }
  absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& table) override {
    return s_->Load(table);
  }
  absl::StatusOr<int64_t> AppendEvent(const std::string& json) override {
    return s_->AppendEvent(json);
  }
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(int64_t after_id,
                                                                          size_t limit) override {
    return s_->LoadEvents(after_id, limit);
  }

 private:
  Store* s_;
};

// A router's route watch on a controller's gRPC port, its hello sent.
struct RouteWatcher {
  explicit RouteWatcher(int port, bool takes_standby_routes = true)
      : channel(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                    grpc::InsecureChannelCredentials())),
        stub(v1::RouteService::NewStub(channel)),
        stream(stub->Watch(&ctx)) {
    v1::RouteAck hello;
    hello.set_router("r1");
    hello.set_takes_standby_routes(takes_standby_routes);
    hello_sent = stream->Write(hello);
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::RouteService::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RouteAck, v1::RouteSnapshot>> stream;
  bool hello_sent = false;
};

TEST_F(ApiTest, TokensAndRolesGateTheApi) {
  EXPECT_EQ(Call("GET", "/api/v1/nodes", "").status, 401);
  EXPECT_EQ(Call("GET", "/api/v1/nodes", "wrong").status, 401);
  EXPECT_EQ(Call("GET", "/api/v1/nodes", "view-token").status, 200);
  auto r = Call("POST", "/api/v1/streams", "view-token", R"({"id":"s","tenant":"acme"})");
  EXPECT_EQ(r.status, 403);
  EXPECT_THAT(r.body, HasSubstr("needs the operator role"));
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/role", "op-token", R"({"role":"passive"})").status, 403);
  // Freeing a registered node from its agent's IP lets another host claim it.
  r = Call("POST", "/api/v1/nodes/n1/rebind", "op-token");
  EXPECT_EQ(r.status, 403);
  EXPECT_THAT(r.body, HasSubstr("needs the admin role"));
  r = Call("POST", "/api/v1/nodes/n1/rebind", "admin-token");
  EXPECT_EQ(r.status, 409) << r.body;  // a listed node: nothing binds it
  EXPECT_THAT(r.body, HasSubstr("listed in the config"));
  // Forgetting a node is as much as changing its role: admin.
  r = Call("DELETE", "/api/v1/nodes/n1", "op-token");
  EXPECT_EQ(r.status, 403);
  r = Call("DELETE", "/api/v1/nodes/n1", "admin-token");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_THAT(r.body, HasSubstr("listed in the config"));
  EXPECT_EQ(Call("DELETE", "/api/v1/nodes/nope", "admin-token").status, 404);
  // A job runs a command on GPU nodes (adversarial finding: the operator
  // role ran `/bin/sh -c id` as root on an agent): admin only.
  r = Call("POST", "/api/v1/jobs", "op-token",
           R"({"id":"j","command":["/bin/sh","-c","id"],"checkpoint_dir":"/tmp/j"})");
  EXPECT_EQ(r.status, 403);
  EXPECT_THAT(r.body, HasSubstr("needs the admin role"));
  EXPECT_EQ(Call("GET", "/metrics", "").status, 200);  // scrapers need no token
}

// The operator API's table (operator_api.cc), route by route: every view
// answers a viewer, every change refuses one naming the role it needs.
TEST_F(ApiTest, TheOperatorApiTableGatesEachRouteByItsRole) {
  auto api = [&](const std::string& method, const std::string& path, const std::string& token,
                 const nlohmann::json& extra = nlohmann::json::object()) {
    return OperatorApi(&controller_, config_, Request(method, path, token, "{}"), extra);
  };
  for (const char* view : {"nodes", "nodes/n1", "streams", "jobs", "tenants", "failovers",
                           "history", "routers", "capacity", "status", "events"}) {
    EXPECT_EQ(api("GET", absl::StrCat("/api/v1/", view), "view-token").status, 200) << view;
  }
  struct Change {
    const char* method;
    const char* path;
    const char* needs;
  };
  for (const Change& c :
       {Change{"DELETE", "nodes/n1", "admin"}, Change{"POST", "nodes/n1/drain", "operator"},
        Change{"POST", "nodes/n1/undrain", "operator"}, Change{"POST", "nodes/n1/fail", "operator"},
        Change{"POST", "nodes/n1/rebind", "admin"}, Change{"POST", "nodes/n1/role", "admin"},
        Change{"POST", "nodes/n1/reboot", "operator"}, Change{"POST", "streams", "operator"},
        Change{"DELETE", "streams/s", "operator"}, Change{"POST", "jobs", "admin"},
        Change{"DELETE", "jobs/j", "operator"},
        Change{"POST", "jobs/j/confirm-fenced", "operator"}}) {
    auto r = api(c.method, absl::StrCat("/api/v1/", c.path), "view-token");
    EXPECT_EQ(r.status, 403) << c.method << " " << c.path;
    EXPECT_THAT(r.body,
                HasSubstr(absl::StrCat("needs the ", c.needs, " role; the token has viewer")))
        << c.method << " " << c.path;
  }
  auto r = api("PUT", "/api/v1/nodes", "admin-token");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr("no PUT /api/v1/nodes"));
  EXPECT_EQ(api("GET", "/api/v1/tenants/acme", "admin-token").status, 404);
  r = api("POST", "/api/v1/nodes/n1/reboot", "admin-token");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr("no operation 'reboot' on nodes"));
  r = api("GET", "/api/v1/status", "view-token", {{"role", "standby"}});
  EXPECT_EQ(nlohmann::json::parse(r.body).value("role", ""), "standby");
  EXPECT_EQ(api("POST", "/dashboard", "").status, 405);
}

TEST_F(ApiTest, StreamsAreAddedValidatedAndRemoved) {
  auto r =
      Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-1","tenant":"acme","weight":2})");
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(json::parse(r.body)["standby"], "n3");
  EXPECT_EQ(Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-1","tenant":"acme"})").status,
            409);
  r = Call("POST", "/api/v1/streams", "op-token", R"({"id":"x","tenant":"acme","weight":"2"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("weight: must be an integer"));
  r = Call("POST", "/api/v1/streams", "op-token", R"({"id":"x","tenant":"acme","colour":1})");
  EXPECT_THAT(r.body, HasSubstr("colour: unknown field"));
  r = Call("POST", "/api/v1/streams", "op-token", R"({"tenant":"acme"})");
  EXPECT_THAT(r.body, HasSubstr("id: a non-empty string is required"));
  EXPECT_EQ(Call("POST", "/api/v1/streams", "op-token", "{not json").status, 400);
  r = Call("POST", "/api/v1/streams", "op-token", R"({"id":"y","tenant":"initech"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("tenant: 'initech' is not a known tenant"));
  EXPECT_EQ(Call("GET", "/api/v1/streams/cam-1", "view-token").status, 200);
  EXPECT_EQ(Call("GET", "/api/v1/streams/nope", "view-token").status, 404);
  EXPECT_EQ(Call("DELETE", "/api/v1/streams/cam-1", "op-token").status, 200);
  EXPECT_EQ(Call("DELETE", "/api/v1/streams/cam-1", "op-token").status, 404);
  // Nothing half-applied: the refused and invalid requests left no stream.
  EXPECT_EQ(json::parse(Call("GET", "/api/v1/streams", "view-token").body).size(), 0u);
}

TEST_F(ApiTest, AdmissionPastNPlusOneIs409WithTheArithmetic) {
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(Call("POST", "/api/v1/streams", "op-token",
                   json{{"id", "s" + std::to_string(i)}, {"tenant", "acme"}}.dump())
                  .status,
              201);
  }
  auto r = Call("POST", "/api/v1/streams", "op-token", R"({"id":"s8","tenant":"acme"})");
  EXPECT_EQ(r.status, 409);
  EXPECT_THAT(r.body, HasSubstr("8 admitted + 1 > 8 survivable"));
  auto cap = json::parse(Call("GET", "/api/v1/capacity", "view-token").body);
  EXPECT_EQ(cap["max_production_units"], 8);
  EXPECT_EQ(cap["headroom_units"], 0);
}

TEST_F(ApiTest, NodeOperationsAndUnknownsAnswer404) {
  EXPECT_EQ(Call("GET", "/api/v1/nodes/ghost", "view-token").status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/ghost/drain", "op-token").status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/explode", "op-token").status, 404);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/fail", "op-token").status, 200);
  EXPECT_EQ(Call("POST", "/api/v1/nodes/n1/fail", "op-token").status, 409);
  auto r = Call("POST", "/api/v1/nodes/n2/role", "admin-token", R"({"role":"primary"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("role: 'primary' is not one of"));
  auto events = json::parse(Call("GET", "/api/v1/events?after=0", "view-token").body);
  EXPECT_FALSE(events.empty());
  EXPECT_EQ(Call("GET", "/api/v1/events?after=x", "view-token").status, 400);
}

// A deposed controller answers as one that does not lead: probes and
// clients (ctl, the demo) go on to the one that does.
TEST_F(ApiTest, ADeposedControllerAnswers503) {
  EXPECT_EQ(Call("GET", "/healthz", "").status, 200);
  controller_.StopActing("lease lapsed");
  auto r = Call("GET", "/healthz", "");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["leading"], false);
  EXPECT_EQ(Call("GET", "/api/v1/streams", "view-token").status, 503);
  r = Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-1","tenant":"acme"})");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("no longer leads"));
  EXPECT_EQ(Call("GET", "/metrics", "").status, 200);  // it still says what it is
}

// A standby on etcd serves the read API from the store the leader writes,
// writes nothing itself, and sends writes to the leader.
TEST_F(ApiTest, AStandbyServesReadsFromTheStoreAndRedirectsWrites) {
  ASSERT_EQ(Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-1","tenant":"acme"})").status,
            201);
  const size_t events = store_->LoadEvents(0, SIZE_MAX)->size();
  auto state = std::make_shared<Controller>(config_, std::make_unique<BorrowedStore>(store_),
                                            common::RealClock::Get(), &fencer_);
  ASSERT_TRUE(state->LoadAsStandby().ok());
  EXPECT_FALSE(state->acting());
  EXPECT_EQ(state->epoch(), controller_.epoch());  // the leader's, not a new one
  EXPECT_EQ(store_->Load("meta")->at("epoch"), std::to_string(controller_.epoch()));
  EXPECT_EQ(store_->LoadEvents(0, SIZE_MAX)->size(), events) << "a standby wrote an event";

  StandbyServer standby(config_);
  standby.Set(state, "127.0.0.1:7402", "");
  auto call = [&](const std::string& method, const std::string& target, const std::string& token,
                  const std::string& body = "") {
    return standby.HandleHttp(Request(method, target, token, body));
  };
  auto r = call("GET", "/api/v1/streams", "view-token");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("cam-1"));
  EXPECT_EQ(call("GET", "/api/v1/streams", "").status, 401);  // its tokens still hold
  EXPECT_EQ(call("GET", "/api/v1/nodes/n1", "view-token").status, 200);
  EXPECT_EQ(call("GET", "/api/v1/status", "").status, 401);
  r = call("GET", "/api/v1/status", "view-token");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["leading"], false);
  EXPECT_EQ(json::parse(r.body)["role"], "standby");
  EXPECT_EQ(json::parse(r.body)["leader"], "127.0.0.1:7402");
  // The version the leader committed with this state.
  EXPECT_EQ(json::parse(r.body)["route_version"], controller_.route_version());
  // What etcd holds, and nothing it does not: live fields are null.
  r = call("GET", "/api/v1/nodes/n1", "view-token");
  EXPECT_EQ(json::parse(r.body)["state"], "serving");
  EXPECT_TRUE(json::parse(r.body)["connected"].is_null());
  // The leader's memory only: the standby sends the reader there.
  EXPECT_EQ(call("GET", "/api/v1/routers", "view-token").status, 307);
  // Probes and load balancers find the leader: /healthz says who it is.
  r = call("GET", "/healthz", "");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["leader"], "127.0.0.1:7402");
  EXPECT_EQ(call("GET", "/livez", "").status, 200);
  // Writes go to the leader, method and body kept (307).
  r = call("POST", "/api/v1/streams?x=1", "op-token", R"({"id":"cam-2","tenant":"acme"})");
  EXPECT_EQ(r.status, 307);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Location");
  EXPECT_EQ(r.headers[0].second, "http://127.0.0.1:7402/api/v1/streams?x=1");
  EXPECT_EQ(call("DELETE", "/api/v1/streams/cam-1", "op-token").status, 307);
  EXPECT_EQ(store_->Load("stream")->size(), 1u);  // nothing applied here
  r = call("GET", "/metrics", "");
  EXPECT_THAT(r.body, HasSubstr("gpuha_controller_leader{store=\"etcd\"} 0"));
  EXPECT_THAT(r.body, HasSubstr("gpuha_controller_store_up{store=\"etcd\"} 1"));

  // etcd unreachable or without quorum: it says so, and nothing is guessed.
  standby.Set(nullptr, "", "cannot read etcd: etcdserver: no leader");
  r = call("GET", "/api/v1/streams", "view-token");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("no leader"));
  r = call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-2","tenant":"acme"})");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("no leader"));
  EXPECT_THAT(call("GET", "/metrics", "").body,
              HasSubstr("gpuha_controller_store_up{store=\"etcd\"} 0"));
}

// A standby's snapshot is the leader's: the same routes under the same
// epoch and version, after each kind of change (a router takes routes of an
// equal version, so a different body under it would go unnoticed).
TEST_F(ApiTest, AStandbysRoutesAreTheLeadersUnderTheLeadersVersion) {
  auto expect_same = [&](const std::string& after) {
    SCOPED_TRACE(after);
    Controller state(config_, std::make_unique<BorrowedStore>(store_), common::RealClock::Get(),
                     &fencer_);
    ASSERT_TRUE(state.LoadAsStandby().ok());
    v1::RouteSnapshot mine = state.Snapshot();
    v1::RouteSnapshot leaders = controller_.Snapshot();
    EXPECT_EQ(mine.version(), leaders.version());
    EXPECT_EQ(mine.epoch(), leaders.epoch());
    EXPECT_EQ(mine.DebugString(), leaders.DebugString());
  };
  expect_same("recovery");
  for (const char* id : {"cam-1", "cam-2", "cam-3"}) {
    ASSERT_EQ(
        Call("POST", "/api/v1/streams", "op-token", json{{"id", id}, {"tenant", "acme"}}.dump())
            .status,
        201);
  }
  expect_same("streams added");
  ASSERT_EQ(Call("DELETE", "/api/v1/streams/cam-3", "op-token").status, 200);
  expect_same("a stream removed");
  ASSERT_EQ(Call("POST", "/api/v1/nodes/n1/fail", "op-token").status, 200);
  expect_same("a failover");
  ASSERT_EQ(Call("POST", "/api/v1/nodes/n1/role", "admin-token", R"({"role":"buffer"})").status,
            200);
  expect_same("a role change");
  controller_.RouterHello("r1", controller_.epoch() + 2, 1);
  expect_same("an epoch advanced past a router's");
  ASSERT_EQ(Call("POST", "/api/v1/nodes/n2/drain?force=true", "op-token").status, 200);
  expect_same("a drain");
}

// On listen.grpc a standby serves the route watch from the state it read,
// marked as a standby's and naming the leader, and sends agents on.
TEST_F(ApiTest, AStandbyServesTheRouteWatchAndSendsAgentsOn) {
  ASSERT_EQ(Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-1","tenant":"acme"})").status,
            201);
  auto load = [&] {
    auto state = std::make_shared<Controller>(config_, std::make_unique<BorrowedStore>(store_),
                                              common::RealClock::Get(), &fencer_);
    EXPECT_TRUE(state->LoadAsStandby().ok());
    return state;
  };
  StandbyServer standby(config_);
  ASSERT_TRUE(standby.Start().ok());
  standby.Set(load(), "127.0.0.1:7402", "");
  RouteWatcher watcher(standby.grpc_port());
  ASSERT_TRUE(watcher.hello_sent);
  auto& watch = watcher.stream;
  v1::RouteSnapshot snap;
  ASSERT_TRUE(watch->Read(&snap));
  EXPECT_TRUE(snap.standby());
  EXPECT_EQ(snap.leader(), "127.0.0.1:7402");
  EXPECT_EQ(snap.version(), controller_.route_version());
  EXPECT_EQ(snap.epoch(), controller_.epoch());
  ASSERT_EQ(snap.routes_size(), 1);
  EXPECT_EQ(snap.routes(0).stream(), "cam-1");
  v1::RouteAck ack;
  ack.set_router("r1");
  ack.set_version(snap.version());
  ASSERT_TRUE(watch->Write(ack));

  // The leader changes routes; the standby reads them again and sends them.
  ASSERT_EQ(Call("POST", "/api/v1/streams", "op-token", R"({"id":"cam-2","tenant":"acme"})").status,
            201);
  standby.Set(load(), "127.0.0.1:7402", "");
  ASSERT_TRUE(watch->Read(&snap));
  EXPECT_EQ(snap.version(), controller_.route_version());
  EXPECT_EQ(snap.routes_size(), 2);

  // A router of a version that does not know standby routes is sent on:
  // it would take this standby for the leader and stay.
  RouteWatcher older(standby.grpc_port(), /*takes_standby_routes=*/false);
  v1::RouteSnapshot none;
  EXPECT_FALSE(older.stream->Read(&none));
  grpc::Status sent_on = older.stream->Finish();
  EXPECT_EQ(sent_on.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(sent_on.error_message(), HasSubstr("goes on to the leader"));

  // An agent is refused at once, told where the leader is.
  auto agents = v1::AgentService::NewStub(watcher.channel);
  grpc::ClientContext actx;
  actx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto agent = agents->Connect(&actx);
  v1::AgentMessage m;
  m.mutable_hello()->set_node("n1");
  agent->Write(m);
  grpc::Status refused = agent->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("the leader is 127.0.0.1:7402"));

  // etcd unreadable: the standby serves no routes, and the stream ends.
  standby.Set(nullptr, "", "cannot read etcd: etcdserver: no leader");
  EXPECT_FALSE(watch->Read(&snap));
  watch->Finish().IgnoreError();
  standby.Stop();
}

class NoProcesses : public agent::ProcessRunner {
 public:
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>&) override {
    return absl::UnimplementedError("none");
  }
  std::optional<std::string> Poll(pid_t) override { return "exit 0"; }
  void Signal(pid_t, int) override {}
};

TEST(ControllerServerTest, AgentsConnectAndAStoppedAgentFailsOverWithNewRoutes) {
  ControllerConfig config = Config();
  config.tokens.clear();
  ShellFenceRunner fencer;
  Controller controller(config, std::make_unique<MemoryStore>(), common::RealClock::Get(), &fencer);
  ASSERT_TRUE(controller.Recover().ok());
  ControllerServer server(&controller, config);
  ASSERT_TRUE(server.Start().ok());
  NoProcesses runner;
  std::vector<std::unique_ptr<agent::Agent>> agents;
  for (const char* name : {"n1", "n2", "n3"}) {
    agent::AgentConfig ac;
    ac.node = name;
    ac.listen.port = 0;
    ac.controllers = {{"127.0.0.1", static_cast<uint16_t>(server.grpc_port())}};
    ac.gpu_backend = "sim";
    ac.heartbeat_ms = 20;
    auto probe = gpu::SimProbe::Create(ac.sim, common::RealClock::Get());
    agents.push_back(
        std::make_unique<agent::Agent>(ac, std::move(*probe), &runner, common::RealClock::Get()));
    ASSERT_TRUE(agents.back()->Start().ok());
  }
  for (int i = 0;
       i < 200 && !(agents[0]->connected() && agents[1]->connected() && agents[2]->connected());
       ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  // Joined: agent connected and server ready (placement uses no other).
  for (const char* n : {"n1", "n2", "n3"}) {
    for (int i = 0; i < 500 && (*controller.NodeJson(n))["lifecycle"] != "serving"; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  // Their quiet heartbeats come as UDP datagrams, to the gRPC port's number.
  EXPECT_EQ(server.datagram_port(), server.grpc_port());
  for (int i = 0; i < 300 && controller.counters().heartbeat_datagrams < 30; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_GE(controller.counters().heartbeat_datagrams, 30u);
  EXPECT_EQ(controller.counters().datagrams_refused, 0u);
  EXPECT_EQ(controller.counters().datagram_fallbacks, 0u);
  for (auto& a : agents) EXPECT_GT(a->counters().heartbeat_datagrams, 0u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(controller.AddStream({"s" + std::to_string(i), "acme", 1}).ok());
  }
  RouteWatcher watcher(server.grpc_port());
  ASSERT_TRUE(watcher.hello_sent);
  auto& watch = watcher.stream;
  v1::RouteSnapshot snap;
  ASSERT_TRUE(watch->Read(&snap));
  EXPECT_EQ(snap.routes_size(), 4);
  v1::RouteAck ack;
  ack.set_router("r1");
  ack.set_version(snap.version());
  ASSERT_TRUE(watch->Write(ack));

  agents[0]->Stop();  // the stream breaks, as when the agent is killed
  bool moved = false;
  for (int i = 0; i < 50 && !moved; ++i) {
    ASSERT_TRUE(watch->Read(&snap));
    moved = true;
    for (const auto& r : snap.routes()) moved = moved && r.primary().node() != "n1";
  }
  EXPECT_TRUE(moved);
  auto node = controller.NodeJson("n1");
  EXPECT_EQ((*node)["state"], "failed");
  watcher.ctx.TryCancel();
  watch->Finish().IgnoreError();
  for (auto& a : agents) a->Stop();
  server.Stop();
}

TEST(ControllerServerTest, MutualTlsAdmitsOnlyAgentsWithACertificateItSigned) {
  std::string dir = gpuha::testing::TestTempDir().string();
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir, {"n1"}));
  ControllerConfig config = Config();
  config.tls_ca = dir + "/ca.pem";
  config.tls_cert = dir + "/server.pem";
  config.tls_key = dir + "/server.key";
  ShellFenceRunner fencer;
  Controller controller(config, std::make_unique<MemoryStore>(), common::RealClock::Get(), &fencer);
  ASSERT_TRUE(controller.Recover().ok());
  ControllerServer server(&controller, config);
  absl::Status started = server.Start();
  ASSERT_TRUE(started.ok()) << started;
  NoProcesses runner;
  // `cert`: the client certificate's name; empty: none.
  auto make_agent = [&](const char* node, const std::string& cert) {
    agent::AgentConfig ac;
    ac.node = node;
    ac.listen.port = 0;
    ac.controllers = {{"127.0.0.1", static_cast<uint16_t>(server.grpc_port())}};
    ac.gpu_backend = "sim";
    ac.tls_ca = dir + "/ca.pem";
    if (!cert.empty()) {
      ac.tls_cert = dir + "/" + cert + ".pem";
      ac.tls_key = dir + "/" + cert + ".key";
    }
    auto probe = gpu::SimProbe::Create(ac.sim, common::RealClock::Get());
    auto a =
        std::make_unique<agent::Agent>(ac, std::move(*probe), &runner, common::RealClock::Get());
    EXPECT_TRUE(a->Start().ok());
    return a;
  };
  auto trusted = make_agent("n1", "n1");
  auto stranger = make_agent("n2", "");
  // Regression: any agent could claim any node. A certificate the CA signed
  // for another name (n1's, or the generic "agent") does not make n3.
  auto impostor = make_agent("n3", "n1");
  auto generic = make_agent("n2", "agent");
  // The agent's side says connected once its hello is written; wait for the
  // controller to have read it too.
  for (int i = 0; i < 500 && (*controller.NodeJson("n1"))["connected"] != true; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(trusted->connected());
  EXPECT_FALSE(stranger->connected());
  EXPECT_EQ((*controller.NodeJson("n1"))["connected"], true);
  EXPECT_EQ((*controller.NodeJson("n2"))["connected"], false);
  EXPECT_EQ((*controller.NodeJson("n3"))["connected"], false);
  trusted->Stop();
  stranger->Stop();
  impostor->Stop();
  generic->Stop();
  server.Stop();
}

}  // namespace
}  // namespace gpuha::controller
