#include "agent/agent_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/pod_resources.h"
#include "common/testing/temp_dir.h"

namespace gpuha::agent {
namespace {

using ::testing::HasSubstr;

std::string Err(const absl::StatusOr<AgentConfig>& c) {
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(AgentConfigTest, ParsesAFullConfig) {
  auto c = ParseAgentConfig(R"(
node: gpu-1
controllers: ["127.0.0.1:7400", "localhost:7401"]
gpu: { backend: sim, sim: { model: T4, count: 2, load: 0.3, seed: 7, cost_model: true },
       slow_sample_ms: 5000 }
intervals: { sample_ms: 250, heartbeat_ms: 25 }
nics: [eth0]
thresholds: { temperature_c: { warn: 80, critical: 88 } }
server: { command: [sleep, "100"], ready_url: "http://127.0.0.1:8001/v2/health/ready",
          fence_mode: unready, probe_interval_ms: 200, probe_timeout_ms: 150 }
listen: 127.0.0.1:9400
)",
                            "agent.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node, "gpu-1");
  ASSERT_EQ(c->controllers.size(), 2u);
  EXPECT_EQ(c->controllers[1].host, "127.0.0.1");
  EXPECT_EQ(c->controllers[1].port, 7401);
  EXPECT_EQ(c->gpu_backend, "sim");
  EXPECT_EQ(c->sim.model, "T4");
  EXPECT_EQ(c->sim.count, 2u);
  EXPECT_TRUE(c->sim.cost_model);
  EXPECT_EQ(c->sim.slow_every, std::chrono::milliseconds(5000));  // the NVML backend's cadence
  EXPECT_EQ(c->heartbeat_ms, 25);
  EXPECT_EQ(c->thresholds.temperature_c.critical, 88);
  EXPECT_EQ(c->server.fence_mode, FenceMode::kUnready);
  EXPECT_EQ(c->server.probe_timeout, std::chrono::milliseconds(150));
  EXPECT_EQ(c->listen.port, 9400);
  EXPECT_TRUE(ValidateAgentConfig(*c).ok());
  // The sim backend reads no kernel log and no PCI tree unless told to.
  EXPECT_EQ(KernelLogPath(*c), "");
  EXPECT_EQ(PciDevicesPath(*c), "");
  EXPECT_EQ(c->call_deadline_ms, 2000);
}

TEST(AgentConfigTest, TheSimCostModelIsOffByDefaultAndABadValueIsNamed) {
  EXPECT_FALSE(ParseAgentConfig("node: a\n", "a.yaml")->sim.cost_model);
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { sim: { cost_model: sometimes } }\n", "a.yaml")),
              HasSubstr("gpu.sim.cost_model"));
}

TEST(AgentConfigTest, DcgmNamesSwitch) {
  EXPECT_TRUE(ParseAgentConfig("node: a\n", "a.yaml")->dcgm_names);
  EXPECT_FALSE(ParseAgentConfig("metrics: { dcgm_names: false }\n", "a.yaml")->dcgm_names);
  EXPECT_THAT(Err(ParseAgentConfig("metrics: { dcgm_names: sometimes }\n", "a.yaml")),
              HasSubstr("metrics.dcgm_names"));
  EXPECT_THAT(Err(ParseAgentConfig("metrics: { dcgm: false }\n", "a.yaml")),
              HasSubstr("metrics.dcgm"));
}

TEST(AgentConfigTest, PodResourcesSocketAutoOffOrAPath) {
  auto c = ParseAgentConfig("node: a\n", "a.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pod_resources, "auto");
  // "auto" reads the kubelet's socket only where there is one.
  EXPECT_EQ(PodResourcesSocket(*c),
            std::filesystem::exists(kKubeletPodResourcesSocket) ? kKubeletPodResourcesSocket : "");
  c = ParseAgentConfig("metrics: { pod_resources: /run/k.sock, pod_resources_interval_ms: 5000 }\n",
                       "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(PodResourcesSocket(*c), "/run/k.sock");
  EXPECT_EQ(c->pod_resources_interval, std::chrono::seconds(5));
  c->pod_resources = "off";
  EXPECT_EQ(PodResourcesSocket(*c), "");
  EXPECT_THAT(Err(ParseAgentConfig("metrics: { pod_resources_interval_ms: 5 }\n", "a.yaml")),
              HasSubstr("metrics.pod_resources_interval_ms: must be between 100 and 600000 ms"));
}

// The example the package installs and the README points at loads as is.
TEST(AgentConfigTest, TheExampleLoads) {
  auto c = LoadAgentConfig(GPUHA_SOURCE_DIR "/examples/agent.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateAgentConfig(*c).ok());
  EXPECT_EQ(c->node, "gpu-1");
  EXPECT_EQ(c->gpu_backend, "nvml");
  EXPECT_EQ(KernelLogPath(*c), "/dev/kmsg");
  EXPECT_EQ(c->server.command.front(), "tritonserver");
  EXPECT_EQ(c->listen.port, 7402);
  // A server per GPU by default, each on ports of its own.
  std::vector<gpu::DeviceInfo> eight(8);
  for (uint32_t i = 0; i < 8; ++i) eight[i].index = i;
  std::vector<ServerSlot> slots = *ServerSlots(*c, eight);
  ASSERT_EQ(slots.size(), 8u);
  EXPECT_EQ(slots[3].port, 8003);
  EXPECT_EQ(slots[3].grpc_port, 8103);
  EXPECT_EQ(slots[3].metrics_port, 8203);
  SupervisorOptions three = GpuServerOptions(*c, slots[3]);
  EXPECT_THAT(three.command, ::testing::Contains("--metrics-port=8203"));
  EXPECT_EQ(three.metrics_url, "http://127.0.0.1:8203/metrics");
  EXPECT_EQ(GpuServerAddress(*c, slots[3]), "10.0.0.11:8003");
  EXPECT_EQ(GpuServerGrpcAddress(*c, slots[3]), "10.0.0.11:8103");
}

// Ports that meet are refused before any server starts, naming the fields:
// on 8 GPUs, port_base 8000 and grpc_port_base 8004 would give GPU 4's HTTP
// server GPU 0's gRPC port (the second to bind crash-looping), while on one
// GPU they are two ports apart.
TEST(AgentConfigTest, PerGpuPortRangesThatMeetAreRefused) {
  AgentConfig c;
  c.listen.port = 7402;
  c.per_gpu.port_base = 8000;
  c.per_gpu.grpc_port_base = 8004;
  std::vector<gpu::DeviceInfo> one(1), eight(8);
  for (uint32_t i = 0; i < 8; ++i) eight[i].index = i;
  EXPECT_TRUE(ServerSlots(c, one).ok());
  absl::StatusOr<std::vector<ServerSlot>> s = ServerSlots(c, eight);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "server.per_gpu.port_base and grpc_port_base: this node's 8 servers need ports "
            "8000-8007 and 8004-8011, which meet; set the bases at least 8 apart");
  c.per_gpu.grpc_port_base = 8008;
  EXPECT_TRUE(ServerSlots(c, eight).ok());
  c.per_gpu.metrics_port_base = 7400;  // 7400-7407 holds the agent's 7402
  EXPECT_THAT(std::string(ServerSlots(c, eight).status().message()),
              HasSubstr("metrics_port_base: the ports of its 8 servers (7400-7407) hold the "
                        "agent's listen port 7402"));
  c.per_gpu.metrics_port_base = 0;
  c.per_gpu.port_base = 65530;
  c.per_gpu.grpc_port_base = 0;
  EXPECT_THAT(std::string(ServerSlots(c, eight).status().message()),
              HasSubstr("port_base: 8 servers need ports 65530-65537, past 65535"));
}

// A port named in the server's command or URLs needs its base: without it
// every server would be told port 0.
TEST(AgentConfigTest, APortTemplateWithoutItsBaseIsRefusedByName) {
  auto c = LoadAgentConfig(GPUHA_SOURCE_DIR "/examples/agent.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  AgentConfig no_metrics = *c;
  no_metrics.per_gpu.metrics_port_base = 0;
  EXPECT_THAT(std::string(ValidateAgentConfig(no_metrics).message()),
              HasSubstr("server.per_gpu.metrics_port_base: '--metrics-port={metrics_port}' names "
                        "{metrics_port}, which needs it"));
  AgentConfig no_grpc = *c;
  no_grpc.per_gpu.grpc_port_base = 0;
  EXPECT_THAT(std::string(ValidateAgentConfig(no_grpc).message()),
              HasSubstr("server.per_gpu.grpc_port_base"));
  AgentConfig none = *c;
  none.per_gpu = {};
  EXPECT_THAT(std::string(ValidateAgentConfig(none).message()),
              HasSubstr("server.per_gpu.port_base: '--http-port={port}'"));
  EXPECT_THAT(
      Err(ParseAgentConfig("server: { per_gpu: { metrics_port_base: 70000 } }\n", "a.yaml")),
      HasSubstr("server.per_gpu.metrics_port_base: must be between 1 and 65000"));
}

TEST(AgentConfigTest, RegistrationSectionAndLabels) {
  std::string token = (gpuha::testing::TestTempDir() / "join-token").string();
  std::ofstream(token) << "  join-me\n";
  auto c = ParseAgentConfig(
      "node: g1\ncontrollers: [\"127.0.0.1:7400\"]\ngpu: { backend: sim }\n"
      "register: { address: \"10.0.0.1:8000\", grpc_address: \"10.0.0.1:8001\", capacity: 12,\n"
      "  cpu_only: true,\n"
      "  labels: [\"gpuha.io/role=passive\", \"zone=a\"], join_token_file: " +
          token + " }\n",
      "agent.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(ReadJoinToken(*c).ok());
  EXPECT_EQ(c->registration.join_token, "join-me");
  EXPECT_EQ(c->registration.address, "10.0.0.1:8000");
  EXPECT_EQ(c->registration.grpc_address, "10.0.0.1:8001");
  EXPECT_EQ(c->registration.capacity, 12);
  EXPECT_TRUE(c->registration.cpu_only);
  EXPECT_EQ(c->registration.labels.at("gpuha.io/role"), "passive");
  EXPECT_EQ(c->registration.labels.at("zone"), "a");
  EXPECT_TRUE(ValidateAgentConfig(*c).ok());

  EXPECT_THAT(Err(ParseAgentConfig("register: { address: nowhere }\n", "a.yaml")),
              HasSubstr("register.address: 'nowhere' is not HOST:PORT"));
  EXPECT_THAT(Err(ParseAgentConfig("register: { grpc_address: nowhere }\n", "a.yaml")),
              HasSubstr("register.grpc_address: 'nowhere' is not HOST:PORT"));
  EXPECT_THAT(Err(ParseAgentConfig("register: { labels: [\"no-equals\"] }\n", "a.yaml")),
              HasSubstr("register.labels: label 'no-equals' is not KEY=VALUE"));
  std::map<std::string, std::string> labels;
  EXPECT_THAT(AddLabel("k=has space", &labels).message(), HasSubstr("label k: value"));
  EXPECT_TRUE(AddLabel("topology.kubernetes.io/zone=us-east-1a", &labels).ok());
  // Registration settings with no address are refused: routers could not
  // reach the node, and the agent would not register it.
  auto no_address = ParseAgentConfig(
      "node: g1\ncontrollers: [\"127.0.0.1:7400\"]\ngpu: { backend: sim }\n"
      "register: { labels: [\"gpuha.io/role=passive\"] }\n",
      "a.yaml");
  ASSERT_TRUE(no_address.ok());
  EXPECT_THAT(ValidateAgentConfig(*no_address).message(), HasSubstr("register.address"));
  c->registration.join_token_file = "/nonexistent/join-token";
  EXPECT_THAT(ReadJoinToken(*c).message(),
              HasSubstr("register.join_token_file: /nonexistent/join-token"));
}

TEST(AgentConfigTest, DriverWatchSourcesDefaultByBackend) {
  auto c = ParseAgentConfig("gpu: { backend: nvml, call_deadline_ms: 500 }", "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->call_deadline_ms, 500);
  EXPECT_EQ(KernelLogPath(*c), "/dev/kmsg");
  EXPECT_EQ(PciDevicesPath(*c), "/sys/bus/pci/devices");
  c = ParseAgentConfig("gpu: { backend: nvml, kernel_log: \"off\", pci_devices: /tmp/pci }",
                       "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(KernelLogPath(*c), "");
  EXPECT_EQ(PciDevicesPath(*c), "/tmp/pci");
  c = ParseAgentConfig("gpu: { backend: sim, kernel_log: /tmp/kern.log }", "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(KernelLogPath(*c), "/tmp/kern.log");
}

TEST(AgentConfigTest, BadItemsAreNamed) {
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { call_deadline_ms: 10 }", "a.yaml")),
              HasSubstr("gpu.call_deadline_ms: must be between 50 and 60000"));
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { kernel_log: \"\" }", "a.yaml")),
              HasSubstr("gpu.kernel_log: expected a string"));
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { sim: { model: GTX480 } }", "a.yaml")),
              HasSubstr("gpu.sim.model: unknown GPU model 'GTX480'"));
  EXPECT_THAT(Err(ParseAgentConfig("controllers: [nohost]", "a.yaml")),
              HasSubstr("controllers[0]: 'nohost' is not HOST:PORT"));
  EXPECT_THAT(Err(ParseAgentConfig("controllers: [\"h:99999\"]", "a.yaml")),
              HasSubstr("bad port '99999'"));
  EXPECT_THAT(Err(ParseAgentConfig("intervals: { heartbeat_ms: 1 }", "a.yaml")),
              HasSubstr("intervals.heartbeat_ms: must be between 5 and 10000"));
  EXPECT_THAT(Err(ParseAgentConfig("thresholds: { temperature_c: { warn: x } }", "a.yaml")),
              HasSubstr("thresholds.temperature_c.warn: expected a number"));
  EXPECT_THAT(Err(ParseAgentConfig("server: { probe_timeout_ms: 5 }", "a.yaml")),
              HasSubstr("server.probe_timeout_ms: must be between 10 and 60000"));
  EXPECT_THAT(Err(ParseAgentConfig("server: { ready_url: ftp://x }", "a.yaml")),
              HasSubstr("server.ready_url: 'ftp://x' is not an http:// URL"));
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { backend: cuda }", "a.yaml")),
              HasSubstr("gpu.backend: 'cuda' is not one of: nvml, sim"));
  EXPECT_THAT(Err(ParseAgentConfig("hearbeat_ms: 5", "a.yaml")), HasSubstr("unknown key"));
}

TEST(AgentConfigTest, FaultScriptResolvesBesideTheConfigAndUnknownXidIsNamed) {
  std::filesystem::path dir = gpuha::testing::TestTempDir();
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "faults.yaml") << "faults:\n  - { at_ms: 10, kind: xid, xid: 9999 }\n";
  std::ofstream(dir / "agent.yaml") << "gpu: { backend: sim, fault_script: faults.yaml }\n";
  auto c = LoadAgentConfig((dir / "agent.yaml").string());
  EXPECT_THAT(Err(c), HasSubstr("9999 is not a known XID"));
}

TEST(AgentConfigTest, ValidationNamesWhatIsMissing) {
  AgentConfig c;
  EXPECT_THAT(std::string(ValidateAgentConfig(c).message()), HasSubstr("node"));
  c.node = "bad node!";
  EXPECT_THAT(std::string(ValidateAgentConfig(c).message()), HasSubstr("must be 1-63 of"));
  c.node = "n1";
  EXPECT_THAT(std::string(ValidateAgentConfig(c).message()), HasSubstr("--controller"));
  c.controllers = {{"127.0.0.1", 1}};
  EXPECT_THAT(std::string(ValidateAgentConfig(c).message()), HasSubstr("--gpu"));
  c.gpu_backend = "sim";
  c.tls_ca = "/nonexistent/ca.pem";
  EXPECT_THAT(std::string(ValidateAgentConfig(c).message()),
              HasSubstr("tls.ca: /nonexistent/ca.pem: cannot open"));
}

TEST(HostPortTest, ParsesIpv4Ipv6AndRejectsJunk) {
  EXPECT_EQ(ParseHostPort("[::1]:80", "x")->host, "::1");
  EXPECT_EQ(ParseHostPort("[::1]:80", "x")->str(), "[::1]:80");
  EXPECT_FALSE(ParseHostPort(":80", "x").ok());
  EXPECT_FALSE(ParseHostPort("[::1]80", "x").ok());
  EXPECT_FALSE(ParseHostPort("h:port", "x").ok());
}

// Issue 16: servers per GPU, remediation steps and the sim's MIG layout.
TEST(AgentConfigTest, PerGpuServersRemediationAndMig) {
  auto c = ParseAgentConfig(R"(
node: a
controllers: ["127.0.0.1:7400"]
gpu: { backend: sim, sim: { count: 4, mig: 7 } }
server: { command: [gpuha, worker, --listen, "127.0.0.1:{port}"],
          ready_url: "http://127.0.0.1:{port}/v2/health/ready",
          per_gpu: { port_base: 8100, capacity: 3 } }
remediation: { gpu_reset: [nvidia-smi, --gpu-reset, -i, "{gpu}"], reboot: [systemctl, reboot],
               timeout_ms: 30000, window_ms: 600000 }
)",
                            "a.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sim.mig, 7u);
  EXPECT_EQ(c->per_gpu.port_base, 8100);
  EXPECT_EQ(c->remediation.reboot, (std::vector<std::string>{"systemctl", "reboot"}));
  // GPUs 0 and 2 whole, GPU 1 in three MIG instances (slots 0, 2, 5): a
  // server each, ports in order.
  std::vector<gpu::DeviceInfo> devices(3);
  for (uint32_t i = 0; i < 3; ++i) devices[i].index = i;
  for (uint32_t slot : {0u, 2u, 5u}) {
    devices[1].slices.push_back(
        {slot, absl::StrCat("MIG-uuid-", slot), "NVIDIA A100-SXM4-80GB MIG 2g.20gb", 20ull << 30});
  }
  std::vector<ServerSlot> slots = *ServerSlots(*c, devices);
  ASSERT_EQ(slots.size(), 5u);
  EXPECT_EQ(slots[0].port, 8100);
  EXPECT_EQ(slots[0].capacity, 3);
  EXPECT_FALSE(slots[0].slice.has_value());
  EXPECT_EQ(slots[2].gpu, 1u);
  EXPECT_EQ(slots[2].slice, 2u);
  EXPECT_EQ(slots[2].visible, "MIG-uuid-2");
  EXPECT_EQ(slots[2].profile, "2g.20gb");
  EXPECT_EQ(slots[2].port, 8102);
  EXPECT_EQ(slots[2].capacity, 1);  // 3 split in 3
  EXPECT_EQ(slots[4].gpu, 2u);
  EXPECT_EQ(slots[4].port, 8104);
  SupervisorOptions gpu2 = GpuServerOptions(*c, slots[4]);
  EXPECT_EQ(gpu2.command,
            (std::vector<std::string>{"env", "CUDA_VISIBLE_DEVICES=2", "NVIDIA_VISIBLE_DEVICES=2",
                                      "gpuha", "worker", "--listen", "127.0.0.1:8104"}));
  EXPECT_EQ(gpu2.ready_url, "http://127.0.0.1:8104/v2/health/ready");
  EXPECT_EQ(GpuServerAddress(*c, slots[4]), "127.0.0.1:8104");
  EXPECT_EQ(GpuServerOptions(*c, slots[2]).command[1], "CUDA_VISIBLE_DEVICES=MIG-uuid-2");
  EXPECT_EQ(FillGpuServer("{gpu}/{slice}/{port}", slots[2]), "1/2/8102");
  EXPECT_EQ(FillGpuServer("{gpu}/{slice}/{port}", slots[0]), "0//8100");
  EXPECT_EQ(GpuServerGrpcAddress(*c, slots[4]), "");  // no grpc_port_base: no gRPC
  AgentConfig grpc = *c;
  grpc.per_gpu.grpc_port_base = 9100;
  grpc.registration.address = "10.0.0.5:8000";
  std::vector<ServerSlot> with_grpc = *ServerSlots(grpc, devices);
  EXPECT_EQ(with_grpc[4].grpc_port, 9104);  // the same place as its HTTP port
  EXPECT_EQ(GpuServerGrpcAddress(grpc, with_grpc[4]), "10.0.0.5:9104");
  EXPECT_EQ(FillGpuServer("--grpc-listen 127.0.0.1:{grpc_port}", with_grpc[2]),
            "--grpc-listen 127.0.0.1:9102");
  AgentConfig sliced = *c;
  sliced.per_gpu.slice_capacity = 2;
  EXPECT_EQ((*ServerSlots(sliced, devices))[1].capacity, 2);
  sliced.per_gpu.port_base = 0;
  EXPECT_TRUE(ServerSlots(sliced, devices)->empty());
  // An instance without a UUID cannot be named to CUDA: no server for it.
  devices[1].slices[1].uuid.clear();
  slots = *ServerSlots(*c, devices);
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[2].slice, 5u);
  EXPECT_EQ(slots[2].port, 8102);
  EXPECT_THAT(Err(ParseAgentConfig("gpu: { sim: { mig: 9 } }\n", "a.yaml")),
              HasSubstr("gpu.sim.mig: must be between 0 (off) and 7"));
  EXPECT_THAT(
      Err(ParseAgentConfig("remediation: { gpu_reset: [x], rebind_driver: nvidia }\n", "a.yaml")),
      HasSubstr("remediation.rebind_driver: is the reset step of a passthrough host"));
  EXPECT_THAT(Err(ParseAgentConfig("server: { per_gpu: { port_base: 0 } }\n", "a.yaml")),
              HasSubstr("server.per_gpu.port_base"));
  EXPECT_THAT(Err(ParseAgentConfig("server: { per_gpu: { slice_capacity: 0 } }\n", "a.yaml")),
              HasSubstr("server.per_gpu.slice_capacity: must be between 1 and 1000000"));
  AgentConfig bare = *c;
  bare.server.command.clear();
  bare.server.ready_url.clear();
  EXPECT_THAT(std::string(ValidateAgentConfig(bare).message()),
              HasSubstr("server.per_gpu: a server per GPU needs server.command"));
}

}  // namespace
}  // namespace gpuha::agent
