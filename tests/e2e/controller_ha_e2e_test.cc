// Controllers on etcd, as real processes on loopback: one leads, the others
// stand by; kill -9 of the leader hands over within the lease's TTL, a
// planned stop (SIGTERM) hands over at once, and a leader that loses etcd
// stops acting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "common/net_util.h"
#include "common/testing/etcd_server.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/child_process.h"

namespace gpuha::e2e {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr char kViewer[] = "demo-viewer";  // its SHA-256 is in the config below

class ControllerHaTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd_.Start()) << etcd_.log(); }

  struct Controller {
    std::unique_ptr<ChildProcess> process;
    uint16_t http_port = 0;
  };
  Controller Start(const std::string& name) {
    Controller c;
    c.http_port = common::FreeLoopbackPort();
    const uint16_t grpc_port = common::FreeLoopbackPort();
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
        etcd_.url(),
        "\"], lease_ttl_ms: 2000 }\n"
        "tokens:\n"
        "  - { name: dashboard, role: viewer, sha256: "
        "\"2c409f0dcce66d0c980ae534d1ccdc0fc6738d7fc35d803949919f4dfa3f8834\" }\n");
    c.process = std::make_unique<ChildProcess>(
        std::vector<std::string>{GPUHA_BINARY, "controller", "--config", path});
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

TEST_F(ControllerHaTest, ALeaderThatLosesEtcdStopsActing) {
  Controller a = Start("a");
  ASSERT_TRUE(Leads(a, milliseconds(10000))) << a.process->err();
  etcd_.Pause();  // etcd hangs (as without quorum): no renewal of the lease
  auto code = a.process->Wait(milliseconds(6000));
  etcd_.Resume();
  ASSERT_TRUE(code.has_value()) << "the leader kept running without its lease";
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(a.process->err(), HasSubstr("leadership lost"));
}

TEST_F(ControllerHaTest, BadStoreSettingsNameTheField) {
  std::string path = (gpuha::testing::TestTempDir() / "bad.yaml").string();
  std::ofstream(path) << "nodes: [{ name: gpu-1, role: active, capacity: 10 },\n"
                         "        { name: gpu-2, role: passive, capacity: 10 }]\n"
                         "store: { etcd: [\"ftp://127.0.0.1:2379\"], sqlite: /tmp/x.db }\n";
  ChildProcess p({GPUHA_BINARY, "controller", "--config", path});
  EXPECT_EQ(p.Wait(milliseconds(10000)), 2);
  EXPECT_THAT(p.err(), HasSubstr("store.etcd"));
}

}  // namespace
}  // namespace gpuha::e2e
