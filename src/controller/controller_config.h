// ControllerConfig: the cluster the controller runs, from one YAML file.
//
//   cluster: { redundancy: 1 }
//   registration: { enabled: true, join_token_sha256: "86d1...", role_label: gpuha.io/role,
//                   default_role: active, max_nodes: 10000 }
//   nodes:                        # optional with registration enabled
//     - { name: gpu-1, role: active, capacity: 10, address: "127.0.0.1:8001" }
//     - { name: gpu-4, role: passive, capacity: 10, address: "127.0.0.1:8004" }
//     - { name: cpu-1, role: buffer, capacity: 4, cpu_only: true, address: "127.0.0.1:8005" }
//   tenants: [acme, globex]
//   listen: { grpc: "127.0.0.1:7400", http: "127.0.0.1:7401", heartbeat_datagrams: true }
//   store: { sqlite: /var/lib/gpuha/controller.db }   # or { path: ... }, the older spelling
//   store: { etcd: ["http://10.0.0.1:2379", ...], prefix: /gpuha/, lease_ttl_ms: 2000,
//            tls: { ca: etcd-ca.pem, cert: c.pem, key: c.key }, advertise: "10.0.0.5:7401" }
//   tls: { ca: ca.pem, cert: controller.pem, key: controller.key }
//   tokens:                       # SHA-256 of each bearer token: gpuha ctl hash-token
//     - { name: ops, role: operator, sha256: "5e88..." }
//   fence: { hook: "kubectl cordon {node}", timeout_ms: 5000 }
//   detector: { floor_ms: 150, ceiling_ms: 3000, k: 4, broken_grace_ms: 30 }
//   recovery: { healthy_for_ms: 1000, max_failures: 3, window_s: 600 }
//
// Duplicate nodes and an impossible k (not below the node count) are refused.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "api/units.h"
#include "common/net_util.h"
#include "common/ports.h"
#include "common/reconnect.h"
#include "controller/failure_detector.h"
#include "placement/placement.h"

namespace gpuha::controller {

// The placement's vocabulary (src/placement/), the controller's throughout.
using placement::Assignment;
using placement::CapacityFigures;
using placement::FailoverPlan;
using placement::NodeSpec;
using placement::ParseRole;
using placement::Placement;
using placement::Role;
using placement::RoleName;
using placement::StreamSpec;

enum class ApiRole { kViewer = 0, kOperator = 1, kAdmin = 2 };
const char* ApiRoleName(ApiRole r);

// A GPU server's name within its node: "gpu0", or "gpu0/mig2" for a slice.
std::string GpuServerName(uint32_t index, std::optional<uint32_t> slice);

// One GPU's own inference server on a node that runs one per GPU, or one
// slice's (a MIG instance, a vGPU profile) on a GPU that is split.
struct GpuServerConfig {
  uint32_t index = 0;
  std::string address{};  // HOST:PORT
  int64_t capacity = 0;
  std::optional<uint32_t> slice{};  // the slice's slot on GPU `index`
  std::string profile{};            // the slice's profile ("1g.10gb", "L4-4Q"), for operators
  std::string grpc_address{};       // HOST:PORT of its KServe v2 gRPC port; empty: none
  std::string Name() const { return GpuServerName(index, slice); }
};

struct NodeConfig {
  NodeSpec spec;        // spec.domain: its failure domain (rack, zone), if any
  std::string address;  // HOST:PORT of the node's inference server, for routers
  // With servers per GPU, each GPU is a placement unit (GpuUnitId) with its
  // own address and capacity, on host spec.id; spec.capacity is their sum.
  std::vector<GpuServerConfig> gpu_servers{};
  std::string grpc_address{};  // HOST:PORT of its KServe v2 gRPC port; empty: none
};

// The placement unit of one GPU's (or slice's) server: "NODE/gpuINDEX" or
// "NODE/gpuINDEX/migSLOT" ('/' is not in a node's name).
std::string GpuUnitId(const std::string& node, const GpuServerConfig& g);
using api::NodeOfUnit;  // the node a unit is on: "n1" for "n1/gpu0/mig1"
// The GPU server entry of `n` that `unit` is, null for a whole node's unit
// (or a unit the node does not have).
const GpuServerConfig* GpuServerOfUnit(const NodeConfig& n, const std::string& unit);
// The placement units of a node: its GPUs' with servers per GPU, else itself.
std::vector<NodeSpec> UnitSpecs(const NodeConfig& n);
// The address routers reach `unit` on ("" when the node has no such GPU).
std::string UnitAddress(const NodeConfig& n, const std::string& unit);
// The same for its gRPC port ("" when it has none).
std::string UnitGrpcAddress(const NodeConfig& n, const std::string& unit);
// Checks a node's servers per GPU: distinct GPUs and slices (a GPU listed
// whole or by slices, not both), HOST:PORT addresses, capacities in
// 1..1000000, profiles of [A-Za-z0-9._+-]; the error names the entry.
[[nodiscard]] absl::Status CheckGpuServers(const std::vector<GpuServerConfig>& servers);

struct ApiToken {
  std::string name;
  ApiRole role;
};

// Nodes that agents add themselves (their hello's registration), so that the
// config holds policy rather than an inventory. Listed nodes keep working.
struct RegistrationPolicy {
  bool enabled = false;
  std::string join_token_sha256;  // lower-case hex; empty: no token asked (loopback or mTLS)
  std::string role_label = "gpuha.io/role";  // a label whose value names the role
  // Labels whose value names the node's failure domain, the first present
  // wins (e.g. [rack, zone]). Empty (the default): registered nodes have
  // none, so labels that mean something else change no N+k arithmetic.
  std::vector<std::string> domain_labels;
  Role default_role = Role::kActive;
  int64_t max_nodes = 10'000;
};

struct ControllerConfig {
  int64_t redundancy = 1;
  std::vector<NodeConfig> nodes;
  RegistrationPolicy registration;
  std::vector<std::string> tenants;
  std::string grpc_listen = absl::StrCat("127.0.0.1:", common::kControllerGrpcPort);
  std::string http_listen = absl::StrCat("127.0.0.1:", common::kControllerHttpPort);
  // listen.heartbeat_datagrams: agents may send the heartbeats that say
  // nothing new as UDP datagrams to the gRPC address's port (BFD's way).
  bool heartbeat_datagrams = true;
  std::string store_path;  // SQLite; empty (and no etcd): in memory (tests, throwaway runs)
  // etcd: the controllers that share these endpoints elect one leader, which
  // alone acts (controller/etcd.h).
  struct Etcd {
    std::vector<std::string> endpoints;  // empty: not on etcd
    std::string prefix = "/gpuha/";
    std::string tls_ca, tls_cert, tls_key;
    common::Duration lease_ttl = std::chrono::seconds(2);
    int64_t max_txn_ops = 128;  // etcd's --max-txn-ops: larger batches are split
    // What this controller says it is when it leads: its HTTP API's address
    // as others reach it. Empty: listen.http.
    std::string advertise;
  } etcd;
  // gRPC over TLS when cert and key are set; with ca, agents and routers must
  // present a certificate it signed (mTLS).
  std::string tls_ca, tls_cert, tls_key;
  std::map<std::string, ApiToken> tokens;  // by lower-case hex SHA-256
  std::string fence_hook;
  common::Duration fence_timeout = std::chrono::seconds(5);
  // The quarantine circuit breaker: an agent's health verdict (failed or
  // draining: XIDs, thermal, ECC) takes its node out only while the nodes
  // out after failures stay within this share of the cluster (NVSentinel's
  // default, 50%). A flood of false alarms must not take the fleet down; an
  // operator can still `ctl drain` a node. 1: no breaker. Lost agents and
  // nodes whose server stopped answering are not held: a dead node is dead.
  double quarantine_max_share = 0.5;
  DetectorOptions detector;
  common::Duration healthy_for = std::chrono::seconds(1);
  // An agent that says goodbye (SIGTERM) while its server serves on has this
  // long to come back before its node fails over; 0: no grace.
  common::Duration restart_grace = std::chrono::seconds(30);
  int max_failures = 3;
  common::Duration failure_window = std::chrono::minutes(10);
  // After a (re)start, no failover until every agent has had the chance to
  // reconnect: the agents' longest reconnect wait plus half a second. A file
  // may set more, never less (a 500 ms grace once fenced healthy nodes whose
  // agents were still backing off after a controller outage).
  common::Duration startup_grace =
      common::ReconnectPolicy::LongestWait() + std::chrono::milliseconds(500);
};

// Safe by default: an API without tokens, or node registration without a
// join token or mTLS, only on loopback. The field at fault and why.
struct ExposureProblem {
  std::string field;  // "listen.http" or "registration.join_token_sha256"
  std::string message;
};
std::optional<ExposureProblem> CheckExposure(const ControllerConfig& c);

[[nodiscard]] absl::StatusOr<ControllerConfig> ParseControllerConfig(absl::string_view yaml,
                                                                     const std::string& source);
[[nodiscard]] absl::StatusOr<ControllerConfig> LoadControllerConfig(const std::string& path);

using common::Sha256Hex;  // tokens are stored as its lower-case hex

}  // namespace gpuha::controller
