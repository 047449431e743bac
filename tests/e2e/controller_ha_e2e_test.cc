// Controllers on etcd, as real processes on loopback: one leads, the others
// stand by; kill -9 of the leader hands over within the lease's TTL, a
// planned stop (SIGTERM) hands over at once, a standby serves the read API
// from etcd and sends writes to the leader, and a leader that loses etcd
// stops acting.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "common/net_util.h"
#include "common/testing/etcd_server.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/run_command.h"

namespace gpuha::e2e {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr char kViewer[] = "demo-viewer";  // their SHA-256 are in the config below
constexpr char kAdmin[] = "demo-admin";

class ControllerHaTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd_.Start()) << etcd_.log(); }

  struct Controller {
    std::unique_ptr<ChildProcess> process;
    uint16_t http_port = 0;
    uint16_t grpc_port = 0;
  };
  // `etcd_url`: how this controller reaches etcd (default: loopback);
  // `wrap`: a command it runs under (`ip netns exec NS`).
  Controller Start(const std::string& name, const std::string& etcd_url = "",
                   const std::vector<std::string>& wrap = {}) {
    Controller c;
    c.http_port = common::FreeLoopbackPort();
    const uint16_t grpc_port = c.grpc_port = common::FreeLoopbackPort();
    std::string path = (gpuha::testing::TestTempDir() / (name + ".yaml")).string();
    std::ofstream(path) << absl::StrCat(
        "cluster: { redundancy: 1 }\n"
        "nodes:\n"
        "  - { name: gpu-1, role: active, capacity: 10, address: \"127.0.0.1:8101\" }\n"
        "  - { name: gpu-2, role: passive, capacity: 10, address: \"127.0.0.1:8102\" }\n"
        "listen: { grpc: \"127.0.0.1:",
        grpc_port, "\", http: \"127.0.0.1:", c.http_port,
        "\" }\n"
        "store: { etcd: [\"",
        etcd_url.empty() ? etcd_.url() : etcd_url,
        "\"], lease_ttl_ms: 2000 }\n"
        "tokens:\n"
        "  - { name: dashboard, role: viewer, sha256: "
        "\"2c409f0dcce66d0c980ae534d1ccdc0fc6738d7fc35d803949919f4dfa3f8834\" }\n"
        "  - { name: ops, role: admin, sha256: "
        "\"cce7a2cf1ae045989cfc914fb95a41526f167a838b3c7d33745143614abace7c\" }\n");
    std::vector<std::string> argv = wrap;
    for (const char* a : {GPUHA_BINARY, "controller", "--config"}) argv.push_back(a);
    argv.push_back(path);
    c.process = std::make_unique<ChildProcess>(argv);
    return c;
  }
  static bool Leads(Controller& c, milliseconds within) {
    return c.process->WaitForLine("gpuha controller grpc", within).has_value();
  }
  static nlohmann::json Status(const Controller& c) {
    auto r = common::HttpCall("GET", "127.0.0.1", c.http_port, "/api/v1/status", "",
                              milliseconds(2000), kViewer);
    if (!r.ok() || r->status != 200) return nlohmann::json();
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  gpuha::testing::EtcdServer etcd_;
};

TEST_F(ControllerHaTest, OneLeadsAndAStandbyTakesOverOnKillAndOnAPlannedStop) {
  Controller a = Start("a");
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  nlohmann::json status_a = Status(a);
  ASSERT_TRUE(status_a.is_object()) << a.process->err();
  EXPECT_EQ(status_a.value("store", ""), "etcd");
  auto metrics = common::HttpCall("GET", "127.0.0.1", a.http_port, "/metrics", "",
                                  milliseconds(2000), kViewer);
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(metrics->body, HasSubstr("\ngpuha_controller_leader{store=\"etcd\"} 1\n"));
  Controller b = Start("b");
  EXPECT_FALSE(Leads(b, milliseconds(1500))) << "two controllers lead at once";
  EXPECT_THAT(b.process->err(), HasSubstr("standing by to take over"));

  // kill -9: nothing is revoked; the standby leads once the lease runs out.
  auto killed = std::chrono::steady_clock::now();
  a.process->Signal(SIGKILL);
  ASSERT_TRUE(Leads(b, milliseconds(6000))) << b.process->err();
  const auto takeover = std::chrono::steady_clock::now() - killed;
  EXPECT_LT(takeover, milliseconds(2000 + 1500)) << "TTL 2 s";
  nlohmann::json status_b = Status(b);
  ASSERT_TRUE(status_b.is_object());
  EXPECT_GT(status_b.value("epoch", 0), status_a.value("epoch", 0))
      << "the new leader moves the epoch past the old one's";

  // SIGTERM: the leader revokes its lease and a standby leads at once.
  Controller c = Start("c");
  EXPECT_FALSE(Leads(c, milliseconds(1000)));
  auto stopped = std::chrono::steady_clock::now();
  b.process->Signal(SIGTERM);
  ASSERT_TRUE(Leads(c, milliseconds(3000))) << c.process->err();
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, milliseconds(1500))
      << "a planned stop waited out the lease";
  EXPECT_EQ(b.process->Wait(milliseconds(5000)), 0);
  EXPECT_GT(Status(c).value("epoch", 0), status_b.value("epoch", 0));
}

TEST_F(ControllerHaTest, AStandbyServesReadsFromEtcdAndSendsWritesToTheLeader) {
  Controller a = Start("a");
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  Controller b = Start("b");
  auto get = [](const Controller& c, const std::string& target, const char* token = kViewer) {
    return common::HttpCall("GET", "127.0.0.1", c.http_port, target, "", milliseconds(2000), token);
  };
  // The standby answers once it has read etcd: /healthz names the leader.
  nlohmann::json health;
  for (int i = 0; i < 100 && !health.contains("leader"); ++i) {
    auto r = get(b, "/healthz");
    if (r.ok()) {
      EXPECT_EQ(r->status, 503) << "a standby said it leads";
      health = nlohmann::json::parse(r->body, nullptr, false);
    }
    if (!health.contains("leader")) std::this_thread::sleep_for(milliseconds(100));
  }
  const std::string leader = absl::StrCat("127.0.0.1:", a.http_port);
  ASSERT_EQ(health.value("leader", ""), leader) << b.process->err();
  EXPECT_EQ(get(b, "/livez")->status, 200);
  // Reads come from etcd: the leader's nodes, and its events (its start).
  auto nodes = get(b, "/api/v1/nodes");
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->status, 200) << nodes->body;
  EXPECT_THAT(nodes->body, HasSubstr("gpu-2"));
  auto events = get(b, "/api/v1/events");
  ASSERT_EQ(events->status, 200);
  EXPECT_THAT(events->body, HasSubstr("controller_started"));
  EXPECT_EQ(Status(b).value("epoch", -1), Status(a).value("epoch", -2));

  // A write sent to the standby is redirected (307) to the leader, which
  // takes it; the standby shows it once etcd's watch reports it.
  const std::string body = R"({"role":"buffer"})";
  auto sent = common::HttpCall("POST", "127.0.0.1", b.http_port, "/api/v1/nodes/gpu-2/role", body,
                               milliseconds(2000), kAdmin);
  ASSERT_TRUE(sent.ok());
  ASSERT_EQ(sent->status, 307) << sent->body;
  EXPECT_EQ(nlohmann::json::parse(sent->body).value("leader", ""), leader);
  auto done = common::HttpCall("POST", "127.0.0.1", a.http_port, "/api/v1/nodes/gpu-2/role", body,
                               milliseconds(2000), kAdmin);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->status, 200) << done->body;
  bool seen = false;
  for (int i = 0; i < 50 && !seen; ++i) {
    auto n = get(b, "/api/v1/nodes/gpu-2");
    seen = n.ok() && n->status == 200 &&
           nlohmann::json::parse(n->body, nullptr, false).value("role", "") == "buffer";
    if (!seen) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(seen) << "the standby never showed the leader's write";
  // `gpuha ctl` pointed at the standby follows it to the leader, whose
  // answer it prints (gpu-1 has no agent: nothing to drain).
  CommandResult drain =
      RunCommand(absl::StrCat(GPUHA_BINARY, " ctl --controller http://127.0.0.1:", b.http_port,
                              " --token ", kAdmin, " drain gpu-1"));
  EXPECT_THAT(drain.err, HasSubstr("stands by; sending to the leader at " + leader));
  EXPECT_THAT(drain.err, HasSubstr("has not joined"));
  EXPECT_EQ(drain.exit_code, 2);
  auto metrics = get(b, "/metrics");
  EXPECT_THAT(metrics->body, HasSubstr("\ngpuha_controller_leader{store=\"etcd\"} 0\n"));
  // A standby's page passes promtool, as every other component's does.
  CommandResult lint = RunCommand("promtool check metrics", metrics->body);
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
  // `ctl status` says which controller answered and where the leader is.
  auto status_of = [&](const Controller& c) {
    return RunCommand(absl::StrCat(GPUHA_BINARY, " ctl --controller http://127.0.0.1:", c.http_port,
                                   " --token ", kViewer, " status"));
  };
  CommandResult on_standby = status_of(b);
  EXPECT_EQ(on_standby.exit_code, 0) << on_standby.err;
  EXPECT_THAT(
      on_standby.out,
      HasSubstr("Control plane: controllers on etcd; this one stands by, the leader is " + leader));
  CommandResult on_leader = status_of(a);
  EXPECT_EQ(on_leader.exit_code, 0) << on_leader.err;
  EXPECT_THAT(on_leader.out, HasSubstr("Control plane: controllers on etcd; this one leads"));

  // The standby takes over at once on a planned stop, on the same port.
  a.process->Signal(SIGTERM);
  ASSERT_TRUE(Leads(b, milliseconds(3000))) << b.process->err();
  auto led = get(b, "/healthz");
  ASSERT_TRUE(led.ok());
  EXPECT_EQ(led->status, 200);
}

// A router that reaches only a standby still gets the leader's routes, under
// the leader's epoch and version, and each new version as etcd's watch
// brings it to the standby.
TEST_F(ControllerHaTest, ARouterWatchingAStandbyGetsTheLeadersRoutes) {
  Controller a = Start("a");
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  Controller b = Start("b");  // the router retries until it listens
  std::string path = (gpuha::testing::TestTempDir() / "router.yaml").string();
  const uint16_t admin = common::FreeLoopbackPort();
  std::ofstream(path) << absl::StrCat(
      "listen: 127.0.0.1:", common::FreeLoopbackPort(), "\nadmin: 127.0.0.1:", admin,
      "\nid: r1\nthreads: 1\nauth: none\ncontrollers: [127.0.0.1:", b.grpc_port, "]\n");
  ChildProcess router({GPUHA_BINARY, "router", "--config", path});
  // The routes the router holds match the leader's (its /routes).
  auto holds_leaders = [&] {
    nlohmann::json leader = Status(a);
    auto r = common::HttpCall("GET", "127.0.0.1", admin, "/routes", "", milliseconds(2000), "");
    if (!r.ok() || r->status != 200 || !leader.is_object()) return false;
    nlohmann::json held = nlohmann::json::parse(r->body, nullptr, false);
    return held.value("version", 0) == leader.value("route_version", -1) &&
           held.value("epoch", 0) == leader.value("epoch", -1);
  };
  auto eventually = [](const std::function<bool()>& f) {
    return gpuha::testing::Eventually(f, milliseconds(10000), milliseconds(100));
  };
  ASSERT_TRUE(eventually(holds_leaders)) << router.err();
  const std::string said = absl::StrCat("from a standby; the leader is 127.0.0.1:", a.http_port);
  EXPECT_TRUE(eventually([&] { return router.err().find(said) != std::string::npos; }))
      << router.err();
  // A change on the leader reaches the router through the standby.
  const int64_t before = Status(a).value("route_version", 0);
  auto done = common::HttpCall("POST", "127.0.0.1", a.http_port, "/api/v1/nodes/gpu-2/role",
                               R"({"role":"buffer"})", milliseconds(2000), kAdmin);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->status, 200) << done->body;
  EXPECT_GT(Status(a).value("route_version", 0), before);
  EXPECT_TRUE(eventually(holds_leaders)) << router.err();
}

// etcd stops answering (as without quorum): the leader stops acting, stays
// up as a standby whose API and metrics say it cannot read etcd, and leads
// again by itself once etcd is back.
TEST_F(ControllerHaTest, ALeaderThatLosesEtcdStopsActingAndLeadsAgainWhenItIsBack) {
  Controller a = Start("a");
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  auto get = [&](const std::string& target) {
    return common::HttpCall("GET", "127.0.0.1", a.http_port, target, "", milliseconds(1000),
                            kViewer);
  };
  etcd_.Pause();  // etcd hangs: no renewal of the lease
  bool says_so = false;
  for (int i = 0; i < 100 && !says_so; ++i) {
    auto m = get("/metrics");
    says_so =
        m.ok() && m->body.find("gpuha_controller_store_up{store=\"etcd\"} 0") != std::string::npos;
    if (!says_so) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(says_so) << a.process->err();
  EXPECT_THAT(a.process->err(), HasSubstr("leadership lost"));
  EXPECT_FALSE(a.process->Wait(milliseconds(0)).has_value()) << "it exited: " << a.process->err();
  auto health = get("/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 503);
  auto nodes = get("/api/v1/nodes");
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ(nodes->status, 503);
  EXPECT_THAT(nodes->body, HasSubstr("cannot read etcd"));
  EXPECT_THAT(get("/metrics")->body, HasSubstr("gpuha_controller_leader{store=\"etcd\"} 0"));

  etcd_.Resume();
  bool leads = false;
  for (int i = 0; i < 150 && !leads; ++i) {
    auto h = get("/healthz");
    leads = h.ok() && h->status == 200;
    if (!leads) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(leads) << "it did not lead again once etcd was back: " << a.process->err();
}

// etcd that does not answer at start is not fatal: the controller says so,
// stands by, and keeps trying.
TEST_F(ControllerHaTest, AnEtcdUnreachableAtStartIsAClearErrorAndTheControllerKeepsTrying) {
  const uint16_t port = common::FreeLoopbackPort();
  Controller a = Start("a", absl::StrCat("http://127.0.0.1:", port));
  bool answered = false;
  for (int i = 0; i < 100 && !answered; ++i) {
    auto h = common::HttpCall("GET", "127.0.0.1", a.http_port, "/healthz", "", milliseconds(1000));
    answered = h.ok() && h->status == 503 && h->body.find("cannot read etcd") != std::string::npos;
    if (!answered) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(answered) << a.process->err();
  EXPECT_THAT(a.process->err(), HasSubstr("trying again until it answers"));
  EXPECT_FALSE(a.process->Wait(milliseconds(1000)).has_value()) << a.process->err();
  // etcd comes up where it was told to be: the controller leads.
  gpuha::testing::EtcdServer late;
  ASSERT_TRUE(late.Start("", "", port)) << late.log();
  // Within seconds: a channel whose connects had failed once took 10-15 s.
  EXPECT_TRUE(Leads(a, milliseconds(8000))) << a.process->err();
}

// A leader cut off from etcd by the network. The test runs in a network
// namespace of its own (the host's network is not touched); the leader runs
// in a second one, whose only link to etcd is a veth pair. The link goes
// down: the leader must stop acting before the standby leads, which the two
// processes' logs show on one clock.
class ControllerPartitionTest : public ControllerHaTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces and a veth pair";
    host_ns_ = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);  // to return in TearDown
    ASSERT_GE(host_ns_, 0) << std::strerror(errno);
    ASSERT_EQ(::unshare(CLONE_NEWNET), 0) << std::strerror(errno);
    ns_ = absl::StrCat("gpuha-ha-", ::getpid());
    veth_ = absl::StrCat("gpuhaha", ::getpid() % 100000);
    const std::string peer = veth_ + "p";
    for (const std::string& cmd :
         {std::string("ip link set lo up"), "ip netns add " + ns_,
          absl::StrCat("ip link add ", veth_, " type veth peer name ", peer, " netns ", ns_),
          absl::StrCat("ip addr add ", kHere, "/30 dev ", veth_), "ip link set " + veth_ + " up",
          absl::StrCat("ip netns exec ", ns_, " ip addr add ", kThere, "/30 dev ", peer),
          absl::StrCat("ip netns exec ", ns_, " ip link set ", peer, " up"),
          absl::StrCat("ip netns exec ", ns_, " ip link set lo up")}) {
      CommandResult r = RunCommand(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
      made_ = true;
    }
    ASSERT_TRUE(etcd_.Start(kHere)) << etcd_.log();
  }
  void TearDown() override {
    if (made_) RunCommand("ip netns del " + ns_);  // takes the veth pair too
    if (host_ns_ >= 0) {  // later tests in this process run where they began
      EXPECT_EQ(::setns(host_ns_, CLONE_NEWNET), 0) << std::strerror(errno);
      ::close(host_ns_);
    }
  }
  // When `log` (spdlog's "[YYYY-MM-DD HH:MM:SS.mmm]" lines) first says `what`.
  static std::string LoggedAt(const std::string& log, const std::string& what) {
    size_t at = log.find(what);
    if (at == std::string::npos) return "";
    size_t line = log.rfind('\n', at);
    line = line == std::string::npos ? 0 : line + 1;
    if (log.compare(line, 1, "[") != 0) return "";
    return log.substr(line + 1, 23);
  }
  static constexpr char kHere[] = "10.214.0.1", kThere[] = "10.214.0.2";
  std::string ns_, veth_;
  bool made_ = false;
  int host_ns_ = -1;
};

TEST_F(ControllerPartitionTest, ALeaderCutOffFromEtcdStopsActingBeforeAnotherLeads) {
  Controller a = Start("a", etcd_.url(kHere), {"/usr/sbin/ip", "netns", "exec", ns_});
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  Controller b = Start("b");
  EXPECT_FALSE(Leads(b, milliseconds(1500))) << "two controllers lead at once";

  ASSERT_EQ(RunCommand("ip link set " + veth_ + " down").exit_code, 0);  // packets vanish
  ASSERT_TRUE(Leads(b, milliseconds(8000))) << b.process->err();
  // It stops acting, and stands by again (it cannot reach etcd to lead).
  for (int i = 0; i < 60 && a.process->err().find("standing by again") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_THAT(a.process->err(), HasSubstr("standing by again"));
  EXPECT_FALSE(a.process->Wait(milliseconds(0)).has_value()) << "it exited";
  const std::string a_stopped = LoggedAt(a.process->err(), "no longer leads");
  const std::string b_leads = LoggedAt(b.process->err(), "controller: leading (fencing token");
  ASSERT_FALSE(a_stopped.empty()) << a.process->err();
  ASSERT_FALSE(b_leads.empty()) << b.process->err();
  std::printf("PARTITION the cut-off leader stopped acting at %s, the standby led at %s\n",
              a_stopped.c_str(), b_leads.c_str());
  EXPECT_LT(a_stopped, b_leads) << "two leaders acted at once: the old one stopped at " << a_stopped
                                << ", the new one led at " << b_leads;
  EXPECT_THAT(a.process->err(), HasSubstr("no renewal of the leader lease"));
}

TEST_F(ControllerHaTest, BadStoreSettingsNameTheField) {
  std::string path = (gpuha::testing::TestTempDir() / "bad.yaml").string();
  std::ofstream(path) << "nodes: [{ name: gpu-1, role: active, capacity: 10 },\n"
                         "        { name: gpu-2, role: passive, capacity: 10 }]\n"
                         "store: { etcd: [\"ftp://127.0.0.1:2379\"], sqlite: /tmp/x.db }\n";
  ChildProcess p({GPUHA_BINARY, "controller", "--config", path});
  EXPECT_EQ(p.Wait(milliseconds(10000)), 2);
  EXPECT_THAT(p.err(), HasSubstr("store.etcd"));
  // A leader on a wildcard address could not tell standbys where it is.
  std::ofstream(path)
      << "nodes: [{ name: gpu-1, role: active, capacity: 10 },\n"
         "        { name: gpu-2, role: passive, capacity: 10 }]\n"
         "listen: { http: \"0.0.0.0:7401\" }\n"
         "store: { etcd: [\"http://127.0.0.1:2379\"] }\n"
         "tokens: [{ name: ops, role: admin, sha256: "
         "\"cce7a2cf1ae045989cfc914fb95a41526f167a838b3c7d33745143614abace7c\" }]\n";
  ChildProcess wildcard({GPUHA_BINARY, "controller", "--config", path, "--check"});
  EXPECT_EQ(wildcard.Wait(milliseconds(10000)), 2);
  EXPECT_THAT(wildcard.err(), HasSubstr("store.advertise"));
}

}  // namespace
}  // namespace gpuha::e2e
