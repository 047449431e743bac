// AgentConfig: everything `gpuha agent` needs, from a YAML file and/or flags.
//
//   node: gpu-1
//   controllers: ["10.0.0.1:7400", "10.0.0.2:7400"]
//   gpu: { backend: sim, nvml_lib: libnvidia-ml.so.1,
//          sim: { model: L4, count: 1, load: 0.5, seed: 1 }, fault_script: faults.yaml,
//          call_deadline_ms: 2000, kernel_log: /dev/kmsg, pci_devices: /sys/bus/pci/devices }
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
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/job_supervisor.h"
#include "agent/remediation.h"
#include "agent/supervisor.h"
#include "common/net_util.h"
#include "common/ports.h"
#include "gpu/fault_script.h"
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
  // The kernel log read for XIDs, and the sysfs PCI tree compared with the
  // GPUs the driver lists. "" takes the backend's default (nvml: /dev/kmsg
  // and /sys/bus/pci/devices; sim: neither); "off" turns one off.
  std::string kernel_log;
  std::string pci_devices;
  int sample_ms = 500;
  int heartbeat_ms = 50;
  std::vector<std::string> nics;
  std::string sysfs_net = "/sys/class/net";
  gpu::HealthThresholds thresholds;
  SupervisorOptions server;
  // One inference server per GPU (issue 16): GPU i runs `server` with
  // {gpu} and {port} (port_base + i) filled in its command and URLs, and
  // CUDA_VISIBLE_DEVICES=i. Each is supervised and probed alone, and is its
  // own placement unit at the controller: one GPU's fault moves its streams
  // only. port_base 0: one server for the node.
  struct PerGpu {
    int port_base = 0;
    int64_t capacity = 0;  // stream units per GPU when registering; 0: register.capacity
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
    std::string address;    // HOST:PORT of the inference server, for routers
    int64_t capacity = 10;  // stream units
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

// `text` with {gpu} and {port} (per_gpu.port_base + gpu) filled.
std::string FillGpuServer(const AgentConfig& c, const std::string& text, uint32_t gpu);
// GPU `gpu`'s server options under per_gpu: {gpu} and {port} filled in the
// command and URLs, the command run under `env CUDA_VISIBLE_DEVICES=gpu`.
SupervisorOptions GpuServerOptions(const AgentConfig& c, uint32_t gpu);
// The address routers reach GPU `gpu`'s server at: the registration's host
// (127.0.0.1 without one) and port_base + gpu.
std::string GpuServerAddress(const AgentConfig& c, uint32_t gpu);

// The pod-resources socket in force for `c` ("" when off or, for "auto", when
// this is not a Kubernetes node).
std::string PodResourcesSocket(const AgentConfig& c);

// The kernel log and PCI tree in force for `c` ("" when off).
std::string KernelLogPath(const AgentConfig& c);
std::string PciDevicesPath(const AgentConfig& c);

}  // namespace gpuha::agent
