#include "controller/state_codec.h"

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/net_util.h"

namespace gpuha::controller {

using nlohmann::json;

namespace {

// Reads `key` of `j` into `out` when present; a wrong type names the field.
template <class T>
absl::Status Field(const json& j, const char* key, const std::string& row, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  try {
    *out = it->get<T>();
  } catch (const json::exception&) {
    return absl::DataLossError(absl::StrCat("store: ", row, ".", key, ": wrong type"));
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseRow(const std::string& row, std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat("store: ", row, " is corrupt"));
  return j;
}

}  // namespace

std::string EncodeNode(const NodeRecord& r) {
  // The booleans are what binaries before the lifecycle enum read: written
  // for one more release, so a rollback keeps drained and held-out nodes out.
  // A rejoining node is written as fenced for the same release (the binary
  // before it refuses a state it does not know): read back, it is fenced
  // and rejoins after healthy_for again.
  json j{
      {"role", RoleName(r.role)},
      {"available", r.available},
      {"state", NodeLifecycleName(r.lifecycle == NodeLifecycle::kRejoining ? NodeLifecycle::kFenced
                                                                           : r.lifecycle)},
      {"fenced", r.lifecycle != NodeLifecycle::kServing},
      {"drained", r.lifecycle == NodeLifecycle::kDrained},
      {"held_out", r.lifecycle == NodeLifecycle::kHeldOut}};
  if (r.restart_until_unix_ms > 0) j["restart_until_unix_ms"] = r.restart_until_unix_ms;
  for (const RecentXid& x : r.xids) j["xids"].push_back({x.gpu, x.xid, x.unix_ms});
  if (r.registered) {
    j["registered"] = {{"address", r.registered->address},
                       {"capacity", r.registered->capacity},
                       {"cpu_only", r.registered->cpu_only}};
    if (!r.registered->domain.empty()) j["registered"]["domain"] = r.registered->domain;
    if (!r.registered->agent_ip.empty()) j["registered"]["agent_ip"] = r.registered->agent_ip;
    if (!r.registered->grpc_address.empty()) {
      j["registered"]["grpc_address"] = r.registered->grpc_address;
    }
    for (const GpuServerConfig& g : r.registered->gpu_servers) {
      json e = {{"index", g.index}, {"address", g.address}, {"capacity", g.capacity}};
      if (g.slice) e["slice"] = *g.slice;
      if (!g.profile.empty()) e["profile"] = g.profile;
      if (!g.grpc_address.empty()) e["grpc_address"] = g.grpc_address;
      j["registered"]["gpu_servers"].push_back(std::move(e));
    }
  }
  return j.dump();
}

namespace {

// A node row's "xids": [gpu, xid, unix_ms] each; a damaged entry sets the
// row aside, naming it.
absl::Status DecodeXids(const std::string& row, const json& xids, NodeRecord* r) {
  const std::string at = row + ".xids";
  if (!xids.is_array()) return absl::DataLossError(absl::StrCat("store: ", at, ": wrong type"));
  for (const json& x : xids) {
    if (!x.is_array() || x.size() != 3 || !x[0].is_number_unsigned() ||
        !x[1].is_number_unsigned() || !x[2].is_number() || x[0].get<uint64_t>() > 1024 ||
        x[1].get<uint64_t>() > 100'000) {
      return absl::DataLossError(
          absl::StrCat("store: ", at, "[]: '", x.dump(), "' is not [gpu, xid, unix_ms]"));
    }
    r->xids.push_back({x[0].get<uint32_t>(), x[1].get<uint32_t>(), x[2].get<double>()});
  }
  return absl::OkStatus();
}

// A node row's "registered": what a registering agent said of its node.
absl::StatusOr<RegisteredNode> DecodeRegistered(const std::string& row, const json& reg) {
  const std::string sub = row + ".registered";
  if (!reg.is_object()) return absl::DataLossError(absl::StrCat("store: ", sub, ": wrong type"));
  RegisteredNode n;
  for (absl::Status s :
       {Field(reg, "address", sub, &n.address), Field(reg, "capacity", sub, &n.capacity),
        Field(reg, "cpu_only", sub, &n.cpu_only)}) {
    if (!s.ok()) return s;
  }
  if (!common::ParseHostPort(n.address, "address").ok()) {
    return absl::DataLossError(
        absl::StrCat("store: ", sub, ".address: '", n.address, "' is not HOST:PORT"));
  }
  if (n.capacity < 1 || n.capacity > 1'000'000) {
    return absl::DataLossError(
        absl::StrCat("store: ", sub, ".capacity: ", n.capacity, " is not 1..1000000"));
  }
  if (absl::Status s = Field(reg, "domain", sub, &n.domain); !s.ok()) return s;
  if (absl::Status s = Field(reg, "agent_ip", sub, &n.agent_ip); !s.ok()) return s;
  if (!n.agent_ip.empty() && !common::IsIpAddress(n.agent_ip)) {
    return absl::DataLossError(absl::StrCat(
        "store: ", sub, ".agent_ip: '", absl::CHexEscape(n.agent_ip), "' is not an IP address"));
  }
  if (absl::Status s = Field(reg, "grpc_address", sub, &n.grpc_address); !s.ok()) return s;
  if (!n.grpc_address.empty() && !common::ParseHostPort(n.grpc_address, "grpc").ok()) {
    return absl::DataLossError(
        absl::StrCat("store: ", sub, ".grpc_address: '", n.grpc_address, "' is not HOST:PORT"));
  }
  if (auto gs = reg.find("gpu_servers"); gs != reg.end()) {
    if (!gs->is_array()) {
      return absl::DataLossError(absl::StrCat("store: ", sub, ".gpu_servers: wrong type"));
    }
    for (const json& g : *gs) {
      GpuServerConfig c;
      const std::string at = sub + ".gpu_servers[]";
      if (!g.is_object()) return absl::DataLossError(absl::StrCat("store: ", at, ": wrong type"));
      for (absl::Status s : {Field(g, "index", at, &c.index), Field(g, "address", at, &c.address),
                             Field(g, "capacity", at, &c.capacity)}) {
        if (!s.ok()) return s;
      }
      if (g.contains("slice")) {
        uint32_t slice = 0;
        if (absl::Status s = Field(g, "slice", at, &slice); !s.ok()) return s;
        c.slice = slice;
      }
      if (absl::Status s = Field(g, "profile", at, &c.profile); !s.ok()) return s;
      if (absl::Status s = Field(g, "grpc_address", at, &c.grpc_address); !s.ok()) return s;
      n.gpu_servers.push_back(c);
    }
    if (absl::Status s = CheckGpuServers(n.gpu_servers); !s.ok()) {
      return absl::DataLossError(absl::StrCat("store: ", sub, ".", s.message()));
    }
  }
  return n;
}

}  // namespace

absl::StatusOr<NodeRecord> DecodeNode(const std::string& id, std::string_view text) {
  const std::string row = "node " + id;
  absl::StatusOr<json> j = ParseRow(row, text);
  if (!j.ok()) return j.status();
  NodeRecord r;
  std::string role, state;
  bool fenced = false, drained = false, held_out = false;
  for (absl::Status s : {Field(*j, "role", row, &role), Field(*j, "available", row, &r.available),
                         Field(*j, "state", row, &state), Field(*j, "fenced", row, &fenced),
                         Field(*j, "drained", row, &drained), Field(*j, "held_out", row, &held_out),
                         Field(*j, "restart_until_unix_ms", row, &r.restart_until_unix_ms)}) {
    if (!s.ok()) return s;
  }
  std::optional<Role> parsed_role = ParseRole(role);
  if (!parsed_role) {
    return absl::DataLossError(absl::StrCat("store: ", row, ".role: '", role, "' is not a role"));
  }
  r.role = *parsed_role;
  if (!state.empty()) {
    std::optional<NodeLifecycle> l = ParseNodeLifecycle(state);
    if (!l) {
      return absl::DataLossError(
          absl::StrCat("store: ", row, ".state: '", state, "' is not a node state"));
    }
    r.lifecycle = *l;
  } else {  // a row from before the lifecycle enum
    r.lifecycle = held_out  ? NodeLifecycle::kHeldOut
                  : drained ? NodeLifecycle::kDrained
                  : fenced  ? NodeLifecycle::kFenced
                            : NodeLifecycle::kServing;
  }
  if (auto xids = j->find("xids"); xids != j->end()) {
    if (absl::Status s = DecodeXids(row, *xids, &r); !s.ok()) return s;
  }
  if (auto reg = j->find("registered"); reg != j->end()) {
    absl::StatusOr<RegisteredNode> n = DecodeRegistered(row, *reg);
    if (!n.ok()) return n.status();
    r.registered = *std::move(n);
  }
  return r;
}

std::string EncodeStream(const StreamRecord& r) {
  return json{
      {"tenant", r.tenant}, {"weight", r.weight}, {"primary", r.primary}, {"standby", r.standby}}
      .dump();
}

absl::StatusOr<StreamRecord> DecodeStream(const std::string& id, std::string_view text) {
  const std::string row = "stream " + id;
  absl::StatusOr<json> j = ParseRow(row, text);
  if (!j.ok()) return j.status();
  StreamRecord r;
  for (absl::Status s :
       {Field(*j, "tenant", row, &r.tenant), Field(*j, "weight", row, &r.weight),
        Field(*j, "primary", row, &r.primary), Field(*j, "standby", row, &r.standby)}) {
    if (!s.ok()) return s;
  }
  if (r.weight < 1) {
    return absl::DataLossError(absl::StrCat("store: ", row, ".weight: ", r.weight, " is below 1"));
  }
  return r;
}

}  // namespace gpuha::controller
