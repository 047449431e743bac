#include "controller/controller_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

std::string Err(absl::string_view yaml) {
  auto c = ParseControllerConfig(yaml, "c.yaml");
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(ControllerConfigTest, ParsesAFullConfig) {
  std::string admin = Sha256Hex("s3cret");
  auto c = ParseControllerConfig(R"(
cluster: { redundancy: 1 }
nodes:
  - { name: gpu-1, role: active, capacity: 10, address: "127.0.0.1:8001" }
  - { name: gpu-2, role: passive, capacity: 10, address: "127.0.0.1:8002" }
  - { name: cpu-1, role: buffer, capacity: 4, cpu_only: true }
tenants: [acme]
listen: { grpc: "127.0.0.1:0", http: "127.0.0.1:0", heartbeat_datagrams: false }
tokens:
  - { name: ops, role: admin, sha256: ")" +
                                     admin + R"(" }
fence: { hook: "kubectl cordon {node}", timeout_ms: 2000 }
detector: { floor_ms: 120, k: 3 }
recovery: { healthy_for_ms: 800, max_failures: 2, window_s: 60, restart_grace_ms: 45000 }
)",
                                 "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->nodes.size(), 3u);
  EXPECT_EQ(c->nodes[1].spec.role, Role::kPassive);
  EXPECT_TRUE(c->nodes[2].spec.cpu_only);
  EXPECT_EQ(c->tokens.at(admin).role, ApiRole::kAdmin);
  EXPECT_EQ(c->detector.floor, std::chrono::milliseconds(120));
  EXPECT_FALSE(c->heartbeat_datagrams);
  EXPECT_EQ(c->max_failures, 2);
  EXPECT_EQ(c->restart_grace, std::chrono::milliseconds(45000));
  EXPECT_EQ(c->fence_hook, "kubectl cordon {node}");
}

// Issue 16: servers per GPU and per slice (MIG instances, vGPU profiles).
TEST(ControllerConfigTest, GpuServersAndSlicesAreUnitsOfTheirNode) {
  auto c = ParseControllerConfig(R"(
nodes:
  - name: g1
    domain: r1
    gpu_servers:
      - { index: 0, address: "127.0.0.1:9100", grpc_address: "127.0.0.1:9200", capacity: 4 }
      - { index: 1, slice: 0, profile: L4-4Q, address: "127.0.0.1:9101", capacity: 1 }
      - { index: 1, slice: 1, profile: L4-4Q, address: "127.0.0.1:9102", capacity: 1 }
  - { name: g2, capacity: 6, address: "127.0.0.1:8000", grpc_address: "127.0.0.1:8001" }
)",
                                 "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const NodeConfig& g1 = c->nodes[0];
  EXPECT_EQ(g1.spec.capacity, 6);
  std::vector<NodeSpec> units = UnitSpecs(g1);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[2].id, "g1/gpu1/mig1");
  EXPECT_EQ(units[2].host, "g1");
  EXPECT_EQ(units[2].domain, "r1");
  EXPECT_EQ(NodeOfUnit(units[2].id), "g1");
  EXPECT_EQ(UnitAddress(g1, "g1/gpu1/mig1"), "127.0.0.1:9102");
  EXPECT_EQ(UnitAddress(g1, "g1/gpu0"), "127.0.0.1:9100");
  EXPECT_EQ(UnitAddress(g1, "g1/gpu1"), "");  // split: the GPU itself is no unit
  ASSERT_NE(GpuServerOfUnit(g1, "g1/gpu1/mig0"), nullptr);
  EXPECT_EQ(GpuServerOfUnit(g1, "g1/gpu1/mig0")->profile, "L4-4Q");
  EXPECT_EQ(GpuServerOfUnit(g1, "g1"), nullptr);
  EXPECT_EQ(UnitGrpcAddress(g1, "g1/gpu0"), "127.0.0.1:9200");
  EXPECT_EQ(UnitGrpcAddress(g1, "g1/gpu1/mig0"), "");  // serves no gRPC
  EXPECT_EQ(UnitGrpcAddress(c->nodes[1], "g2"), "127.0.0.1:8001");

  const std::string head = "nodes:\n  - name: a\n    gpu_servers:\n";
  EXPECT_THAT(Err(head + "      - { index: 0, slice: 64, address: \"h:1\", capacity: 1 }\n"),
              HasSubstr("nodes[0].gpu_servers[0].slice: must be between 0 and 63, got 64"));
  EXPECT_THAT(Err(head + "      - { index: 0, address: \"h:1\", capacity: 1 }\n" +
                  "      - { index: 0, slice: 1, address: \"h:2\", capacity: 1 }\n"),
              HasSubstr("gpu_servers[1].slice: GPU 0 is listed both whole and by slices"));
  EXPECT_THAT(Err(head + "      - { index: 0, slice: 1, profile: \"a b\", address: \"h:2\", "
                         "capacity: 1 }\n"),
              HasSubstr("gpu_servers[0].profile: 'a b' must be 1-63 of [A-Za-z0-9._+-]"));
  EXPECT_THAT(Err(head + "      - { index: 0, address: \"h:1\", grpc_address: x, capacity: 1 }\n"),
              HasSubstr("gpu_servers[0].grpc_address: 'x' is not HOST:PORT"));
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 1, grpc_address: x }\n"),
              HasSubstr("nodes[0].grpc_address: 'x' is not HOST:PORT"));
}

TEST(ControllerConfigTest, DuplicateNodesAndImpossibleKAreRefused) {
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 1 }\n  - { name: a, capacity: 1 }\n"),
              HasSubstr("c.yaml:3:13: nodes[1].name: node 'a' is listed twice"));
  EXPECT_THAT(Err("cluster: { redundancy: 2 }\nnodes:\n  - { name: a, capacity: 1 }\n"
                  "  - { name: b, capacity: 1 }\n"),
              HasSubstr("cluster.redundancy: k=2 is impossible with 2 node(s)"));
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 0 }\n"),
              HasSubstr("nodes[0].capacity: must be between 1 and 1000000, got 0"));
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 1, role: standby }\n"),
              HasSubstr("nodes[0].role: 'standby' is not one of"));
  EXPECT_THAT(Err("cluster: {}\n"), HasSubstr("nodes: is required"));
  EXPECT_THAT(Err("nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\n"
                  "tokens: [{ name: t, role: admin, sha256: abc }]\n"),
              HasSubstr("tokens[0].sha256: '"));
  EXPECT_THAT(
      Err("nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\nlisten: { rpc: x }\n"),
      HasSubstr("listen.rpc: unknown key"));
}

// Regression: each of these passed validation and broke at run time.
TEST(ControllerConfigTest, ValuesThatBreakLaterAreRefusedNamingTheField) {
  const std::string two = "nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\n";
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 9223372036854775807 }\n  - { name: b, "
                  "capacity: 1 }\n"),
              HasSubstr("nodes[0].capacity: must be between 1 and 1000000"));
  EXPECT_THAT(Err("nodes:\n  - { name: rack1/n1, capacity: 1 }\n  - { name: b, capacity: 1 }\n"),
              HasSubstr("c.yaml:2:13: nodes[0].name: 'rack1/n1' must be 1-63 of"));
  EXPECT_THAT(Err("nodes:\n  - { name: a, capacity: 1, address: nowhere }\n  - { name: b, "
                  "capacity: 1 }\n"),
              HasSubstr("nodes[0].address: 'nowhere' is not HOST:PORT"));
  EXPECT_THAT(Err(two + "tenants: [\"a b\"]\n"), HasSubstr("tenants: 'a b' must be"));
  EXPECT_THAT(Err(two + "startup_grace_ms: 9223372036854775807\n"),
              HasSubstr("startup_grace_ms: must be between"));
  EXPECT_THAT(Err(two + "recovery: { window_s: 9223372036854775807 }\n"),
              HasSubstr("recovery.window_s: must be between 1 and"));
  EXPECT_THAT(Err(two + "recovery: { restart_grace_ms: 700000 }\n"),
              HasSubstr("recovery.restart_grace_ms: must be between 0 and 600000"));
  EXPECT_THAT(Err(two + "recovery: { restart_grace_ms: soon }\n"),
              HasSubstr("recovery.restart_grace_ms:"));
  EXPECT_THAT(Err(two + "listen: { grpc: \"nowhere\" }\n"),
              HasSubstr("c.yaml:2:17: listen.grpc: 'nowhere' is not HOST:PORT"));
  EXPECT_THAT(Err(two + "listen: { heartbeat_datagrams: sometimes }\n"),
              HasSubstr("listen.heartbeat_datagrams:"));
  const std::string hash = Sha256Hex("t");
  EXPECT_THAT(Err(two + "tokens:\n  - { name: v, role: viewer, sha256: " + hash +
                  " }\n  - { name: x, role: admin, sha256: " + hash + " }\n"),
              HasSubstr("tokens[1].sha256: this token hash is already listed (as 'v')"));
  EXPECT_THAT(Err(two + "---\nnodes: []\n"), HasSubstr("c.yaml:3: a second YAML document"));
  EXPECT_THAT(Err(two + "fence: { quarantine_max_share: 0 }\n"),
              HasSubstr("fence.quarantine_max_share: must be above 0 and at most 1"));
}

// Safe by default: an API without tokens listens on loopback only.
TEST(ControllerConfigTest, AnApiWithoutTokensIsRefusedOffLoopback) {
  const std::string two = "nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\n";
  for (const char* addr : {"0.0.0.0:7401", "10.1.2.3:7401", "[::]:7401", "gpu-ctl.example:7401"}) {
    EXPECT_THAT(Err(two + "listen: { http: \"" + addr + "\" }\n"),
                HasSubstr("listen.http: serving the API on " + std::string(addr) +
                          " without tokens would give admin rights"))
        << addr;
  }
  for (const char* addr : {"127.0.0.1:7401", "127.3.4.5:7401", "localhost:7401", "[::1]:7401"}) {
    auto c = ParseControllerConfig(two + "listen: { http: \"" + addr + "\" }\n", "c.yaml");
    EXPECT_TRUE(c.ok()) << addr << ": " << c.status();
  }
  auto with_tokens = ParseControllerConfig(
      two + "listen: { http: \"0.0.0.0:7401\" }\ntokens: [{ name: a, role: admin, sha256: " +
          Sha256Hex("k") + " }]\n",
      "c.yaml");
  EXPECT_TRUE(with_tokens.ok()) << with_tokens.status();
}

// A config that lists no nodes: agents register them under its policy.
TEST(ControllerConfigTest, RegistrationPolicyReplacesTheInventory) {
  const std::string hash = Sha256Hex("join-me");
  auto c = ParseControllerConfig("registration: { enabled: true, join_token_sha256: " + hash +
                                     ", role_label: pool, default_role: passive, max_nodes: 50 }\n"
                                     "listen: { grpc: \"0.0.0.0:7400\" }\n",
                                 "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->nodes.empty());
  EXPECT_TRUE(c->registration.enabled);
  EXPECT_EQ(c->registration.join_token_sha256, hash);
  EXPECT_EQ(c->registration.role_label, "pool");
  EXPECT_EQ(c->registration.default_role, Role::kPassive);
  EXPECT_EQ(c->registration.max_nodes, 50);
  // Without registration the nodes are required, as before.
  EXPECT_THAT(Err("tenants: [a]\n"), HasSubstr("nodes"));
  EXPECT_THAT(Err("registration: { enabled: true, default_role: leader }\n"),
              HasSubstr("registration.default_role"));
  EXPECT_THAT(Err("registration: { enabled: true, join_token_sha256: abc }\n"),
              HasSubstr("registration.join_token_sha256"));
  // Safe by default: registration beyond loopback needs a token or mTLS.
  EXPECT_THAT(Err("registration: { enabled: true }\nlisten: { grpc: \"0.0.0.0:7400\" }\n"),
              HasSubstr("registration.join_token_sha256: registering nodes on 0.0.0.0:7400 "
                        "without a join token or mTLS"));
  EXPECT_TRUE(ParseControllerConfig("registration: { enabled: true }\n", "c.yaml").ok());
  // The flags can move a port off loopback after the file was read.
  ControllerConfig flags = *ParseControllerConfig("registration: { enabled: true }\n", "c.yaml");
  flags.grpc_listen = "0.0.0.0:7400";
  ASSERT_TRUE(CheckExposure(flags).has_value());
  EXPECT_EQ(CheckExposure(flags)->field, "registration.join_token_sha256");
  flags.grpc_listen = "127.0.0.1:7400";
  flags.http_listen = "0.0.0.0:7401";
  ASSERT_TRUE(CheckExposure(flags).has_value());
  EXPECT_EQ(CheckExposure(flags)->field, "listen.http");
}

// Regression: a restarted controller with a 500 ms grace fenced healthy
// nodes whose agents back off up to 2.4 s between reconnects.
TEST(ControllerConfigTest, StartupGraceCoversTheAgentsLongestReconnectWait) {
  const std::string two = "nodes: [{ name: a, capacity: 1 }, { name: b, capacity: 1 }]\n";
  auto c = ParseControllerConfig(two, "c.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->startup_grace, common::ReconnectPolicy::LongestWait());
  EXPECT_THAT(Err(two + "startup_grace_ms: 500\n"),
              HasSubstr("startup_grace_ms: must be between 2400 and 600000 ms, got 500"));
}

TEST(ControllerConfigTest, Sha256MatchesAKnownVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace gpuha::controller

namespace gpuha::controller {
namespace {

TEST(ControllerConfigTest, ShippedExampleLoadsAndItsTokensMatchTheReadme) {
  auto c = LoadControllerConfig(std::string(GPUHA_SOURCE_DIR) + "/examples/controller.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nodes.size(), 4u);
  EXPECT_EQ(c->tokens.at(Sha256Hex("demo-admin")).role, ApiRole::kAdmin);
  EXPECT_EQ(c->tokens.at(Sha256Hex("demo-viewer")).role, ApiRole::kViewer);
  auto etcd =
      LoadControllerConfig(std::string(GPUHA_SOURCE_DIR) + "/examples/controller-etcd.yaml");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EXPECT_EQ(etcd->etcd.endpoints.size(), 3u);
  EXPECT_TRUE(etcd->store_path.empty());
}

TEST(ControllerConfigTest, StoreIsSqliteOrEtcdAndErrorsNameTheField) {
  const std::string nodes =
      "nodes: [{ name: gpu-1, role: active, capacity: 10 }, "
      "{ name: gpu-2, role: passive, capacity: 10 }]\n";
  auto parse = [&](const std::string& store) {
    return ParseControllerConfig(nodes + store, "c.yaml");
  };
  EXPECT_EQ(parse("store: { sqlite: /var/lib/c.db }\n")->store_path, "/var/lib/c.db");
  EXPECT_EQ(parse("store: { path: /var/lib/c.db }\n")->store_path, "/var/lib/c.db");
  auto etcd = parse(
      "store: { etcd: [\"https://10.0.0.1:2379\"], prefix: /a/, lease_ttl_ms: 3000, "
      "tls: { ca: ca.pem, cert: c.pem, key: c.key }, advertise: \"10.0.0.5:7401\" }\n");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EXPECT_EQ(etcd->etcd.endpoints, std::vector<std::string>{"https://10.0.0.1:2379"});
  EXPECT_EQ(etcd->etcd.prefix, "/a/");
  EXPECT_EQ(etcd->etcd.lease_ttl, std::chrono::seconds(3));
  EXPECT_EQ(etcd->etcd.tls_cert, "c.pem");
  EXPECT_EQ(etcd->etcd.advertise, "10.0.0.5:7401");
  for (auto [store, error] : std::vector<std::pair<std::string, std::string>>{
           {"store: { sqlite: a.db, path: b.db }", "store.path: give store.sqlite or store.path"},
           {"store: { etcd: [\"http://h:1\"], sqlite: a.db }", "store.etcd: one store"},
           {"store: { etcd: [] }", "store.etcd: list at least one endpoint"},
           {"store: { etcd: [\"10.0.0.1:2379\"] }", "store.etcd: [0] '10.0.0.1:2379' is not http"},
           {"store: { etcd: [\"http://h:1\"], prefix: gpuha }", "store.prefix: must end with '/'"},
           {"store: { etcd: [\"http://h:1\"], lease_ttl_ms: 100 }",
            "store.lease_ttl_ms: must be between 1000 and 60000"},
           {"store: { sqlite: a.db, prefix: /a/ }", "store.prefix: is for an etcd store"},
           {"store: { etcd: [\"http://h:1\"], max_txn_ops: 0 }",
            "store.max_txn_ops: must be between 1 and 1000000"},
           {"store: { etcd: [\"http://h:1\"], tls: { cert: c.pem } }",
            "store.tls.key: cert and key come together"},
       }) {
    auto c = parse(store + "\n");
    ASSERT_FALSE(c.ok()) << store;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(error)) << store;
  }
}

}  // namespace
}  // namespace gpuha::controller
