#include "cluster/config_builders.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/agent_config.h"
#include "common/net_util.h"
#include "controller/controller_config.h"
#include "router/router_config.h"

namespace gpuha::cluster {
namespace {

using std::chrono::milliseconds;

TEST(ConfigBuildersTest, QuoteKeepsAnyTextOneScalar) {
  EXPECT_EQ(Quote("a"), "\"a\"");
  EXPECT_EQ(Quote("say \"hi\": [x]"), "\"say \\\"hi\\\": [x]\"");
}

TEST(ConfigBuildersTest, ControllerYamlReadsBackThroughTheControllersParser) {
  ControllerYaml c;
  c.comment = "three nodes";
  c.nodes = {
      {.name = "n1", .capacity = 4, .address = "127.0.0.1:9001", .grpc_address = "127.0.0.1:9101"},
      {.name = "n2", .role = "passive", .capacity = 6, .address = "127.0.0.1:9002"},
      {.name = "n3",
       .role = "passive",
       .gpu_servers = {{.index = 0,
                        .address = "127.0.0.1:9003",
                        .grpc_address = "127.0.0.1:9103",
                        .capacity = 2}}}};
  c.tenants = {"acme", "globex"};
  c.grpc_listen = "127.0.0.1:7500";
  c.store_path = "/tmp/x y/c.db";
  c.healthy_for_ms = 500;
  c.max_failures = 7;
  c.startup_grace_ms = 3000;
  std::string yaml = c.Yaml();
  EXPECT_EQ(yaml.rfind("# three nodes\n", 0), 0u) << yaml;
  auto parsed = controller::ParseControllerConfig(yaml, "c.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << yaml;
  ASSERT_EQ(parsed->nodes.size(), 3u);
  EXPECT_EQ(parsed->nodes[0].grpc_address, "127.0.0.1:9101");
  EXPECT_EQ(parsed->nodes[1].grpc_address, "");
  ASSERT_EQ(parsed->nodes[2].gpu_servers.size(), 1u);
  EXPECT_EQ(parsed->nodes[2].gpu_servers[0].grpc_address, "127.0.0.1:9103");
  EXPECT_EQ(parsed->nodes[0].spec.id, "n1");
  EXPECT_EQ(parsed->nodes[0].spec.role, placement::Role::kActive);
  EXPECT_EQ(parsed->nodes[1].spec.role, placement::Role::kPassive);
  EXPECT_EQ(parsed->nodes[1].spec.capacity, 6);
  EXPECT_EQ(parsed->nodes[1].address, "127.0.0.1:9002");
  EXPECT_EQ(parsed->tenants, (std::vector<std::string>{"acme", "globex"}));
  EXPECT_EQ(parsed->grpc_listen, "127.0.0.1:7500");
  EXPECT_EQ(parsed->http_listen, controller::ControllerConfig().http_listen);  // unset: default
  EXPECT_EQ(parsed->store_path, "/tmp/x y/c.db");
  EXPECT_EQ(parsed->healthy_for, milliseconds(500));
  EXPECT_EQ(parsed->max_failures, 7);
  EXPECT_EQ(parsed->failure_window, controller::ControllerConfig().failure_window);
  EXPECT_EQ(parsed->startup_grace, milliseconds(3000));
}

TEST(ConfigBuildersTest, AgentYamlReadsBackThroughTheAgentsParser) {
  AgentYaml a;
  a.node = "gpu-1";
  a.controllers = {"127.0.0.1:7400", "127.0.0.1:7401"};
  a.sim_model = "L4";
  a.sim_count = 2;
  a.sample_ms = 100;
  a.heartbeat_ms = 50;
  a.listen = "127.0.0.1:9400";
  a.server_command = {"/usr/bin/gpuha", "worker", "--listen", "127.0.0.1:8001"};
  a.ready_url = "http://127.0.0.1:8001/v2/health/ready";
  a.fence_mode = "stop";
  a.metrics_url = "http://127.0.0.1:8001/metrics";
  a.stall_after_ms = 700;
  a.probe_interval_ms = 100;
  a.probe_timeout_ms = 80;
  a.call_deadline_ms = 400;
  a.pci_devices = "/tmp/a node's pci";
  a.per_gpu_port_base = 8001;
  a.per_gpu_grpc_port_base = 9001;
  auto parsed = agent::ParseAgentConfig(a.Yaml(), "a.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << a.Yaml();
  EXPECT_EQ(parsed->node, "gpu-1");
  ASSERT_EQ(parsed->controllers.size(), 2u);
  EXPECT_EQ(parsed->controllers[1].port, 7401);
  EXPECT_EQ(parsed->gpu_backend, "sim");
  EXPECT_EQ(parsed->sim.count, 2);
  EXPECT_EQ(parsed->call_deadline_ms, 400);
  EXPECT_EQ(parsed->pci_devices, "/tmp/a node's pci");
  EXPECT_EQ(parsed->sample_ms, 100);
  EXPECT_EQ(parsed->heartbeat_ms, 50);
  EXPECT_EQ(parsed->listen.port, 9400);
  EXPECT_EQ(parsed->server.command, a.server_command);
  EXPECT_EQ(parsed->server.ready_url, a.ready_url);
  EXPECT_EQ(parsed->server.probe_interval, milliseconds(100));
  EXPECT_EQ(parsed->server.probe_timeout, milliseconds(80));
  EXPECT_EQ(parsed->server.metrics_url, a.metrics_url);
  EXPECT_EQ(parsed->server.stall_after, milliseconds(700));
  EXPECT_EQ(parsed->per_gpu.port_base, 8001);
  EXPECT_EQ(parsed->per_gpu.grpc_port_base, 9001);
}

TEST(ConfigBuildersTest, RouterYamlReadsBackThroughTheRoutersParser) {
  RouterYaml r;
  r.listen = "127.0.0.1:8080";
  r.admin = "127.0.0.1:8081";
  r.threads = 2;
  r.id = "r1";
  r.controllers = {"127.0.0.1:7400"};
  r.tenants = {{.name = "acme",
                .api_keys = {"k1", "k2"},
                .requests_per_second = 100,
                .burst = 200,
                .max_concurrent = 8}};
  r.routes = {
      {.stream = "s1", .tenant = "acme", .primary = "127.0.0.1:1", .standby = "127.0.0.1:2"},
      {.stream = "s2", .tenant = "acme", .primary = "127.0.0.1:2"}};
  r.probe_interval_ms = 20;
  r.hang_after_ms = 100;
  auto parsed = router::ParseRouterConfig(r.Yaml(), "r.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << r.Yaml();
  EXPECT_EQ(parsed->listen.port, 8080);
  EXPECT_EQ(parsed->admin.port, 8081);
  EXPECT_EQ(parsed->threads, 2);
  EXPECT_EQ(parsed->router_id, "r1");
  ASSERT_EQ(parsed->tenants.size(), 1u);
  EXPECT_EQ(parsed->tenants[0].key_hashes,
            (std::vector<std::string>{common::Sha256Hex("k1"), common::Sha256Hex("k2")}));
  EXPECT_EQ(parsed->tenants[0].requests_per_second, 100);
  EXPECT_EQ(parsed->tenants[0].burst, 200);
  EXPECT_EQ(parsed->tenants[0].max_concurrent, 8);
  ASSERT_EQ(parsed->routes.size(), 2u);
  EXPECT_EQ(parsed->routes[0].standby, "127.0.0.1:2");
  EXPECT_EQ(parsed->routes[1].standby, "");
  EXPECT_EQ(parsed->probe_interval, milliseconds(20));
  EXPECT_EQ(parsed->hang_after, milliseconds(100));
}

}  // namespace
}  // namespace gpuha::cluster
