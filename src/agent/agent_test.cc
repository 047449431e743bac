// The agent against an in-test controller that speaks proto/gpuha/v1, with
// simulated GPUs: hello, heartbeats, XID and thermal faults, fencing, epochs,
// reconnection, the hang fault and the HTTP endpoints.
#include "agent/agent.h"

#include <gmock/gmock.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "agent/pod_resources.h"
#include "agent/process.h"
#include "agent/testing/fake_controller.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/testing/eventually.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_certs.h"
#include "gpu/nvml_probe.h"
#include "gpu/pci_rebind.h"
#include "gpu/sim_probe.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;
using testing::FakeController;
using ::testing::HasSubstr;
using ::testing::Not;

class NoProcesses : public ProcessRunner {
 public:
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>&) override {
    return absl::UnimplementedError("no processes in this test");
  }
  std::optional<std::string> Poll(pid_t) override { return "exit 0"; }
  void Signal(pid_t, int) override {}
};

class AgentTest : public ::testing::Test {
 protected:
  AgentConfig Config(std::vector<int> ports) {
    AgentConfig c;
    c.node = "gpu-1";
    c.listen.port = 0;
    for (int p : ports) c.controllers.push_back({"127.0.0.1", static_cast<uint16_t>(p)});
    c.gpu_backend = "sim";
    c.sim.count = 2;
    c.sample_ms = 100;
    c.heartbeat_ms = 20;
    return c;
  }
  static bool WaitUntil(const std::function<bool()>& pred) {
    return gpuha::testing::Eventually(pred, milliseconds(5000), milliseconds(10));
  }
  std::unique_ptr<Agent> Start(AgentConfig c) {
    auto probe = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
    EXPECT_TRUE(probe.ok());
    auto a = std::make_unique<Agent>(c, std::move(*probe), &runner_, common::RealClock::Get());
    EXPECT_TRUE(a->Start().ok());
    return a;
  }
  static v1::ControllerMessage FenceAt(uint64_t epoch) {
    v1::ControllerMessage m;
    m.mutable_fence()->set_epoch(epoch);
    m.mutable_fence()->set_reason("test");
    return m;
  }
  // Two sim GPUs with a watched server per GPU (or MIG instance) from
  // port `base`, registering `capacity` per GPU, probed every 20 ms.
  AgentConfig PerGpuConfig(int controller_port, int base, int64_t capacity) {
    AgentConfig c = Config({controller_port});
    c.per_gpu.port_base = base;
    c.per_gpu.capacity = capacity;
    c.server.ready_url = "http://127.0.0.1:{port}/v2/health/ready";
    c.server.fence_mode = FenceMode::kUnready;
    c.server.probe_interval = milliseconds(20);
    c.registration.address = "127.0.0.1:8000";
    return c;
  }
  // `n` readiness servers on consecutive loopback ports, server i
  // answering status(i); returns the first port, 0 when none were free.
  static int ServeConsecutive(int n, std::function<int(int)> status,
                              std::vector<std::unique_ptr<common::HttpServer>>* out) {
    std::string last_error;
    // Below the kernel's ephemeral range: inside it, the client connections
    // of tests running beside this one hold ports (`make test` once found no
    // six free in a row in 50 tries, every base between 39,000 and 46,000).
    int ephemeral_low = 32768;
    if (auto r = common::ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); r.ok()) {
      ephemeral_low = std::max(20000 + 4 * n, std::atoi(r->c_str()));
    }
    const int span = ephemeral_low - 20000 - n;
    for (int attempt = 0; attempt < 50; ++attempt) {
      out->clear();
      const int base = 20000 + static_cast<int>((::getpid() * 7 + attempt * 131) % span);
      for (int i = 0; i < n; ++i) {
        auto s = common::HttpServer::Start(
            {.address = "127.0.0.1", .port = static_cast<uint16_t>(base + i)},
            [status, i](const common::HttpRequest&) {
              return common::HttpResponse{status(i), "text/plain", "", {}};
            });
        if (!s.ok()) {
          last_error = std::string(s.status().message());
          break;
        }
        out->push_back(std::move(*s));
      }
      if (static_cast<int>(out->size()) == n) return base;
    }
    // Say why, if it ever fails again.
    std::fprintf(stderr, "ServeConsecutive: 50 tries failed; the last: %s\n", last_error.c_str());
    return 0;
  }
  NoProcesses runner_;
};

TEST_F(AgentTest, SaysHelloWithItsGpusThenHeartbeats) {
  FakeController controller;
  auto agent = Start(Config({controller.port()}));
  auto hello = controller.WaitForHello();
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->node(), "gpu-1");
  EXPECT_EQ(hello->gpu_backend(), "sim");
  ASSERT_EQ(hello->gpus_size(), 2);
  EXPECT_EQ(hello->gpus(0).name(), "NVIDIA L4");
  EXPECT_EQ(hello->heartbeat_interval_ms(), 20u);
  auto hb = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.seq() >= 5 && h.gpus_size() > 0; });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->heartbeat.health(), v1::NODE_HEALTH_HEALTHY);
  EXPECT_EQ(hb->heartbeat.gpus_size(), 2);
  EXPECT_GT(hb->heartbeat.gpus(0).temperature_c(), 30);
  EXPECT_TRUE(agent->connected());
}

TEST_F(AgentTest, QuietBeatsGoAsDatagramsOnceHeardWhileNewsStaysOnTheStream) {
  FakeController controller;
  controller.OfferDatagrams();
  auto agent = Start(Config({controller.port()}));
  for (int i = 0; i < 500 && controller.datagram_count() < 20; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_GE(controller.datagram_count(), 20u);
  EXPECT_GE(agent->counters().heartbeat_datagrams, 15u);
  // Telemetry still comes, on the stream, and an XID's beat at once.
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat& h) { return h.gpus_size(); }));
  // The XID's beat may arrive before the fault's HTTP answer does: looked
  // for from here on.
  const size_t mark = controller.heartbeat_count();
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=79,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  auto failed = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) {
        return h.health() == v1::NODE_HEALTH_FAILED && h.xids_size() > 0;
      },
      milliseconds(5000), mark);
  ASSERT_TRUE(failed.has_value());
  // Then quiet again: the failed state repeats by datagram.
  const size_t before = controller.datagram_count();
  for (int i = 0; i < 300 && controller.datagram_count() < before + 5; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_GE(controller.datagram_count(), before + 5);
  EXPECT_EQ(controller.heartbeats().back().heartbeat.health(), v1::NODE_HEALTH_FAILED);
  // No beat was taken twice (it went both ways until the agent heard).
  std::vector<uint64_t> seqs;
  for (const FakeController::Received& b : controller.heartbeats())
    seqs.push_back(b.heartbeat.seq());
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(std::adjacent_find(seqs.begin(), seqs.end()), seqs.end());
  EXPECT_GT(seqs.size(), 30u);
}

TEST_F(AgentTest, ToldItsDatagramsAreLostItBeatsOnTheStreamAlone) {
  FakeController controller;
  controller.OfferDatagrams();
  auto agent = Start(Config({controller.port()}));
  for (int i = 0; i < 500 && controller.datagram_count() < 10; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_GE(controller.datagram_count(), 10u);
  controller.SayDatagramsLost();
  for (int i = 0; i < 300 && agent->counters().datagram_fallbacks == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(agent->counters().datagram_fallbacks, 1u);
  const uint64_t sent = agent->counters().heartbeat_datagrams;
  // Every beat numbered up to `last` was built before the word (the same
  // thread counts each as it builds it). Once a later one arrives, a late
  // datagram of those is not newer and not counted.
  const uint64_t last = agent->counters().heartbeats_sent;
  ASSERT_TRUE(controller.WaitForHeartbeat([&](const v1::Heartbeat& h) { return h.seq() > last; }));
  const size_t heard = controller.datagram_count();
  const uint64_t from = last + 1;
  // Twenty more beats, every one on the stream.
  ASSERT_TRUE(controller.WaitForHeartbeat(
      [&](const v1::Heartbeat& h) { return h.seq() >= from + 20; }, milliseconds(5000)));
  EXPECT_EQ(agent->counters().heartbeat_datagrams, sent);
  EXPECT_EQ(controller.datagram_count(), heard);
  EXPECT_EQ(controller.hello_count(), 1u);  // one stream throughout
}

TEST_F(AgentTest, WithoutAnOfferEveryBeatIsOnTheStream) {
  FakeController controller;
  auto agent = Start(Config({controller.port()}));
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat& h) { return h.seq() >= 20; }));
  EXPECT_EQ(agent->counters().heartbeat_datagrams, 0u);
  EXPECT_EQ(controller.datagram_count(), 0u);
}

TEST_F(AgentTest, Xid79IsReportedAsFailedRightAway) {
  FakeController controller;
  auto agent = Start(Config({controller.port()}));
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=79,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 202) << r->body;
  auto hb = controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    if (h.health() != v1::NODE_HEALTH_FAILED || h.gpus_size() == 0) return false;
    for (const v1::HealthReason& r : h.reasons()) {
      if (r.code() == "gpu1.xid79" && r.severity() == v1::NODE_HEALTH_FAILED) return true;
    }
    return false;
  });
  ASSERT_TRUE(hb.has_value());
  // The verdict does not wait for a sample, so the telemetry on that beat may
  // come from a sample begun before the fault; the next one shows GPU 1 lost
  // (and only GPU 1).
  auto lost = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.gpus_size() > 1 && h.gpus(1).lost(); },
      milliseconds(2000), 0);
  ASSERT_TRUE(lost.has_value());
  EXPECT_FALSE(lost->heartbeat.gpus(0).lost());
  EXPECT_EQ(lost->heartbeat.health(), v1::NODE_HEALTH_FAILED);
  auto with_xid = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.xids_size() > 0; }, milliseconds(2000), 0);
  ASSERT_TRUE(with_xid.has_value());
  EXPECT_EQ(with_xid->heartbeat.xids(0).xid(), 79u);
}

// The reason with `code` on a heartbeat, or nullopt.
std::optional<v1::HealthReason> ReasonFor(const v1::Heartbeat& h, const std::string& code) {
  for (const v1::HealthReason& r : h.reasons()) {
    if (r.code() == code) return r;
  }
  return std::nullopt;
}

// The reason with `code` on a failed heartbeat, or nullopt.
std::optional<v1::HealthReason> FailedFor(const v1::Heartbeat& h, const std::string& code) {
  if (h.health() != v1::NODE_HEALTH_FAILED) return std::nullopt;
  return ReasonFor(h, code);
}

bool WaitUntilFor(const std::function<bool()>& pred) {
  return gpuha::testing::Eventually(pred, milliseconds(5000), milliseconds(10));
}

TEST_F(AgentTest, AHungDriverCallFailsItsGpuWhileHeartbeatsGoOn) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.call_deadline_ms = 200;
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=driver_hang,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 202) << r->body;
  std::optional<v1::HealthReason> why;
  auto hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    why = FailedFor(h, "gpu1.lost");
    return why.has_value();
  });
  ASSERT_TRUE(hb.has_value());
  EXPECT_THAT(why->detail(), HasSubstr("driver has not answered"));
  // The agent is not stuck behind the call: heartbeats keep coming.
  uint64_t seq = hb->heartbeat.seq();
  EXPECT_TRUE(
      controller.WaitForHeartbeat([&](const v1::Heartbeat& h) { return h.seq() >= seq + 10; }));
  EXPECT_GE(agent->counters().gpu_calls_hung.load(), 1u);
  // A clear (a GPU reset) ends the hang.
  r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                       "kind=clear,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.gpus_size() == 2 && !h.gpus(1).lost(); }));
}

TEST_F(AgentTest, KernelLogXidsAreReportedOnceBesideNvmls) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  std::string log = (gpuha::testing::TestTempDir() / "kern.log").string();
  ASSERT_TRUE(
      common::WriteFileAtomic(log, "NVRM: Xid (PCI:0000:41:00): 79, logged before start\n").ok());
  c.kernel_log = log;
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  // The sim GPUs sit at PCI 0000:41:00 and 0000:42:00. An XID 48 on GPU 1
  // in the log alone (NVML's event set never saw it):
  {
    std::ofstream out(log, std::ios::app);
    out << "[ 812.1] NVRM: Xid (PCI:0000:42:00): 48, pid=9, DBE detected\n"
        << "NVRM: Xid (PCI:0000:77:00): 13, a GPU this agent does not watch\n";
  }
  auto hb = controller.WaitForHeartbeat(
      [&](const v1::Heartbeat& h) { return FailedFor(h, "gpu1.xid48").has_value(); });
  ASSERT_TRUE(hb.has_value());
  // XID 79 on GPU 0 from both sources: reported once.
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=79,gpu=0", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  std::ofstream(log, std::ios::app)
      << "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.\n";
  EXPECT_TRUE(WaitUntil([&] { return agent->counters().xid_duplicates.load() == 1; }));
  EXPECT_EQ(agent->counters().xid_events.load(), 2u);  // 48 and 79; not the old line
  EXPECT_EQ(agent->counters().kernel_log_xids.load(), 3u);
  // By GPU and XID, for an alert on a count of one XID.
  auto m =
      common::HttpCall("GET", "127.0.0.1", agent->http_port(), "/metrics", "", milliseconds(2000));
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body,
              HasSubstr("gpuha_agent_xids_total{node=\"gpu-1\",gpu=\"1\",xid=\"48\"} 1\n"));
  EXPECT_THAT(m->body,
              HasSubstr("gpuha_agent_xids_total{node=\"gpu-1\",gpu=\"0\",xid=\"79\"} 1\n"));
}

// Issue 39: an XID whose action the kernel log's line decides (154's
// action, 144-150's registers) is one occurrence from both sources, and is
// judged as the line says: NVML's event, which says nothing of it, waits
// for the line (it counted twice, and drained, before).
TEST_F(AgentTest, AnXidTheLogsLineDecidesIsCountedOnceAndJudgedAsTheLineSays) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  std::string log = (gpuha::testing::TestTempDir() / "kern154.log").string();
  ASSERT_TRUE(common::WriteFileAtomic(log, "").ok());
  c.kernel_log = log;
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  // An NVLink5 error whose sub-error the catalog ignores (SAW_MVB, 0x1):
  // NVML first, the line 20 ms later.
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=144,gpu=0", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  std::this_thread::sleep_for(milliseconds(20));
  std::ofstream(log, std::ios::app)
      << "NVRM: Xid (PCI:0000:41:00): 144, SAW_MVB Nonfatal XC0 i0 Link 02 (0x00000021 "
         "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)\n";
  ASSERT_TRUE(WaitUntil([&] { return agent->counters().xid_duplicates.load() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return agent->counters().xid_events.load() == 1; }));
  // Then XID 154 asking for a node reboot, from both sources.
  r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                       "kind=xid,xid=154,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  std::this_thread::sleep_for(milliseconds(20));
  std::ofstream(log, std::ios::app)
      << "NVRM: Xid (PCI:0000:42:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
         "(Node Reboot Required)\n";
  auto hb = controller.WaitForHeartbeat(
      [&](const v1::Heartbeat& h) { return FailedFor(h, "gpu1.xid154").has_value(); });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->heartbeat.health(), v1::NODE_HEALTH_FAILED);
  EXPECT_THAT(FailedFor(hb->heartbeat, "gpu1.xid154")->detail(), HasSubstr("Node Reboot Required"));
  EXPECT_FALSE(ReasonFor(hb->heartbeat, "gpu0.xid144").has_value());  // ignored, as decoded
  EXPECT_EQ(agent->counters().xid_duplicates.load(), 2u);
  EXPECT_EQ(agent->counters().xid_events.load(), 2u);
}

// Issue 52, items 1 and 8: with no kernel log (the common case in a
// container), XID 154's action and 144-150's come from NVML (the fake
// library here): the recovery-action field read at the event, and the
// recovery-action event. Every 154 action ends in the catalog's (they all
// drained before), 144-150 take the action the driver set, and a Drain P2P
// is asked again once its work had time to move: a None ends its drain,
// a reset fails the GPU.
TEST_F(AgentTest, WithoutTheKernelLogNvmlsRecoveryActionDecides) {
  FakeController controller;
  const std::string state = (gpuha::testing::TestTempDir() / "nvml_state").string();
  // GPU g < 8: XID 154 with action g; 8: XID 145, a reset; 9: XID 149,
  // none; 10: XID 147, no field (a driver before R565); 11: no XID, the
  // recovery-action event alone, Drain P2P.
  std::string gpus = "count 12\n";
  for (int g = 0; g < 8; ++g) absl::StrAppend(&gpus, "gpu", g, ".recovery_action ", g, "\n");
  auto write = [&](const std::string& changed, const std::string& events) {
    ASSERT_TRUE(common::WriteFileAtomic(state, gpus + changed + events).ok());
  };
  const std::string fixed = "gpu8.recovery_action 1\ngpu9.recovery_action 0\n";
  write(fixed + "gpu11.recovery_action 3\n", "");
  ::setenv("FAKE_NVML_STATE", state.c_str(), 1);
  auto probe = gpu::NvmlProbe::Open(FAKE_NVML_COMPLETE);
  ASSERT_TRUE(probe.ok()) << probe.status();
  AgentConfig c = Config({controller.port()});
  c.gpu_backend = "nvml";
  c.kernel_log = "off";
  c.pci_devices = "off";
  c.thresholds.xid_drain_reset = milliseconds(400);
  auto agent = std::make_unique<Agent>(c, std::move(*probe), &runner_, common::RealClock::Get());
  ASSERT_TRUE(agent->Start().ok());
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  const std::vector<std::pair<int, int>> xids = {{0, 154}, {1, 154}, {2, 154}, {3, 154},
                                                 {4, 154}, {5, 154}, {6, 154}, {7, 154},
                                                 {8, 145}, {9, 149}, {10, 147}};
  std::string events;
  for (size_t i = 0; i < xids.size(); ++i) {
    events = absl::StrCat("xid_seq ", i + 1, "\nxid_gpu ", xids[i].first, "\nxid ", xids[i].second,
                          "\n");
    write(fixed + "gpu11.recovery_action 3\n", events);
    ASSERT_TRUE(WaitUntil([&] { return agent->counters().xid_events.load() == i + 1; }));
  }
  write(fixed + "gpu11.recovery_action 3\n", events + "recovery_seq 1\nrecovery_gpu 11\n");
  auto severity = [](const v1::Heartbeat& h, const std::string& code) {
    std::optional<v1::HealthReason> r = ReasonFor(h, code);
    return r ? r->severity() : v1::NODE_HEALTH_HEALTHY;
  };
  auto hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    return ReasonFor(h, "gpu11.xid154").has_value() && ReasonFor(h, "gpu4.xid154.reset");
  });
  ASSERT_TRUE(hb.has_value());
  const v1::Heartbeat& h = hb->heartbeat;
  EXPECT_FALSE(ReasonFor(h, "gpu0.xid154").has_value());  // None
  EXPECT_EQ(severity(h, "gpu1.xid154"), v1::NODE_HEALTH_FAILED);
  EXPECT_THAT(ReasonFor(h, "gpu1.xid154")->detail(), HasSubstr("GPU Reset Required"));
  EXPECT_EQ(severity(h, "gpu2.xid154"), v1::NODE_HEALTH_FAILED);
  EXPECT_THAT(ReasonFor(h, "gpu2.xid154")->detail(), HasSubstr("Node Reboot Required"));
  EXPECT_EQ(severity(h, "gpu3.xid154"), v1::NODE_HEALTH_DRAINING);      // Drain P2P
  EXPECT_EQ(severity(h, "gpu4.xid154"), v1::NODE_HEALTH_DRAINING);      // Drain and Reset:
  EXPECT_EQ(severity(h, "gpu4.xid154.reset"), v1::NODE_HEALTH_FAILED);  // then the reset
  EXPECT_EQ(severity(h, "gpu5.xid154"), v1::NODE_HEALTH_DRAINING);      // Recover IMEX Domain
  EXPECT_EQ(severity(h, "gpu6.xid154"), v1::NODE_HEALTH_FAILED);        // bus reset
  EXPECT_EQ(severity(h, "gpu7.xid154"), v1::NODE_HEALTH_FAILED);        // system reboot
  EXPECT_EQ(severity(h, "gpu8.xid145"), v1::NODE_HEALTH_FAILED);
  EXPECT_FALSE(ReasonFor(h, "gpu9.xid149").has_value());
  EXPECT_EQ(severity(h, "gpu10.xid147"), v1::NODE_HEALTH_DRAINING);  // the catalog's
  EXPECT_EQ(severity(h, "gpu11.xid154"), v1::NODE_HEALTH_DRAINING);
  EXPECT_EQ(agent->counters().xid_events.load(), 11u);  // the event is no XID
  EXPECT_GE(agent->counters().recovery_actions.load(), 1u);
  // P2P quiet: asked again, GPU 11 answers None and GPU 3 a reset.
  absl::StrReplaceAll({{"gpu3.recovery_action 3", "gpu3.recovery_action 1"}}, &gpus);
  write(fixed + "gpu11.recovery_action 0\n", events + "recovery_seq 1\nrecovery_gpu 11\n");
  hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    return !ReasonFor(h, "gpu11.xid154").has_value() &&
           severity(h, "gpu3.xid154") == v1::NODE_HEALTH_FAILED;
  });
  EXPECT_TRUE(hb.has_value());
}

// Issue 38, items 1 and 2, as an H200 showed them: three XID 31s 4.3 s
// apart from a foreign python3, each told by NVML and the kernel log. Each
// is an occurrence (a (GPU, XID) window counted one and dropped five), and
// three from one process that is not the node's server are that
// application's fault: an alert naming it, not a drain (they drained the
// node). (Spaced 1.5 s here, each its own burst with thresholds.xid_burst
// at 1 s; the default, 180 s, would make them one.)
TEST_F(AgentTest, ApplicationXidsCountEachTimeAndAreHeldAgainstTheirProcess) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.thresholds.xid_burst = milliseconds(1000);
  c.thresholds.xid_repeat_count = 3;
  std::string log = (gpuha::testing::TestTempDir() / "kern31.log").string();
  ASSERT_TRUE(common::WriteFileAtomic(log, "").ok());
  c.kernel_log = log;
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  // The foreign process: this test's own (alive, and no server of the agent's).
  const pid_t foreign = ::getpid();
  for (int i = 0; i < 3; ++i) {
    if (i > 0) std::this_thread::sleep_for(milliseconds(1500));
    auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                              "kind=xid,xid=31,gpu=0", milliseconds(2000));
    ASSERT_TRUE(r.ok());
    std::ofstream(log, std::ios::app) << "NVRM: Xid (PCI:0000:41:00): 31, pid=" << foreign
                                      << ", name=python3, Ch 00000008, MMU Fault\n";
    ASSERT_TRUE(WaitUntil([&] { return agent->counters().xid_duplicates.load() == i + 1u; }));
  }
  EXPECT_EQ(agent->counters().xid_events.load(), 3u);
  EXPECT_EQ(agent->counters().kernel_log_xids.load(), 3u);
  std::optional<v1::HealthReason> why;
  auto hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    why = ReasonFor(h, "gpu0.xid31.one_process");
    return why.has_value();
  });
  ASSERT_TRUE(hb.has_value());
  EXPECT_THAT(why->detail(), HasSubstr(absl::StrCat("python3 (pid ", foreign, ")")));
  EXPECT_EQ(hb->heartbeat.health(), v1::NODE_HEALTH_DEGRADED);
  EXPECT_FALSE(ReasonFor(hb->heartbeat, "gpu0.xid31.repeated").has_value());
  auto first = ReasonFor(hb->heartbeat, "gpu0.xid31");
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(first->detail(), HasSubstr("not this node's inference server"));
}

// Issue 38, item 3: an XID's verdict does not wait for the GPUs to be
// sampled. Here GPU 0's driver call hangs, so a sample takes the whole
// call deadline (3 s); an XID 79 on GPU 1 meanwhile is failed at once
// (it waited out the hung sample under the sample lock).
TEST_F(AgentTest, AnXidIsJudgedWithoutWaitingForASample) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.call_deadline_ms = 3000;
  std::string log = (gpuha::testing::TestTempDir() / "kern79.log").string();
  ASSERT_TRUE(common::WriteFileAtomic(log, "").ok());
  c.kernel_log = log;  // the XID comes from there: the sim's own events wait on the hung GPU
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  // The fault's endpoint samples at once, and that sample waits out the
  // hung call (3 s) under the sample lock.
  auto hang = std::async(std::launch::async, [&] {
    return common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=driver_hang,gpu=0", milliseconds(6000));
  });
  std::this_thread::sleep_for(milliseconds(300));  // a sample is now stuck on GPU 0
  const size_t from = controller.heartbeat_count();
  const auto sent = std::chrono::steady_clock::now();
  std::ofstream(log, std::ios::app)
      << "NVRM: Xid (PCI:0000:42:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
         "the bus.\n";
  auto hb = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return FailedFor(h, "gpu1.xid79").has_value(); },
      milliseconds(5000), from);
  ASSERT_TRUE(hb.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - sent, milliseconds(1500));
  auto r = hang.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 202) << r->body;
  r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                       "kind=clear,gpu=0", milliseconds(6000));
}

// Issue 38, item 2: an application XID whose process is the node's own
// server (the kernel log names its pid) restarts the server, NVIDIA's
// RESTART_APP, and says so.
TEST(AgentServerXidTest, AnApplicationXidOfTheAgentsOwnServerRestartsIt) {
  FakeController controller;
  AgentConfig c;
  c.node = "gpu-1";
  c.listen.port = 0;
  c.controllers.push_back({"127.0.0.1", static_cast<uint16_t>(controller.port())});
  c.gpu_backend = "sim";
  c.sim.count = 2;
  c.sample_ms = 100;
  c.heartbeat_ms = 20;
  c.server.command = {"sleep", "37.25"};
  c.server.stop_grace = milliseconds(500);
  std::string log = (gpuha::testing::TestTempDir() / "kern-own.log").string();
  ASSERT_TRUE(common::WriteFileAtomic(log, "").ok());
  c.kernel_log = log;
  RealProcessRunner runner;
  auto probe = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
  ASSERT_TRUE(probe.ok());
  Agent agent(c, std::move(*probe), &runner, common::RealClock::Get());
  ASSERT_TRUE(agent.Start().ok());
  // The server: this test's child "sleep 37.25".
  auto server_pid = [] {
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      std::ifstream in(e.path() / "cmdline");
      std::string cmd((std::istreambuf_iterator<char>(in)), {});
      if (cmd == std::string("sleep\0"
                             "37.25\0",
                             12))
        return std::stol(e.path().filename());
    }
    return 0L;
  };
  long pid = 0;
  ASSERT_TRUE(WaitUntilFor([&] { return (pid = server_pid()) > 0; }));
  std::ofstream(log, std::ios::app) << "NVRM: Xid (PCI:0000:42:00): 13, pid=" << pid
                                    << ", name=sleep, Graphics SM Warp Exception\n";
  ASSERT_TRUE(WaitUntilFor([&] { return agent.counters().xid_server_restarts.load() == 1; }));
  // Restarted: another process now.
  EXPECT_TRUE(WaitUntilFor([&] {
    long now = server_pid();
    return now > 0 && now != pid;
  }));
  std::optional<v1::HealthReason> why;
  auto hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    why = ReasonFor(h, "gpu1.xid13");
    return why.has_value();
  });
  ASSERT_TRUE(hb.has_value());
  EXPECT_THAT(why->detail(), HasSubstr("this node's inference server"));
  EXPECT_THAT(why->detail(), Not(HasSubstr("not this node's")));
  agent.Stop();
}

TEST_F(AgentTest, AGpuGoneFromThePciBusFailsIt) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  std::filesystem::path pci = gpuha::testing::TestTempDir() / "pci";
  for (const char* slot : {"0000:41:00.0", "0000:42:00.0"}) {
    std::filesystem::create_directories(pci / slot);
    std::ofstream(pci / slot / "vendor") << "0x10de\n";
    std::ofstream(pci / slot / "class") << "0x030200\n";
  }
  c.pci_devices = pci.string();
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.health() == v1::NODE_HEALTH_HEALTHY; }));
  std::filesystem::remove_all(pci / "0000:42:00.0");
  std::optional<v1::HealthReason> why;
  auto hb = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    why = FailedFor(h, "gpu1.lost");
    return why.has_value() && h.gpus_size() == 2;
  });
  ASSERT_TRUE(hb.has_value());
  EXPECT_THAT(why->detail(), HasSubstr("gone from the PCI bus"));
  EXPECT_TRUE(hb->heartbeat.gpus(1).lost());
  EXPECT_FALSE(hb->heartbeat.gpus(0).lost());
  EXPECT_GE(agent->counters().gpus_vanished.load(), 1u);
}

TEST_F(AgentTest, AnExplicitKernelLogOrPciTreeThatIsMissingIsAStartError) {
  AgentConfig c = Config({1});
  c.kernel_log = "/nonexistent/kmsg";
  auto probe = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
  Agent a(c, std::move(*probe), &runner_, common::RealClock::Get());
  absl::Status s = a.Start();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gpu.kernel_log: kernel log '/nonexistent/kmsg'"));
  c.kernel_log = "";
  c.pci_devices = "/nonexistent/pci";
  probe = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
  Agent b(c, std::move(*probe), &runner_, common::RealClock::Get());
  s = b.Start();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gpu.pci_devices: PCI devices '/nonexistent/pci'"));
}

TEST_F(AgentTest, ThermalRampDrainsBeforeTheGpuFails) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.sim.faults = {gpu::Fault{
      .at_ms = 0, .gpu = 0, .kind = gpu::FaultKind::kTempRamp, .to_c = 95, .over_ms = 300}};
  auto agent = Start(c);
  auto hb = controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.health() == v1::NODE_HEALTH_DRAINING; });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->heartbeat.reasons(0).code(), "gpu0.temperature");
}

TEST_F(AgentTest, FenceIsObeyedAndStaleEpochsAreIgnored) {
  FakeController controller;
  auto agent = Start(Config({controller.port()}));
  ASSERT_TRUE(controller.WaitForHello());
  controller.Send(FenceAt(5));
  auto hb = controller.WaitForHeartbeat([](const v1::Heartbeat& h) { return h.fenced(); });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->heartbeat.epoch(), 5u);
  EXPECT_FALSE(hb->heartbeat.server().ready());
  v1::ControllerMessage rejoin;
  rejoin.mutable_rejoin()->set_epoch(3);  // older than 5: must be ignored
  controller.Send(rejoin);
  ASSERT_TRUE(WaitUntil([&] { return agent->counters().stale_commands.load() == 1; }));
  EXPECT_TRUE(agent->fenced());
  rejoin.mutable_rejoin()->set_epoch(6);
  rejoin.mutable_rejoin()->set_role("passive");
  controller.Send(rejoin);
  ASSERT_TRUE(controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return !h.fenced() && h.epoch() == 6; }));
}

// A server the agent does not start (a Triton pod beside the agent's pod),
// watched through its readiness URL: its state reaches the controller, and
// a planned stop says goodbye with the server serving on.
TEST_F(AgentTest, AWatchedServerIsProbedAndAPlannedStopSaysGoodbye) {
  std::atomic<bool> ready{true};
  auto server = common::HttpServer::Start(
      {.address = "127.0.0.1", .port = 0}, [&](const common::HttpRequest&) {
        return common::HttpResponse{ready ? 200 : 503, "text/plain", "", {}};
      });
  ASSERT_TRUE(server.ok()) << server.status();
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.server.ready_url = absl::StrCat("http://127.0.0.1:", (*server)->port(), "/v2/health/ready");
  c.server.fence_mode = FenceMode::kUnready;
  c.server.probe_interval = milliseconds(20);
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    return h.server().running() && h.server().ready();
  })) << "the watched server's readiness never reached the controller";
  // Probed before the first heartbeat: a restarted agent does not report a
  // serving server "not ready" (the controller would take the node out).
  EXPECT_TRUE(controller.heartbeats().front().heartbeat.server().ready());
  ready = false;
  ASSERT_TRUE(
      controller.WaitForHeartbeat([](const v1::Heartbeat& h) { return !h.server().ready(); }));
  ready = true;
  ASSERT_TRUE(
      controller.WaitForHeartbeat([](const v1::Heartbeat& h) { return h.server().ready(); }));
  agent->Leave(milliseconds(5000));
  auto bye = controller.WaitForGoodbye(milliseconds(1000));
  ASSERT_TRUE(bye.has_value());
  EXPECT_FALSE(bye->server_stops());
  EXPECT_THAT(bye->reason(), HasSubstr("SIGTERM"));
}

// Issue 16: a server per GPU, each probed alone; a GPU's own fault is its
// GPU's verdict, not the node's.
TEST_F(AgentTest, ServersPerGpuAreProbedAloneAndAGpuFaultStaysOnItsGpu) {
  std::atomic<bool> gpu1_ready{true};
  std::vector<std::unique_ptr<common::HttpServer>> servers;
  // Two servers on consecutive ports (port_base + GPU index).
  const int base = ServeConsecutive(
      2, [&](int g) { return g == 1 && !gpu1_ready ? 503 : 200; }, &servers);
  ASSERT_NE(base, 0) << "no two free consecutive ports";
  FakeController controller;
  auto agent = Start(PerGpuConfig(controller.port(), base, 3));
  auto hello = controller.WaitForHello();
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->registration().gpu_servers_size(), 2);
  EXPECT_EQ(hello->registration().gpu_servers(1).index(), 1u);
  EXPECT_EQ(hello->registration().gpu_servers(1).address(), absl::StrCat("127.0.0.1:", base + 1));
  EXPECT_EQ(hello->registration().gpu_servers(0).capacity(), 3);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    return h.gpu_health_size() == 2 && h.gpu_health(0).server_ready() &&
           h.gpu_health(1).server_ready() && h.server().ready();
  }));
  gpu1_ready = false;  // GPU 1's server stops answering: the node still serves
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    return h.gpu_health_size() == 2 && !h.gpu_health(1).server_ready() &&
           h.gpu_health(0).server_ready() && h.server().ready();
  }));
  gpu1_ready = true;
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=48,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 202) << r->body;
  auto hb = controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    return h.gpu_health_size() == 2 && h.gpu_health(1).health() == v1::NODE_HEALTH_FAILED;
  });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->heartbeat.health(), v1::NODE_HEALTH_HEALTHY);  // the node's own verdict
  EXPECT_EQ(hb->heartbeat.reasons_size(), 0);
  EXPECT_EQ(hb->heartbeat.gpu_health(0).health(), v1::NODE_HEALTH_HEALTHY);
  ASSERT_GT(hb->heartbeat.gpu_health(1).reasons_size(), 0);
  EXPECT_EQ(hb->heartbeat.gpu_health(1).reasons(0).code(), "gpu1.xid48");
}

// Issue 16: a GPU with MIG on runs a server per MIG instance, each its own
// unit; a lost instance fails that slice only.
TEST_F(AgentTest, AServerPerMigInstanceAndALostInstanceIsThatSlicesVerdict) {
  std::vector<std::unique_ptr<common::HttpServer>> servers;
  const int base = ServeConsecutive(
      6, [](int) { return 200; }, &servers);
  ASSERT_NE(base, 0) << "no six free consecutive ports";
  FakeController controller;
  AgentConfig c = PerGpuConfig(controller.port(), base, 6);
  c.sim.mig = 3;  // GPU 0 and 1: three 8 GB instances each, of an L4's 24
  auto agent = Start(c);
  auto hello = controller.WaitForHello();
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->registration().gpu_servers_size(), 6);
  const v1::GpuServer& s4 = hello->registration().gpu_servers(4);
  EXPECT_EQ(s4.index(), 1u);
  ASSERT_TRUE(s4.has_slice());
  EXPECT_EQ(s4.slice(), 1u);
  EXPECT_EQ(s4.profile(), "1g.8gb");
  EXPECT_EQ(s4.capacity(), 2);                                    // 6 split in 3
  EXPECT_EQ(s4.address(), absl::StrCat("127.0.0.1:", base + 4));  // ports in order
  auto ready = [](const v1::Heartbeat& h, int place) {
    return h.gpu_health_size() == 6 && h.gpu_health(place).server_ready();
  };
  ASSERT_TRUE(controller.WaitForHeartbeat(
      [&](const v1::Heartbeat& h) { return ready(h, 3) && ready(h, 4) && ready(h, 5); }));
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=mig_lost,gpu=1,slice=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 202) << r->body;
  auto hb = controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    return h.gpu_health_size() == 6 && h.gpu_health(4).health() == v1::NODE_HEALTH_FAILED;
  });
  ASSERT_TRUE(hb.has_value());
  const v1::Heartbeat& beat = hb->heartbeat;
  EXPECT_EQ(beat.health(), v1::NODE_HEALTH_HEALTHY);
  EXPECT_EQ(beat.gpu_health(4).index(), 1u);
  EXPECT_EQ(beat.gpu_health(4).slice(), 1u);
  ASSERT_EQ(beat.gpu_health(4).reasons_size(), 1);
  EXPECT_EQ(beat.gpu_health(4).reasons(0).code(), "gpu1.mig1.lost");
  for (int place : {3, 5}) {
    EXPECT_EQ(beat.gpu_health(place).health(), v1::NODE_HEALTH_HEALTHY) << place;
    EXPECT_EQ(beat.gpu_health(place).reasons_size(), 0) << place;
  }
  r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                       "kind=mig_lost,gpu=1,slice=3", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("slice: MIG instance 3 does not exist"));
}

// Issue 16: a GPU failed by its XID is remediated: on a passthrough host
// its PCI function is rebound (a fake sysfs tree here), and the GPU is
// judged again from scratch; the heartbeat names the step.
TEST_F(AgentTest, AFailedGpuIsReboundThroughSysfsAndJudgedAgain) {
  namespace fs = std::filesystem;
  fs::path root = gpuha::testing::TestTempDir() / "pci";
  const std::string gpu1 = gpu::SysfsPciAddress(gpu::SimPciBusId(1));
  fs::create_directories(root / "drivers" / "nvidia");
  std::ofstream(root / "drivers" / "nvidia" / "bind").flush();
  std::ofstream(root / "drivers" / "nvidia" / "unbind").flush();
  fs::create_directories(root / "devices" / gpu1);
  std::ofstream(root / "devices" / gpu1 / "driver_override").flush();
  fs::create_directory_symlink("../../drivers/nvidia", root / "devices" / gpu1 / "driver");
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.remediation.rebind_driver = "nvidia";
  c.remediation.sysfs_pci = root.string();
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  auto r = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                            "kind=xid,xid=48,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.health() == v1::NODE_HEALTH_FAILED; }));
  auto remedied = controller.WaitForHeartbeat([&](const v1::Heartbeat& h) {
    for (const v1::HealthReason& r : h.reasons()) {
      if (r.code() == "gpu1.remediation" &&
          r.detail() == absl::StrCat("reset: rebound ", gpu1, " to nvidia")) {
        return true;
      }
    }
    return false;
  });
  ASSERT_TRUE(remedied.has_value());
  EXPECT_EQ(common::ReadFile((root / "drivers" / "nvidia" / "bind").string()).value_or(""), gpu1);
  // Its XID forgotten, the node is healthy again after the healthy samples.
  EXPECT_TRUE(controller.WaitForHeartbeat(
      [](const v1::Heartbeat& h) { return h.health() == v1::NODE_HEALTH_HEALTHY; }));
}

// Issue 52, item 9: an XID whose catalog action is a reboot (79,
// RESTART_BM) reaches the reboot hook: the node drains, and once the
// controller fenced it (its work moved) the hook runs, its run written to
// the reboot history first. Before, node-level verdicts never reached the
// remediator and recovery was manual.
TEST_F(AgentTest, ARebootXidRunsTheRebootHookOnceTheNodeIsFenced) {
  const std::filesystem::path dir = gpuha::testing::TestTempDir();
  const std::string ran = (dir / "rebooted").string();
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.remediation.reboot = {"/bin/sh", "-c", "echo {node} > " + ran};
  c.remediation.reboot_history = (dir / "reboots").string();
  RealProcessRunner processes;
  Agent agent(c, std::move(*gpu::SimProbe::Create(c.sim, common::RealClock::Get())), &processes,
              common::RealClock::Get());
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(controller.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  auto r = common::HttpCall("POST", "127.0.0.1", agent.http_port(), "/v1/sim/faults",
                            "kind=xid,xid=79,gpu=1", milliseconds(2000));
  ASSERT_TRUE(r.ok());
  auto waiting = controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    std::optional<v1::HealthReason> n = ReasonFor(h, "node.remediation");
    return n && absl::StrContains(n->detail(), "waiting for the node's work to move") &&
           absl::StrContains(n->detail(), "gpu1.xid79");
  });
  ASSERT_TRUE(waiting.has_value());
  EXPECT_FALSE(std::filesystem::exists(ran));  // not before the fence
  controller.Send(FenceAt(1));
  auto done = controller.WaitForHeartbeat([](const v1::Heartbeat& h) {
    std::optional<v1::HealthReason> n = ReasonFor(h, "node.remediation");
    return n && n->detail() == "reboot: exit 0";
  });
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(common::ReadFile(ran).value_or(""), "gpu-1\n");
  auto history = common::ReadFile(c.remediation.reboot_history);
  ASSERT_TRUE(history.ok());
  EXPECT_EQ(std::count(history->begin(), history->end(), '\n'), 1);
  agent.Stop();
}

// Nothing to tell: an agent that is not connected stops at once.
TEST_F(AgentTest, APlannedStopWithNoControllerDoesNotWait) {
  AgentConfig c = Config({1});  // nothing listens on port 1
  auto agent = Start(c);
  auto started = std::chrono::steady_clock::now();
  agent->Leave(std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

TEST_F(AgentTest, ReconnectsToTheNextControllerWhenOneDies) {
  auto first = std::make_unique<FakeController>();
  FakeController second;
  auto agent = Start(Config({first->port(), second.port()}));
  ASSERT_TRUE(first->WaitForHello());
  first->Shutdown();
  auto hello = second.WaitForHello(milliseconds(8000));
  ASSERT_TRUE(hello.has_value());
  EXPECT_TRUE(second.WaitForHeartbeat([](const v1::Heartbeat&) { return true; }));
  EXPECT_GE(agent->counters().reconnects.load(), 1u);
}

TEST_F(AgentTest, UnreachableControllerIsRetried) {
  FakeController later;
  int port = later.port();
  later.Shutdown();  // nobody listens on `port` yet
  auto agent = Start(Config({port}));
  EXPECT_TRUE(WaitUntil([&] { return agent->counters().reconnects.load() >= 2; }));
  EXPECT_FALSE(agent->connected());
  FakeController up(port);
  EXPECT_TRUE(up.WaitForHello(milliseconds(8000)).has_value());
}

TEST_F(AgentTest, HangFaultSilencesHeartbeatsButKeepsTheStream) {
  FakeController controller;
  AgentConfig c = Config({controller.port()});
  c.sim.faults = {gpu::Fault{.at_ms = 300, .kind = gpu::FaultKind::kAgentHang, .for_ms = 500}};
  auto agent = Start(c);
  ASSERT_TRUE(controller.WaitForHello());
  // Heartbeats until the hang is over: the longest silence, and beats after it.
  auto longest = milliseconds(0);
  EXPECT_TRUE(WaitUntil([&] {
    auto beats = controller.heartbeats();
    longest = milliseconds(0);
    size_t after_gap = 0;
    for (size_t i = 1; i < beats.size(); ++i) {
      auto gap = std::chrono::duration_cast<milliseconds>(beats[i].at - beats[i - 1].at);
      if (gap > longest) {
        longest = gap;
        after_gap = beats.size() - i;  // beats from the end of the gap on
      }
    }
    return longest.count() >= 400 && after_gap >= 3;
  }));
  EXPECT_GE(longest.count(), 400);
  EXPECT_EQ(controller.hello_count(), 1u) << "the stream must stay open through the hang";
}

// Stop() may land while the stream is still starting: the call is cancelled
// before it began, and the agent must not wait for a hello it never wrote.
TEST_F(AgentTest, StopWhileTheStreamStartsDoesNotHang) {
  FakeController controller;
  for (int i = 0; i < 30; ++i) {
    auto agent = Start(Config({controller.port()}));
    // Stop at a different moment of the start-up each time.
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 10)));
    // Stop on another thread, so a hang fails here with the iteration
    // instead of at the ctest timeout. A hung agent is leaked on purpose.
    auto stopped = std::make_shared<std::promise<void>>();
    std::future<void> done = stopped->get_future();
    std::thread([a = agent.release(), stopped] {
      a->Stop();
      delete a;
      stopped->set_value();
    }).detach();
    ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "Agent::Stop() hung (iteration " << i << ")";
  }
}

TEST_F(AgentTest, DcgmNamesCanBeTurnedOffWhereDcgmExporterRuns) {
  FakeController controller;
  AgentConfig config = Config({controller.port()});
  config.dcgm_names = false;
  auto agent = Start(config);
  auto m =
      common::HttpCall("GET", "127.0.0.1", agent->http_port(), "/metrics", "", milliseconds(2000));
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body, Not(HasSubstr("DCGM_FI_")));
  EXPECT_THAT(m->body, HasSubstr("gpuha_agent_gpu_lost{node=\"gpu-1\",gpu=\"0\""));
}

// The kubelet's pod-resources service on a unix socket: real gRPC, a set answer.
class FakeKubelet final : public ::v1::PodResourcesLister::Service {
 public:
  explicit FakeKubelet(const std::string& socket) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeKubelet() override { server_->Shutdown(); }
  bool running() const { return server_ != nullptr; }
  // pod/namespace/container holds `ids` of `resource`.
  void Hold(const std::string& pod, const std::string& ns, const std::string& container,
            const std::string& resource, std::vector<std::string> ids) {
    std::lock_guard<std::mutex> lock(mu_);
    ::v1::PodResources* p = answer_.add_pod_resources();
    p->set_name(pod);
    p->set_namespace_(ns);
    ::v1::ContainerResources* c = p->add_containers();
    c->set_name(container);
    ::v1::ContainerDevices* d = c->add_devices();
    d->set_resource_name(resource);
    for (const std::string& id : ids) d->add_device_ids(id);
  }
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* r) override {
    std::lock_guard<std::mutex> lock(mu_);
    *r = answer_;
    return grpc::Status::OK;
  }

 private:
  std::mutex mu_;
  ::v1::ListPodResourcesResponse answer_;
  std::unique_ptr<grpc::Server> server_;
};

TEST(GpuOwnersTest, NvidiaDevicesByUuidReplicaOrIndex) {
  std::vector<gpu::DeviceInfo> devices(3);
  for (uint32_t i = 0; i < 3; ++i) {
    devices[i].index = i;
    devices[i].uuid = absl::StrCat("GPU-", i);
  }
  ::v1::ListPodResourcesResponse list;
  auto hold = [&](const char* pod, const char* resource, std::vector<std::string> ids) {
    ::v1::PodResources* p = list.add_pod_resources();
    p->set_name(pod);
    p->set_namespace_("ns");
    ::v1::ContainerResources* c = p->add_containers();
    c->set_name("main");
    ::v1::ContainerDevices* d = c->add_devices();
    d->set_resource_name(resource);
    for (const std::string& id : ids) d->add_device_ids(id);
  };
  hold("a", "nvidia.com/gpu", {"GPU-0"});
  hold("b", "nvidia.com/gpu", {"GPU-1::0", "GPU-1::1"});  // two replicas: one holder
  hold("c", "nvidia.com/gpu", {"GPU-1::2"});
  hold("d", "nvidia.com/gpu", {"2"});                 // DEVICE_ID_STRATEGY=index
  hold("e", "example.com/fpga", {"GPU-0"});           // not NVIDIA's
  hold("f", "nvidia.com/mig-1g.10gb", {"MIG-7a2c"});  // no such GPU listed
  hold("g", "nvidia.com/gpu", {"7"});                 // no GPU 7 here
  GpuOwners owners = GpuOwnersFromList(list, devices);
  ASSERT_EQ(owners.size(), 3u);
  EXPECT_EQ(owners[0], (std::vector<PodRef>{{"a", "ns", "main"}}));
  EXPECT_EQ(owners[1], (std::vector<PodRef>{{"b", "ns", "main"}, {"c", "ns", "main"}}));
  EXPECT_EQ(owners[2], (std::vector<PodRef>{{"d", "ns", "main"}}));
}

// Under Kubernetes, the DCGM series carry dcgm-exporter's pod labels, read
// from the kubelet; a kubelet that stops answering leaves the last answer.
TEST_F(AgentTest, GpuSeriesCarryThePodThatHoldsTheGpu) {
  FakeController controller;
  AgentConfig config = Config({controller.port()});
  std::string socket = (gpuha::testing::TestTempDir() / "kubelet.sock").string();
  auto kubelet = std::make_unique<FakeKubelet>(socket);
  ASSERT_TRUE(kubelet->running());
  auto sim = gpu::SimProbe::Create(config.sim, common::RealClock::Get());
  ASSERT_TRUE(sim.ok());
  std::vector<gpu::DeviceInfo> devices = *(*sim)->Devices();
  kubelet->Hold("llama-0", "serving", "triton", "nvidia.com/gpu", {devices[0].uuid});
  kubelet->Hold("cv-a", "vision", "worker", "nvidia.com/gpu", {devices[1].uuid + "::0"});
  kubelet->Hold("cv-b", "vision", "worker", "nvidia.com/gpu", {devices[1].uuid + "::1"});
  config.pod_resources = socket;
  config.pod_resources_interval = milliseconds(100);
  auto agent = Start(config);
  auto metrics = [&] {
    auto m = common::HttpCall("GET", "127.0.0.1", agent->http_port(), "/metrics", "",
                              milliseconds(2000));
    return m.ok() ? m->body : "";
  };
  const std::string llama = "pod=\"llama-0\",namespace=\"serving\",container=\"triton\"} ";
  ASSERT_TRUE(WaitUntil([&] { return metrics().find(llama) != std::string::npos; })) << metrics();
  std::string body = metrics();
  EXPECT_THAT(body,
              ::testing::ContainsRegex("\nDCGM_FI_DEV_GPU_TEMP\\{gpu=\"0\",[^}]*,pod=\"llama-0\""));
  // A time-sliced GPU: one series per pod holding it.
  for (const char* pod : {"cv-a", "cv-b"}) {
    EXPECT_THAT(body, ::testing::ContainsRegex(
                          absl::StrCat("\nDCGM_FI_DEV_GPU_TEMP\\{gpu=\"1\",[^}]*,pod=\"", pod,
                                       "\",namespace=\"vision\",container=\"worker\"\\} ")));
  }
  EXPECT_THAT(body, HasSubstr("gpuha_agent_pod_resources_errors_total{node=\"gpu-1\"} 0"));
  kubelet.reset();  // the kubelet restarts
  ASSERT_TRUE(WaitUntil([&] {
    return metrics().find("gpuha_agent_pod_resources_errors_total{node=\"gpu-1\"} 0") ==
           std::string::npos;
  }));
  EXPECT_THAT(metrics(), HasSubstr(llama));
}

TEST_F(AgentTest, MetricsUseDcgmNamesAndBadFaultsAreRefused) {
  FakeController controller;
  auto agent = Start(Config({controller.port()}));
  auto m =
      common::HttpCall("GET", "127.0.0.1", agent->http_port(), "/metrics", "", milliseconds(2000));
  ASSERT_TRUE(m.ok());
  EXPECT_THAT(m->body, HasSubstr("# TYPE DCGM_FI_DEV_GPU_TEMP gauge"));
  EXPECT_THAT(m->body, HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-"));
  // dcgm-exporter's labels: Hostname is the OS host name, not the node's.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_THAT(m->body, HasSubstr(absl::StrCat("pci_bus_id=\"00000000:41:00.0\",device=\"nvidia0\","
                                              "modelName=\"NVIDIA L4\",Hostname=\"",
                                              host, "\",DCGM_FI_DRIVER_VERSION=\"sim\"}")));
  // Its other default counters, with its types: ECC and energy are counters.
  for (const char* family :
       {"# TYPE DCGM_FI_DEV_SM_CLOCK gauge", "# TYPE DCGM_FI_DEV_MEM_CLOCK gauge",
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter", "# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge",
        "# TYPE DCGM_FI_DEV_ENC_UTIL gauge", "# TYPE DCGM_FI_DEV_DEC_UTIL gauge",
        "# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter",
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter", "# TYPE DCGM_FI_DEV_RETIRED_SBE counter",
        "# TYPE DCGM_FI_DEV_RETIRED_DBE counter",
        "# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter",
        "# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter",
        "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge", "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge",
        "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge", "# TYPE DCGM_FI_PROF_PCIE_RX_BYTES gauge",
        "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter",
        "# TYPE DCGM_FI_DEV_VGPU_LICENSE_STATUS gauge"}) {
    EXPECT_THAT(m->body, HasSubstr(family));
  }
  // The sim's boards are bare metal without NVLink: those families are
  // declared, no GPU has a value.
  EXPECT_THAT(m->body, Not(HasSubstr("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{")));
  EXPECT_THAT(m->body, Not(HasSubstr("DCGM_FI_DEV_VGPU_LICENSE_STATUS{")));
  EXPECT_THAT(m->body,
              ::testing::ContainsRegex("\nDCGM_FI_DEV_SM_CLOCK\\{gpu=\"0\",[^}]*\\} [1-9]"));
  EXPECT_THAT(m->body, HasSubstr("gpuha_agent_health_state{node=\"gpu-1\",state=\"healthy\"} 1"));
  // Every declared counter is shown.
#define GPUHA_SHOWN(name, help) \
  EXPECT_THAT(m->body, HasSubstr("# TYPE gpuha_agent_" #name "_total counter"));
  GPUHA_AGENT_COUNTERS(GPUHA_SHOWN)
#undef GPUHA_SHOWN
  auto h =
      common::HttpCall("GET", "127.0.0.1", agent->http_port(), "/healthz", "", milliseconds(2000));
  EXPECT_THAT(h->body, HasSubstr("\"health\":\"healthy\""));
  auto bad = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                              "kind=xid,xid=4242", milliseconds(2000));
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("4242 is not a known XID"));
  auto wrong_gpu = common::HttpCall("POST", "127.0.0.1", agent->http_port(), "/v1/sim/faults",
                                    "kind=lost,gpu=9", milliseconds(2000));
  EXPECT_EQ(wrong_gpu->status, 400);
}

}  // namespace
}  // namespace gpuha::agent

namespace gpuha::agent {
namespace {

// Makes a CA, a server certificate for 127.0.0.1 and a client certificate
// with the openssl command line.
class MtlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = gpuha::testing::TestTempDir().string();
    ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir_));
  }
  std::shared_ptr<grpc::ServerCredentials> ServerCreds() {
    grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    o.pem_root_certs = *common::ReadFile(dir_ + "/ca.pem");
    o.pem_key_cert_pairs.push_back(
        {*common::ReadFile(dir_ + "/server.key"), *common::ReadFile(dir_ + "/server.pem")});
    return grpc::SslServerCredentials(o);
  }
  AgentConfig Config(int port) {
    AgentConfig c;
    c.node = "tls-1";
    c.listen.port = 0;
    c.controllers = {{"127.0.0.1", static_cast<uint16_t>(port)}};
    c.gpu_backend = "sim";
    c.heartbeat_ms = 20;
    c.tls_ca = dir_ + "/ca.pem";
    return c;
  }
  std::unique_ptr<Agent> Start(AgentConfig c) {
    auto probe = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
    auto a = std::make_unique<Agent>(c, std::move(*probe), &runner_, common::RealClock::Get());
    EXPECT_TRUE(a->Start().ok());
    return a;
  }
  std::string dir_;
  NoProcesses runner_;
};

TEST_F(MtlsTest, AgentWithClientCertificateConnects) {
  FakeController controller(0, ServerCreds());
  AgentConfig c = Config(controller.port());
  c.tls_cert = dir_ + "/agent.pem";
  c.tls_key = dir_ + "/agent.key";
  auto agent = Start(c);
  auto hello = controller.WaitForHello(milliseconds(8000));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->node(), "tls-1");
}

TEST_F(MtlsTest, AgentWithoutClientCertificateIsRefused) {
  FakeController controller(0, ServerCreds());
  auto agent = Start(Config(controller.port()));
  EXPECT_FALSE(controller.WaitForHello(milliseconds(2500)).has_value());
  EXPECT_FALSE(agent->connected());
  EXPECT_GE(agent->counters().reconnects.load(), 1u);
}

}  // namespace
}  // namespace gpuha::agent
