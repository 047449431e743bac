// `gpuha router` as a real process in front of real upstream processes
// (gpuha-test-backend), on loopback: kill -9 and SIGSTOP of a primary under
// load, SIGHUP reload, bad config, and routes that follow a real controller
// while its nodes fail. Gaps are printed for bench/RESULTS.md, not asserted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cluster/config_builders.h"
#include "common/http_server.h"
#include "common/net_util.h"
#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/browser.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/free_port.h"

namespace gpuha::e2e {
namespace {

using gpuha::testing::Exchange;
using gpuha::testing::Get;
using gpuha::testing::Reply;
using gpuha::testing::Send;
using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::string kGpuha = GPUHA_BINARY;
const std::string kBackend = GPUHA_TEST_BACKEND;

struct LoadResult {
  int ok = 0;
  int failed = 0;
  double max_gap_ms = 0;
  std::map<std::string, int> by_backend;
  std::string first_failure;
};

// `clients` keep-alive connections each sending back-to-back requests for
// `stream` until `stop`; a transport error or non-200 is a failure.
LoadResult RunLoad(uint16_t port, const std::string& key, const std::string& stream, int clients,
                   const std::atomic<bool>& stop) {
  std::mutex mu;
  LoadResult total;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      namespace net = boost::asio;
      LoadResult mine;
      net::io_context ioc;
      std::unique_ptr<net::ip::tcp::socket> s;
      auto last = Clock::now();
      while (!stop) {
        if (!s) {
          s = std::make_unique<net::ip::tcp::socket>(ioc);
          boost::system::error_code ec;
          s->connect({net::ip::make_address("127.0.0.1"), port}, ec);
          struct timeval tv = {10, 0};
          setsockopt(s->native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        }
        Reply r = Exchange(*s, Get("/streams/" + stream + "/v2/models/m/infer", key));
        if (r.status == 200) {
          mine.ok++;
          // As every HTTP/1.1 client: an answer that says close ends the
          // connection, and the next request goes on a new one.
          if (r.headers["Connection"] == "close") s.reset();
          mine.by_backend[r.headers["X-Backend"]]++;
          auto now = Clock::now();
          mine.max_gap_ms = std::max(mine.max_gap_ms,
                                     std::chrono::duration<double, std::milli>(now - last).count());
          last = now;
        } else {
          mine.failed++;
          if (mine.first_failure.empty()) {
            mine.first_failure =
                r.error.empty() ? std::to_string(r.status) + " " + r.body : r.error;
          }
          s.reset();
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      total.ok += mine.ok;
      total.failed += mine.failed;
      total.max_gap_ms = std::max(total.max_gap_ms, mine.max_gap_ms);
      for (auto& [b, n] : mine.by_backend) total.by_backend[b] += n;
      if (total.first_failure.empty()) total.first_failure = mine.first_failure;
    });
  }
  for (auto& t : threads) t.join();
  return total;
}

struct ControlledCluster;

class RouterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = gpuha::testing::TestTempDir(); }

  std::string StartBackend(const std::string& name, uint16_t port = 0) {
    backends_[name] = std::make_unique<ChildProcess>(
        std::vector<std::string>{kBackend, "--name", name, "--port", std::to_string(port)});
    auto p = backends_[name]->WaitForLine("listening on 127.0.0.1:", milliseconds(10000));
    EXPECT_TRUE(p.has_value()) << backends_[name]->err();
    return "127.0.0.1:" + p.value_or("0");
  }
  void WriteConfig(const std::string& yaml) { std::ofstream(dir_ / "router.yaml") << yaml; }
  void StartController(ControlledCluster& c);
  void StartControlledCluster(ControlledCluster& c);
  bool WaitAllConnected(ControlledCluster& c);
  // `nofile` > 0: the router runs under that file-descriptor limit.
  void StartRouter(std::vector<std::string> extra = {}, int nofile = 0) {
    std::vector<std::string> argv = {kGpuha,      "router",
                                     "--config",  (dir_ / "router.yaml").string(),
                                     "--listen",  "127.0.0.1:0",
                                     "--admin",   "127.0.0.1:0",
                                     "--threads", "2"};
    if (nofile > 0)
      argv.insert(argv.begin(), {"/usr/bin/prlimit", "--nofile=" + std::to_string(nofile)});
    argv.insert(argv.end(), extra.begin(), extra.end());
    router_ = std::make_unique<ChildProcess>(argv);
    auto rest = router_->WaitForLine("gpuha router listening on 127.0.0.1:", milliseconds(10000));
    ASSERT_TRUE(rest.has_value()) << router_->err();
    port_ = static_cast<uint16_t>(std::stoi(*rest));
    admin_ = static_cast<uint16_t>(std::stoi(rest->substr(rest->rfind(':') + 1)));
  }
  std::string TwoStreamConfig(const std::string& a, const std::string& b) {
    cluster::RouterYaml r;
    r.tenants = {{.name = "acme", .api_keys = {"k1"}}};
    r.probe_interval_ms = 20;
    r.hang_after_ms = 100;
    r.routes = {{.stream = "s1", .tenant = "acme", .primary = a, .standby = b},
                {.stream = "s2", .tenant = "acme", .primary = b, .standby = a}};
    return r.Yaml();
  }
  // Load on s1 while `fault` runs after 300 ms; 1.5 s in all.
  LoadResult LoadAround(const std::function<void()>& fault) {
    std::atomic<bool> stop{false};
    LoadResult r;
    std::thread load([&] { r = RunLoad(port_, "k1", "s1", 4, stop); });
    std::this_thread::sleep_for(milliseconds(300));
    fault();
    std::this_thread::sleep_for(milliseconds(1200));
    stop = true;
    load.join();
    return r;
  }

  std::filesystem::path dir_;
  std::map<std::string, std::unique_ptr<ChildProcess>> backends_;
  std::unique_ptr<ChildProcess> router_;
  uint16_t port_ = 0, admin_ = 0;
};

TEST_F(RouterE2eTest, KillDashNineOfThePrimaryLosesNoRequest) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  StartRouter();
  LoadResult r = LoadAround([&] { backends_["a"]->Signal(SIGKILL); });
  std::printf("kill -9 primary: %d ok, %d failed, longest gap %.1f ms, a=%d b=%d\n", r.ok, r.failed,
              r.max_gap_ms, r.by_backend["a"], r.by_backend["b"]);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.by_backend["a"], 0);
  EXPECT_GT(r.by_backend["b"], 0);
}

// A restart (or an upgrade of the binary) through the handoff socket: the
// new router takes the running one's listeners, which never close, and the
// old one drains and exits. Under load from clients that never retry, no
// connection is refused and no request fails; twice, the second handoff
// from the socket the first one made.
TEST_F(RouterE2eTest, ARestartThroughTheHandoffSocketRefusesNoConnectionAndFailsNoRequest) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  // A Unix socket's path is at most 107 bytes: the test's folder is longer.
  char short_dir[] = "/tmp/gpuha-handoff-XXXXXX";
  ASSERT_NE(::mkdtemp(short_dir), nullptr);
  const std::string sock = std::string(short_dir) + "/router.sock";
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{short_dir};
  StartRouter({"--handoff-socket", sock});
  const uint16_t port = port_;
  std::atomic<bool> stop{false};
  LoadResult r;
  std::thread load([&] { r = RunLoad(port, "k1", "s1", 8, stop); });
  std::vector<double> handoff_ms;
  for (int round = 0; round < 2; ++round) {
    std::this_thread::sleep_for(milliseconds(400));
    std::unique_ptr<ChildProcess> old = std::move(router_);
    const auto t0 = Clock::now();
    StartRouter({"--handoff-socket", sock});
    EXPECT_EQ(port_, port) << "the new router listens on the old one's port";
    std::optional<int> rc = old->Wait(milliseconds(10000));
    EXPECT_EQ(rc, std::optional<int>(0)) << "the old router did not drain and exit: " << old->err();
    handoff_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    EXPECT_NE(old->err().find("given to the router that replaces this one"), std::string::npos)
        << old->err();
  }
  std::this_thread::sleep_for(milliseconds(400));
  stop = true;
  load.join();
  std::printf(
      "FIGURES router restart by handoff x2: %d ok, %d failed, longest gap %.1f ms, old "
      "router gone after %.0f and %.0f ms\n",
      r.ok, r.failed, r.max_gap_ms, handoff_ms[0], handoff_ms[1]);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.ok, 100);
  EXPECT_TRUE(std::filesystem::exists(sock));  // the last router's, for the next restart
}

// The systemd unit's ExecReload: `--background` returns once the new router
// serves (its parent exits 0) and leaves it running; it tells systemd on
// $NOTIFY_SOCKET that it is the main process now (MAINPID=, READY=1); the
// old one drains and exits. Under load, nothing is refused or fails.
TEST_F(RouterE2eTest, ABackgroundRestartReturnsOnceItServesAndNamesTheNewMainProcess) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  char short_dir[] = "/tmp/gpuha-handoff-XXXXXX";
  ASSERT_NE(::mkdtemp(short_dir), nullptr);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{short_dir};
  const std::string sock = std::string(short_dir) + "/router.sock";
  const std::string notify = std::string(short_dir) + "/notify";
  // systemd's end of the notify protocol: a Unix datagram socket.
  int ns = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(ns, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", notify.c_str());
  ASSERT_EQ(::bind(ns, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{20, 0};
  ::setsockopt(ns, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  StartRouter({"--handoff-socket", sock});
  const uint16_t port = port_;
  std::atomic<bool> stop{false};
  LoadResult r;
  std::thread load([&] { r = RunLoad(port, "k1", "s1", 8, stop); });
  std::this_thread::sleep_for(milliseconds(400));
  ChildProcess reload(
      {kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--listen", "127.0.0.1:0",
       "--admin", "127.0.0.1:0", "--threads", "2", "--handoff-socket", sock, "--background"},
      {"NOTIFY_SOCKET=" + notify});
  EXPECT_EQ(reload.Wait(milliseconds(20000)), std::optional<int>(0)) << reload.err();
  char msg[512] = {};
  const ssize_t n = ::recv(ns, msg, sizeof(msg) - 1, 0);
  ::close(ns);
  ASSERT_GT(n, 0) << "no word on NOTIFY_SOCKET";
  const std::string said(msg, static_cast<size_t>(n));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(said, m, std::regex("MAINPID=([0-9]+)\n"))) << said;
  EXPECT_NE(said.find("READY=1"), std::string::npos) << said;
  const pid_t main_pid = static_cast<pid_t>(std::stoi(m[1]));
  EXPECT_NE(main_pid, reload.pid());  // the child that goes on, not the parent that returned
  EXPECT_EQ(::kill(main_pid, 0), 0) << "the new main process is not running";
  EXPECT_EQ(router_->Wait(milliseconds(10000)), std::optional<int>(0))
      << "the old router did not drain and exit: " << router_->err();
  std::this_thread::sleep_for(milliseconds(400));
  stop = true;
  load.join();
  ::kill(main_pid, SIGTERM);
  for (int i = 0; i < 200 && ::kill(main_pid, 0) == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(25));
  }
  std::printf("FIGURES router restart in the background: %d ok, %d failed, longest gap %.1f ms\n",
              r.ok, r.failed, r.max_gap_ms);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.ok, 100);
  // Without a handoff socket there is no router to replace: refused.
  ChildProcess alone(
      {kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--background"});
  EXPECT_EQ(alone.Wait(milliseconds(10000)), std::optional<int>(2));
  EXPECT_NE(alone.err().find("--background: needs a handoff socket"), std::string::npos)
      << alone.err();
}

TEST_F(RouterE2eTest, HungPrimaryLosesNoRequest) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  StartRouter();
  LoadResult r = LoadAround([&] { backends_["a"]->Signal(SIGSTOP); });
  backends_["a"]->Signal(SIGCONT);
  std::printf("SIGSTOP primary: %d ok, %d failed, longest gap %.1f ms, a=%d b=%d\n", r.ok, r.failed,
              r.max_gap_ms, r.by_backend["a"], r.by_backend["b"]);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.by_backend["b"], 0);
  auto m = common::HttpCall("GET", "127.0.0.1", admin_, "/metrics", "", milliseconds(2000));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("gpuha_router_probe_verdicts_total{verdict=\"hung\"} 1"),
            std::string::npos)
      << m->body;
}

TEST_F(RouterE2eTest, SighupReloadsTenantsWithoutDroppingConnections) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  StartRouter();
  // A keep-alive connection opened before the reload keeps working.
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket s(ioc);
  s.connect({net::ip::make_address("127.0.0.1"), port_});
  ASSERT_EQ(Exchange(s, Get("/streams/s1/x", "k1")).status, 200);
  std::string cfg = TwoStreamConfig(a, b);
  cfg.replace(cfg.find(common::Sha256Hex("k1")), 64, common::Sha256Hex("k2"));
  WriteConfig(cfg);
  router_->Signal(SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 200 && !reloaded; ++i) {
    reloaded = Send(port_, Get("/streams/s1/x", "k2")).status == 200;
    if (!reloaded) std::this_thread::sleep_for(milliseconds(25));
  }
  EXPECT_TRUE(reloaded) << router_->err();
  EXPECT_EQ(Send(port_, Get("/streams/s1/x", "k1")).status, 401);
  EXPECT_EQ(Exchange(s, Get("/streams/s1/x", "k2")).status, 200);  // same connection
  // A broken file is refused and the running config stays.
  WriteConfig("tenants: [oops");
  router_->Signal(SIGHUP);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(Send(port_, Get("/streams/s1/x", "k2")).status, 200);
  EXPECT_NE(router_->err().find("reload refused"), std::string::npos) << router_->err();
  // Regression: `: > router.yaml; kill -HUP` turned authentication off
  // ("reloaded (0 tenant(s))"). An emptied file is refused, and so is a
  // config path that became a directory; keys are still required.
  auto refusals = [&] {
    std::string err = router_->err();
    size_t n = 0;
    for (size_t at = err.find("reload refused"); at != std::string::npos;
         at = err.find("reload refused", at + 1)) {
      ++n;
    }
    return n;
  };
  WriteConfig("");
  router_->Signal(SIGHUP);
  EXPECT_TRUE(gpuha::testing::Eventually([&] { return refusals() >= 2; }, milliseconds(5000)))
      << router_->err();
  EXPECT_NE(router_->err().find("tenants: none listed"), std::string::npos) << router_->err();
  EXPECT_EQ(Send(port_, Get("/streams/s1/x", "")).status, 401);
  std::filesystem::remove(dir_ / "router.yaml");
  std::filesystem::create_directory(dir_ / "router.yaml");
  router_->Signal(SIGHUP);
  EXPECT_TRUE(gpuha::testing::Eventually([&] { return refusals() >= 3; }, milliseconds(5000)))
      << router_->err();
  EXPECT_NE(router_->err().find("is a directory"), std::string::npos) << router_->err();
  EXPECT_EQ(Send(port_, Get("/streams/s1/x", "")).status, 401);
  EXPECT_EQ(Send(port_, Get("/streams/s1/x", "k2")).status, 200);
}

// CPU seconds a process has used (utime + stime from /proc).
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Regression: at the file-descriptor limit the accept loop spun (96% CPU,
// 680,000 log lines in 4 s). Now it pauses, logs once, and keeps serving
// the connections it has.
TEST_F(RouterE2eTest, OutOfDescriptorsPausesAcceptingInsteadOfSpinning) {
  std::string a = StartBackend("a"), b = StartBackend("b");
  WriteConfig(TwoStreamConfig(a, b));
  StartRouter({}, /*nofile=*/64);
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket kept(ioc);
  kept.connect({net::ip::make_address("127.0.0.1"), port_});
  ASSERT_EQ(Exchange(kept, Get("/streams/s1/x", "k1")).status, 200);
  // More connections than the router has descriptors: the kernel queues
  // them, the router cannot take them.
  std::vector<std::unique_ptr<net::ip::tcp::socket>> flood;
  for (int i = 0; i < 100; ++i) {
    flood.push_back(std::make_unique<net::ip::tcp::socket>(ioc));
    boost::system::error_code ec;
    flood.back()->connect({net::ip::make_address("127.0.0.1"), port_}, ec);
  }
  ASSERT_TRUE(gpuha::testing::Eventually(
      [&] { return router_->err().find("pausing accepts") != std::string::npos; },
      milliseconds(5000)))
      << router_->err();
  double cpu = CpuSeconds(router_->pid());
  std::this_thread::sleep_for(milliseconds(1500));
  cpu = CpuSeconds(router_->pid()) - cpu;
  EXPECT_LT(cpu, 0.5) << "the accept loop spins";  // spinning burns ~1.5 s here
  EXPECT_LE(Count(router_->err(), "pausing accepts"), 4u) << router_->err().substr(0, 4000);
  EXPECT_EQ(Exchange(kept, Get("/streams/s1/x", "k1")).status, 200);  // still served
  flood.clear();
  EXPECT_TRUE(gpuha::testing::Eventually(
      [&] { return Send(port_, Get("/streams/s1/x", "k1")).status == 200; }, milliseconds(5000)));
}

TEST_F(RouterE2eTest, BadConfigExitsTwoNamingTheField) {
  WriteConfig("limits: {max_headers: lots}\n");
  ChildProcess p({kGpuha, "router", "--config", (dir_ / "router.yaml").string()});
  EXPECT_EQ(p.Wait(milliseconds(10000)), 2);
  EXPECT_NE(p.err().find("limits.max_headers"), std::string::npos) << p.err();
  WriteConfig("auth: none\ntls: {cert: /nonexistent.pem, key: /nonexistent.key}\n");
  ChildProcess q({kGpuha, "router", "--config", (dir_ / "router.yaml").string(), "--listen",
                  "127.0.0.1:0", "--admin", "127.0.0.1:0"});
  EXPECT_EQ(q.Wait(milliseconds(10000)), 2);
  EXPECT_NE(q.err().find("tls.cert"), std::string::npos) << q.err();
}

// A controller, three agents with an upstream each, and a router watching
// the controller's routes, with stream s1 admitted and answering.
struct ControlledCluster {
  std::map<std::string, uint16_t> ports;  // node -> its upstream's port
  uint16_t grpc = 0, http = 0;
  std::unique_ptr<ChildProcess> controller;
  std::map<std::string, std::unique_ptr<ChildProcess>> agents;
  std::string primary;  // s1's primary when it first answered

  json Api(const std::string& method, const std::string& path, const std::string& body = "") {
    auto r = common::HttpCall(method, "127.0.0.1", http, path, body, milliseconds(5000));
    return r.ok() ? json::parse(r->body, nullptr, false) : json();
  }
};

void RouterE2eTest::StartController(ControlledCluster& c) {
  c.controller = std::make_unique<ChildProcess>(std::vector<std::string>{
      kGpuha, "controller", "--config", (dir_ / "controller.yaml").string(), "--grpc-listen",
      "127.0.0.1:" + std::to_string(c.grpc), "--http-listen", "127.0.0.1:" + std::to_string(c.http),
      "--store", (dir_ / "c.db").string()});
  ASSERT_TRUE(c.controller->WaitForLine("gpuha controller grpc", milliseconds(10000)));
}

void RouterE2eTest::StartControlledCluster(ControlledCluster& c) {
  c.ports = {{"n1", FreePort()}, {"n2", FreePort()}, {"n3", FreePort()}};
  for (auto& [n, p] : c.ports) StartBackend(n, p);
  c.grpc = FreePort();
  c.http = FreePort();
  cluster::ControllerYaml config;
  for (auto& [n, p] : c.ports) {
    config.nodes.push_back({.name = n,
                            .role = n == "n3" ? "passive" : "active",
                            .capacity = 4,
                            .address = "127.0.0.1:" + std::to_string(p)});
  }
  config.tenants = {"acme"};
  config.healthy_for_ms = 500;
  std::ofstream(dir_ / "controller.yaml") << config.Yaml();
  StartController(c);
  for (auto& [n, p] : c.ports) {
    c.agents[n] = std::make_unique<ChildProcess>(std::vector<std::string>{
        kGpuha, "agent", "--node", n, "--controller", "127.0.0.1:" + std::to_string(c.grpc),
        "--gpu", "sim", "--heartbeat-ms", "50", "--listen", "127.0.0.1:0"});
    ASSERT_TRUE(c.agents[n]->WaitForLine("listening on", milliseconds(10000)));
  }
  ASSERT_TRUE(WaitAllConnected(c));
  c.Api("POST", "/api/v1/streams", json{{"id", "s1"}, {"tenant", "acme"}}.dump());
  cluster::RouterYaml router;
  router.tenants = {{.name = "acme", .api_keys = {"k1"}}};
  WriteConfig(router.Yaml());
  StartRouter({"--controller", "127.0.0.1:" + std::to_string(c.grpc)});
  Reply first;
  for (int i = 0; i < 200 && first.status != 200; ++i) {
    first = Send(port_, Get("/streams/s1/x", "k1"));
    if (first.status != 200) std::this_thread::sleep_for(milliseconds(25));
  }
  ASSERT_EQ(first.status, 200) << first.body << router_->err();
  c.primary = first.headers["X-Backend"];
  // Faults injected during the controller's startup grace (the agents'
  // longest reconnect wait) would meet a controller that fails nothing over.
  ASSERT_TRUE(gpuha::testing::Eventually(
      [&] {
        return c.Api("GET", "/api/v1/status").value("startup_grace_left_ms", int64_t{-1}) == 0;
      },
      milliseconds(10000)));
  ASSERT_TRUE(c.ports.count(c.primary)) << c.primary;
}

bool RouterE2eTest::WaitAllConnected(ControlledCluster& c) {
  for (int i = 0; i < 400; ++i) {
    json all = c.Api("GET", "/api/v1/nodes");
    size_t connected = 0;
    // Joined: agent connected and server ready (placement uses no other).
    for (const json& n : all) {
      connected += n.value("connected", false) && n.value("lifecycle", "") == "serving";
    }
    if (connected == c.ports.size()) return true;
    std::this_thread::sleep_for(milliseconds(25));
  }
  return false;
}

// The whole path: controller, agents, upstreams and a router watching routes.
TEST_F(RouterE2eTest, FollowsTheControllersRoutesThroughANodeCrash) {
  ControlledCluster c;
  ASSERT_NO_FATAL_FAILURE(StartControlledCluster(c));
  std::map<std::string, uint16_t>& ports = c.ports;
  std::string primary = c.primary;
  auto api = [&](const std::string& method, const std::string& path, const std::string& body) {
    return c.Api(method, path, body);
  };
  auto& agents = c.agents;
  (void)ports;

  // Crash the whole primary node: its agent and its server.
  std::atomic<bool> stop{false};
  LoadResult r;
  std::thread load([&] { r = RunLoad(port_, "k1", "s1", 2, stop); });
  std::this_thread::sleep_for(milliseconds(300));
  agents[primary]->Signal(SIGKILL);
  backends_[primary]->Signal(SIGKILL);
  std::string moved_to;
  for (int i = 0; i < 200 && moved_to.empty(); ++i) {
    for (const json& s : api("GET", "/api/v1/streams", "")) {
      if (s.value("id", "") == "s1" && s.value("primary", "") != primary) {
        moved_to = s.value("primary", "");
      }
    }
    std::this_thread::sleep_for(milliseconds(25));
  }
  std::this_thread::sleep_for(milliseconds(500));
  stop = true;
  load.join();
  std::printf(
      "node crash behind the router: %d ok, %d failed, longest gap %.1f ms, moved %s -> %s\n", r.ok,
      r.failed, r.max_gap_ms, primary.c_str(), moved_to.c_str());
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  ASSERT_FALSE(moved_to.empty());
  // The router now follows the controller's route, not only its own stickiness.
  Reply after = Send(port_, Get("/streams/s1/x", "k1"));
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.headers["X-Backend"], moved_to);

  // The dashboard's graphs draw this load and this failover: the router
  // reports its traffic once a second, the controller keeps a point a
  // second; failovers per minute come from the stored events.
  std::this_thread::sleep_for(milliseconds(2500));
  json history = api("GET", "/api/v1/history", "");
  double max_rate = 0, max_failovers = 0;
  for (const json& p : history["points"])
    max_rate = std::max(max_rate, p.value("requests_per_s", 0.0));
  for (const json& p : history["failovers"]) {
    max_failovers = std::max(max_failovers, p.value("failovers_per_min", 0.0));
  }
  EXPECT_GT(max_rate, 0) << history.dump();
  EXPECT_GT(max_failovers, 0) << history.dump();
  json routers = api("GET", "/api/v1/routers", "");
  ASSERT_EQ(routers.size(), 1u) << routers.dump();
  EXPECT_GE(routers[0].value("answered", 0), r.ok) << routers.dump();
  std::string dom = DumpDom("http://127.0.0.1:" + std::to_string(c.http) + "/");
  for (const char* id : {"g-requests", "g-p99", "g-failovers"}) {
    std::smatch m;
    std::regex figure(std::string("id=\"") + id +
                      "\" data-points=\"([0-9]+)\" data-max=\"([-0-9.e+]+)\"");
    ASSERT_TRUE(std::regex_search(dom, m, figure)) << id << " did not draw:\n" << dom;
    // p99 has a point only where something was answered: the load may fit in one.
    EXPECT_GE(std::stoi(m[1]), std::string(id) == "g-p99" ? 1 : 2) << id;
    EXPECT_GT(std::stod(m[2]), 0) << id;
  }
  EXPECT_TRUE(std::regex_search(dom, std::regex("<polyline points=\"[0-9.]+,[0-9.]+ [0-9.]+,")));
  EXPECT_THAT(
      dom, ::testing::HasSubstr("<td>" + routers[0].value("router", std::string("?")) + "</td>"));
  EXPECT_THAT(dom, ::testing::ContainsRegex("<td>" + moved_to + "</td><td class=\"num\">0</td>"))
      << "the GPU table's row of the node the stream moved to";
}

// kill -9 of the controller under load: the router keeps serving on the
// routes it holds, the restarted controller has the same routes and
// capacity, nothing fails over, the router reconnects and takes the new
// controller's epoch, and not one request fails.
TEST_F(RouterE2eTest, ControllerKill9AndRestartLosesNothing) {
  ControlledCluster c;
  ASSERT_NO_FATAL_FAILURE(StartControlledCluster(c));
  json streams = c.Api("GET", "/api/v1/streams");
  json cap = c.Api("GET", "/api/v1/capacity");
  auto router_epoch = [&] {
    auto r = common::HttpCall("GET", "127.0.0.1", admin_, "/routes", "", milliseconds(2000));
    return r.ok() ? json::parse(r->body, nullptr, false).value("epoch", uint64_t{0}) : 0;
  };
  uint64_t epoch_before = router_epoch();
  ASSERT_GT(epoch_before, 0u);

  std::atomic<bool> stop{false};
  LoadResult r;
  std::thread load([&] { r = RunLoad(port_, "k1", "s1", 2, stop); });
  std::this_thread::sleep_for(milliseconds(200));
  c.controller->Signal(SIGKILL);
  c.controller->Wait(milliseconds(5000));
  std::this_thread::sleep_for(milliseconds(300));  // load runs with no controller at all
  ASSERT_NO_FATAL_FAILURE(StartController(c));
  EXPECT_EQ(c.Api("GET", "/api/v1/streams"), streams);
  ASSERT_TRUE(WaitAllConnected(c));
  // The router reconnects and applies the new controller's snapshot (a new
  // epoch), and the controller records its acknowledgement.
  auto reacked = [&] {
    if (router_epoch() <= epoch_before) return false;
    bool restarted = false, acked = false;
    for (const json& e : c.Api("GET", "/api/v1/events")) {
      std::string type = e.value("type", "");
      if (type == "controller_started") restarted = true, acked = false;
      if (restarted && type == "routers_acked") acked = true;
    }
    return acked;
  };
  bool ok = false;
  for (int i = 0; i < 400 && !(ok = reacked()); ++i) std::this_thread::sleep_for(milliseconds(25));
  EXPECT_TRUE(ok) << "the router never took and acknowledged the restarted controller's routes";
  // Load goes on until the restarted controller's grace is over: nothing may
  // fail over when it starts judging the nodes again.
  bool grace_over = false;
  for (int i = 0; i < 500 && !grace_over; ++i) {
    grace_over = c.Api("GET", "/api/v1/status").value("startup_grace_left_ms", int64_t{-1}) == 0;
    if (!grace_over) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(grace_over);
  std::this_thread::sleep_for(milliseconds(300));  // and a few detection windows past it
  stop = true;
  load.join();
  std::printf("controller kill -9 under load: %d ok, %d failed, longest gap %.1f ms\n", r.ok,
              r.failed, r.max_gap_ms);
  EXPECT_EQ(r.failed, 0) << r.first_failure;
  EXPECT_GT(r.ok, 50);
  EXPECT_EQ(c.Api("GET", "/api/v1/streams"), streams) << "routes changed across a restart";
  EXPECT_EQ(c.Api("GET", "/api/v1/capacity"), cap);
  for (const char* n : {"n1", "n2", "n3"}) {
    EXPECT_NE(c.Api("GET", std::string("/api/v1/nodes/") + n)["state"], "failed") << n;
  }
}

}  // namespace
}  // namespace gpuha::e2e
