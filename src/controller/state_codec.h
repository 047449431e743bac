// State codec: the controller's durable records as store rows and back.
// A node row holds its role, whether placement counts it, and its lifecycle;
// a stream row its tenant, weight, primary and standby. Rows are JSON, so an
// operator can read them with sqlite3 or etcdctl.
//
//   batch.push_back({"node", id, EncodeNode({role, available, lifecycle})});
//   absl::StatusOr<NodeRecord> r = DecodeNode(id, text);
//
// Decoding also reads rows written before the lifecycle enum existed (the
// booleans fenced, drained and held_out). Errors name the row and field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/controller_config.h"
#include "controller/node_lifecycle.h"
#include "placement/placement.h"

namespace gpuha::controller {

// A node that its agent registered (no config entry): what a restarted
// controller needs to know it again.
struct RegisteredNode {
  std::string address;  // HOST:PORT of its inference server
  int64_t capacity = 0;
  bool cpu_only = false;
  std::string domain{};                        // its failure domain, from a label
  std::vector<GpuServerConfig> gpu_servers{};  // servers per GPU (issue 16)
  std::string grpc_address{};                  // its gRPC port (issue 18); empty: none
  // The IP its agent registered from: the node is bound to it. An agent
  // elsewhere cannot take it over with the join token alone (an admin's
  // rebind frees it). Empty: a row from before, bound at its next hello.
  std::string agent_ip{};
};

// An XID its agent reported: the dashboard's and the API's recent XIDs,
// kept in the node's row so that they outlive a controller restart.
struct RecentXid {
  uint32_t gpu = 0;
  uint32_t xid = 0;
  double unix_ms = 0;  // the agent's clock
  bool operator==(const RecentXid&) const = default;
};

struct NodeRecord {
  Role role = Role::kActive;
  bool available = true;  // placement counts it (false while it is out)
  NodeLifecycle lifecycle = NodeLifecycle::kServing;
  std::optional<RegisteredNode> registered{};  // absent for a node the config lists
  // A planned agent restart's grace ends then (Unix ms; 0: none), so that a
  // new leader keeps it.
  int64_t restart_until_unix_ms = 0;
  std::vector<RecentXid> xids{};  // the newest last
};
std::string EncodeNode(const NodeRecord& r);
[[nodiscard]] absl::StatusOr<NodeRecord> DecodeNode(const std::string& id, std::string_view text);

struct StreamRecord {
  std::string tenant;
  int64_t weight = 1;
  std::string primary;  // empty while it fits nowhere
  std::string standby;
};
std::string EncodeStream(const StreamRecord& r);
[[nodiscard]] absl::StatusOr<StreamRecord> DecodeStream(const std::string& id,
                                                        std::string_view text);

}  // namespace gpuha::controller
