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
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "controller/node_lifecycle.h"
#include "controller/placement.h"

namespace gpuha::controller {

struct NodeRecord {
  Role role = Role::kActive;
  bool available = true;  // placement counts it (false while it is out)
  NodeLifecycle lifecycle = NodeLifecycle::kServing;
};
std::string EncodeNode(const NodeRecord& r);
absl::StatusOr<NodeRecord> DecodeNode(const std::string& id, std::string_view text);

struct StreamRecord {
  std::string tenant;
  int64_t weight = 1;
  std::string primary;  // empty while it fits nowhere
  std::string standby;
};
std::string EncodeStream(const StreamRecord& r);
absl::StatusOr<StreamRecord> DecodeStream(const std::string& id, std::string_view text);

}  // namespace gpuha::controller
