// AgentConfig: everything `gpuha agent` needs, from a YAML file and/or flags.
//
//   node: gpu-1
//   controllers: ["10.0.0.1:7400", "10.0.0.2:7400"]
//   gpu: { backend: sim, nvml_lib: libnvidia-ml.so.1,
//          sim: { model: L4, count: 1, load: 0.5, seed: 1 }, fault_script: faults.yaml,
//          call_deadline_ms: 2000, slow_sample_ms: 30000, kernel_log: /dev/kmsg,
//          pci_devices: /sys/bus/pci/devices }
//   intervals: { sample_ms: 500, heartbeat_ms: 50 }
//   nics: [eth0]
//   thresholds: { temperature_c: { warn: 83, critical: 90 } }
//   server: { command: [gpuha, worker, --port, "8001"],
//             ready_url: "http://127.0.0.1:8001/v2/health/ready", fence_mode: stop,
//             probe_interval_ms: 500, probe_timeout_ms: 300 }
//   listen: 127.0.0.1:7402
//   tls: { ca: ca.pem, cert: agent.pem, key: agent.key }
//   register: { address: "10.0.0.5:8000", capacity: 10, cpu_only: false,
//               labels: ["gpuha.io/role=passive"], join_token_file: /etc/gpuha/join-token }
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/job_supervisor.h"
#include "agent/remediation.h"
#include "agent/supervisor.h"
#include "common/net_util.h"
#include "common/ports.h"
#include "gpu/fault_script.h"
#include "gpu/gpu_probe.h"
#include "gpu/health.h"
#include "gpu/sim_probe.h"

namespace gpuha::agent {

using common::HostPort;
using common::ParseHostPort;

struct AgentConfig {
  std::string node;
  std::vector<HostPort> controllers;
  std::string gpu_backend;  // "nvml" | "sim"
  std::string nvml_lib = "libnvidia-ml.so.1";
  gpu::SimOptions sim;
  // A GPU probe call that has not returned by then fails its GPU (watchdog.h).
  int call_deadline_ms = 2000;
  // NVML's costly readings (energy, PCIe replays, the vGPU license; PCIe
  // throughput where the driver has no byte counters) are read this often,
  // not every sample (nvml_probe.h). 0: every sample.
  int slow_sample_ms = 30000;  // dcgm-exporter collects every 30 s
  // The kernel log read for XIDs, and the sysfs PCI tree compared with the
  // GPUs the driver lists. "" takes the backend's default (nvml: /dev/kmsg
  // and /sys/bus/pci/devices; sim: neither); "off" turns one off.
  std::string kernel_log;
  std::string pci_devices;
  int sample_ms = 500;
  int heartbeat_ms = 50;
  std::vector<std::string> nics;
  std::string sysfs_net = "/sys/class/net";
  // Loaded kernel modules: XID 159's action depends on nvidia_uvm.
  std::string sysfs_module = "/sys/module";
  gpu::HealthThresholds thresholds;
  SupervisorOptions server;
  // One inference server per GPU (issue 16): GPU i runs `server` with
  // {gpu} and {port} (port_base + i) filled in its command and URLs, and
  // CUDA_VISIBLE_DEVICES=i. Each is supervised and probed alone, and is its
  // own placement unit at the controller: one GPU's fault moves its streams
  // only. port_base 0: one server for the node.
  // A GPU with MIG on runs a server per MIG instance instead, each with
  // CUDA_VISIBLE_DEVICES=<its MIG UUID> and {slice} filled: its own unit.
  // Ports go in order over the servers: GPU 0's (or its slices'), then GPU 1's.
  struct PerGpu {
    int port_base = 0;
    // A gRPC port per server too (as Triton's 8001 beside 8000), in the same
    // order; 0: the servers serve no gRPC.
    int grpc_port_base = 0;
    // A metrics port per server (as Triton's 8002), {metrics_port} in the
    // same order, so that each server's progress is read apart; 0: none.
    int metrics_port_base = 0;
    int64_t capacity = 0;  // stream units per GPU when registering; 0: register.capacity
    // Per MIG instance; 0: the GPU's capacity split evenly (at least 1).
    int64_t slice_capacity = 0;
  } per_gpu;
  // Steps for a failed GPU: reset (or PCI rebind), reboot hook, held.
  RemediationOptions remediation;
  // Stateful jobs the controller places here (JobSupervisor). An empty
  // progress_dir takes /tmp/gpuha-jobs-NODE.
  JobOptions jobs;
  HostPort listen{"127.0.0.1", common::kAgentPort};
  // /metrics carries the GPU series in dcgm-exporter's names (DCGM_FI_*).
  // Off where dcgm-exporter already runs on the node, so that no series
  // arrives from two jobs; gpuha's own series stay.
  bool dcgm_names = true;
  // The kubelet's pod-resources socket, for the pod, namespace and container
  // labels on the GPU series: "auto" reads the kubelet's own socket where it
  // exists (a Kubernetes node), "off" never, a path that socket.
  std::string pod_resources = "auto";
  common::Duration pod_resources_interval = std::chrono::seconds(10);
  std::string tls_ca, tls_cert, tls_key;
  // What the hello says about this node, for a controller that registers
  // nodes instead of listing them. No address: not registering.
  struct Registration {
    std::string address;       // HOST:PORT of the inference server, for routers
    std::string grpc_address;  // HOST:PORT of its KServe v2 gRPC port; empty: none
    int64_t capacity = 10;     // stream units
    bool cpu_only = false;
    std::map<std::string, std::string> labels;
    std::string join_token_file;  // read at start (ReadJoinToken)
    std::string join_token;
  } registration;
};

// Reads registration.join_token from registration.join_token_file (none:
// OK); the error names the field and the file.
[[nodiscard]] absl::Status ReadJoinToken(AgentConfig& c);

// "KEY=VALUE" (a --label flag) into `labels`; InvalidArgument naming it.
[[nodiscard]] absl::Status AddLabel(const std::string& flag_value,
                                    std::map<std::string, std::string>* labels);

// Reads a config file; fault_script paths resolve against the file's folder.
[[nodiscard]] absl::StatusOr<AgentConfig> LoadAgentConfig(const std::string& path);
[[nodiscard]] absl::StatusOr<AgentConfig> ParseAgentConfig(absl::string_view yaml,
                                                           const std::string& source);
// Checks what flags and file together must give: a node name, at least one
// controller, a backend.
[[nodiscard]] absl::Status ValidateAgentConfig(const AgentConfig& c);

// One server under per_gpu: a whole GPU's, or one MIG instance's.
struct ServerSlot {
  uint32_t gpu = 0;
  std::optional<uint32_t> slice{};  // the MIG instance's slot
  std::string visible{};            // CUDA_VISIBLE_DEVICES: the GPU's index or the MIG UUID
  std::string profile{};            // a MIG instance's profile ("1g.10gb"), from its name
  int port = 0;                     // per_gpu.port_base + its place among the servers
  int grpc_port = 0;                // per_gpu.grpc_port_base + the same place; 0: no gRPC
  int64_t capacity = 0;             // stream units it registers with
  int metrics_port = 0;             // per_gpu.metrics_port_base + the same place; 0: none
};
// The servers per_gpu runs on `devices`, in port order (none without per_gpu).
// InvalidArgument, naming the fields, when their ports would collide: one
// base's range (a port per server) reaching into another's or the agent's
// own listen port, or past 65535. Only the device count tells the ranges:
// port_base 8000 and grpc_port_base 8001 are two ports on a one-GPU node,
// and on an 8-GPU node give GPU 1's HTTP server GPU 0's gRPC port.
[[nodiscard]] absl::StatusOr<std::vector<ServerSlot>> ServerSlots(
    const AgentConfig& c, const std::vector<gpu::DeviceInfo>& devices);
// `text` with {gpu}, {slice} ("" for a whole GPU), {port}, {grpc_port} and
// {metrics_port} filled.
std::string FillGpuServer(const std::string& text, const ServerSlot& slot);
// A slot's server options: `server` filled (FillGpuServer), its command run
// under `env CUDA_VISIBLE_DEVICES=<visible>`.
SupervisorOptions GpuServerOptions(const AgentConfig& c, const ServerSlot& slot);
// The address routers reach a slot's server at: the registration's host
// (127.0.0.1 without one) and the slot's port.
std::string GpuServerAddress(const AgentConfig& c, const ServerSlot& slot);
// The same for its gRPC port; empty without per_gpu.grpc_port_base.
std::string GpuServerGrpcAddress(const AgentConfig& c, const ServerSlot& slot);

// The pod-resources socket in force for `c` ("" when off or, for "auto", when
// this is not a Kubernetes node).
std::string PodResourcesSocket(const AgentConfig& c);

// The kernel log and PCI tree in force for `c` ("" when off).
std::string KernelLogPath(const AgentConfig& c);
std::string PciDevicesPath(const AgentConfig& c);

}  // namespace gpuha::agent
