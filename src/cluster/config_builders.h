// Typed builders for the YAML files of a local cluster. The demo, the
// end-to-end tests and the benchmarks write their controller, agent and
// router configs through these instead of concatenating strings, so a
// renamed field breaks one place and a name with a quote in it stays one
// scalar. Only what a local cluster sets is here; an unset optional leaves
// the component's default. config_builders_test.cc parses every Yaml() back
// with the component's own parser.
//
//   ControllerYaml c;
//   c.nodes = {{.name = "n1", .capacity = 4, .address = "127.0.0.1:9001"}};
//   c.tenants = {"acme"};
//   WriteFileAtomic(dir + "/controller.yaml", c.Yaml());
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuha::cluster {

// A YAML double-quoted scalar for any text (JSON's escaping, which YAML
// reads the same way).
std::string Quote(const std::string& text);

struct NodeEntry {
  std::string name{};
  std::string role = "active";  // active | passive | buffer
  int64_t capacity = 10;
  std::string address{};       // HOST:PORT of its inference server; empty: none
  std::string grpc_address{};  // HOST:PORT of its KServe v2 gRPC port; empty: none
  // A server per GPU or per slice (MIG instance); the node's capacity then
  // is not written (it is their sum).
  struct GpuServer {
    int index = 0;
    std::optional<int> slice{};
    std::string address{};
    std::string grpc_address{};  // empty: none
    int64_t capacity = 1;
  };
  std::vector<GpuServer> gpu_servers{};
};

struct ControllerYaml {
  std::string comment{};  // a first line starting "# "
  int64_t redundancy = 1;
  std::vector<NodeEntry> nodes{};
  std::vector<std::string> tenants{};
  std::string grpc_listen{}, http_listen{};  // empty: the defaults (or flags)
  std::string store_path{};                  // empty: none (or --store)
  std::vector<std::string> etcd{};           // etcd endpoints (instead of store_path)
  std::optional<int64_t> healthy_for_ms{}, max_failures{}, window_s{};
  std::optional<int64_t> startup_grace_ms{};
  std::string fence_hook{};  // empty: none
  std::optional<int64_t> fence_timeout_ms{};
  std::string Yaml() const;
};

struct AgentYaml {
  std::string node{};
  std::vector<std::string> controllers{};  // HOST:PORT each
  std::string gpu_backend = "sim";
  std::string sim_model = "L4";
  int sim_count = 1;
  int sim_mig = 0;  // MIG instances per GPU (0: off)
  double sim_load = 0.6;
  std::optional<int64_t> sample_ms{}, heartbeat_ms{};
  std::optional<int64_t> call_deadline_ms{};  // the GPU probe watchdog
  std::string pci_devices{};                  // a (fake) sysfs PCI tree to compare
  std::string listen{};                       // empty: the default
  // The supervised inference server; empty command: none, or one started
  // elsewhere that the agent watches through ready_url.
  std::vector<std::string> server_command{};
  std::string ready_url{};
  std::string metrics_url{};  // the engine's metrics, for the stall watch
  std::optional<int64_t> stall_after_ms{};
  std::string fence_mode{};  // empty: the default (stop)
  std::optional<int64_t> probe_interval_ms{}, probe_timeout_ms{};
  // A server per GPU (or MIG instance), in order from this port ({port} in
  // the command and URLs).
  std::optional<int64_t> per_gpu_port_base{}, per_gpu_capacity{};
  std::optional<int64_t> per_gpu_grpc_port_base{};  // their gRPC ports ({grpc_port})
  std::string job_progress_dir{};                   // empty: the default
  std::optional<int64_t> job_stop_grace_ms{};
  std::string Yaml() const;
};

struct TenantEntry {
  std::string name{};
  std::vector<std::string> api_keys{};  // clear text; written as their SHA-256
  std::optional<double> requests_per_second{}, burst{};
  std::optional<int64_t> max_concurrent{};
};

struct RouteEntry {
  std::string stream{}, tenant{}, primary{}, standby{};  // standby may be empty
  std::string primary_grpc{}, standby_grpc{};            // their gRPC ports; may be empty
};

struct RouterYaml {
  std::string listen{}, admin{};  // empty: the defaults (or flags)
  std::optional<int64_t> threads{};
  std::string id{};
  std::vector<std::string> controllers{};
  std::vector<TenantEntry> tenants{};
  bool auth_none = false;  // no tenants, on purpose: `auth: none`
  std::vector<RouteEntry> routes{};
  std::optional<int64_t> probe_interval_ms{}, hang_after_ms{};
  std::string Yaml() const;
};

}  // namespace gpuha::cluster
