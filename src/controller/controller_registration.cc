// Which node an agent's hello may hold: a listed node, a node its agent
// registers (the registration policy, the join token and its guard), a
// registered node's binding to its agent's address and its new address.
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/net_util.h"
#include "controller/controller.h"
#include "controller/state_codec.h"

namespace gpuha::controller {

absl::StatusOr<Controller::NodeState*> Controller::AdmitAgentLocked(const v1::Hello& hello,
                                                                    bool proven,
                                                                    const std::string& peer_ip) {
  // Where an agent the transport did not prove comes from: what binds a
  // registered node, and what the join-token throttle counts by.
  const std::string unproven_ip = proven ? std::string() : peer_ip;
  NodeState* n = FindLocked(hello.node());
  if (n == nullptr) {
    absl::StatusOr<NodeState*> added = RegisterLocked(hello, unproven_ip);
    if (!added.ok()) return added.status();
    n = *added;
  } else if (n->registered) {
    // A registered node proves its token on every connection, and only
    // while registration is on.
    if (!config_.registration.enabled) {
      return absl::NotFoundError(
          absl::StrCat("node '", hello.node(), "' was registered, but registration is now off"));
    }
    if (absl::Status s = CheckJoinTokenLocked(hello, unproven_ip); !s.ok()) return s;
    // The join token lets an agent register a node, not take over one an
    // agent elsewhere registered (and move its routes to its own address).
    if (!unproven_ip.empty() && !n->agent_ip.empty() && unproven_ip != n->agent_ip) {
      counters_.agents_refused++;
      EventLocked(
          "registration_refused", hello.node(),
          absl::StrCat("an agent at ", peer_ip, " claimed it; it is bound to ", n->agent_ip));
      return absl::PermissionDeniedError(absl::StrCat(
          "node '", hello.node(), "' was registered from ", n->agent_ip, "; an agent at ", peer_ip,
          " cannot take it over (an admin frees it: POST /api/v1/nodes/", hello.node(),
          "/rebind; mTLS proves a node's name instead)"));
    }
    if (!unproven_ip.empty() && n->agent_ip.empty()) {
      // Freed by an admin, or stored before nodes were bound: bound now.
      n->agent_ip = peer_ip;
      EventLocked("registration_bound", hello.node(), absl::StrCat("to ", peer_ip));
      std::vector<StoreWrite> batch;
      PersistNodeLocked(*n, &batch);
      CommitLocked(std::move(batch));
    }
  } else if (!proven) {
    // A listed node's name proves nothing without mTLS: where a join token
    // is set, its agent proves the token too (a tokenless impostor was
    // welcomed for a dead listed node, and rejoined it).
    if (absl::Status s = CheckJoinTokenLocked(hello, unproven_ip); !s.ok()) return s;
  }
  if (n->sink && !proven) {
    counters_.agents_refused++;
    return absl::AlreadyExistsError(
        absl::StrCat("node '", hello.node(),
                     "' already has a connected agent; a second stream is refused until the "
                     "first one ends (use mTLS to prove a node's name)"));
  }
  return n;
}

absl::Status Controller::UpdateRegistrationLocked(NodeState& n, const v1::Hello& hello) {
  // Only the stream that holds the node may move it: its server may have
  // moved (a rescheduled pod), and routers get the new address.
  if (n.registered) {
    const std::string& address = hello.registration().address();
    const std::string& grpc_address = hello.registration().grpc_address();
    if (!address.empty() && (address != n.cfg.address || grpc_address != n.cfg.grpc_address)) {
      if (!common::ParseHostPort(address, "address").ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", hello.node(), "': registration address '",
                         absl::CHexEscape(address), "' is not HOST:PORT (--address)"));
      }
      if (!grpc_address.empty() && !common::ParseHostPort(grpc_address, "grpc").ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", hello.node(), "': registration grpc_address '",
                         absl::CHexEscape(grpc_address), "' is not HOST:PORT"));
      }
      EventLocked("address_changed", hello.node(),
                  absl::StrCat(n.cfg.address, " -> ", address,
                               grpc_address != n.cfg.grpc_address
                                   ? absl::StrCat(" (gRPC '", n.cfg.grpc_address, "' -> '",
                                                  grpc_address, "')")
                                   : ""));
      n.cfg.address = address;
      n.cfg.grpc_address = grpc_address;
      PushRoutesLocked(absl::StrCat("new address of ", hello.node()));
      std::vector<StoreWrite> batch;
      PersistNodeLocked(n, &batch);
      CommitLocked(std::move(batch));
    }
    if (hello.registration().capacity() != n.cfg.spec.capacity) {
      EventLocked("registration_ignored", hello.node(),
                  absl::StrCat("capacity ", hello.registration().capacity(), " kept at ",
                               n.cfg.spec.capacity,
                               ": a registered node's capacity is fixed at its registration"));
    }
  }
  return absl::OkStatus();
}

absl::Status Controller::CheckJoinTokenLocked(const v1::Hello& hello, const std::string& peer_ip) {
  absl::Status s =
      join_tokens_.Check(hello.node(), hello.registration().join_token(), peer_ip, clock_->Now());
  if (absl::IsResourceExhausted(s)) counters_.join_tokens_throttled++;
  return s;
}

namespace {

// The node a registering agent's hello describes, checked against the
// registration policy; the error names the node and the field.
absl::StatusOr<NodeConfig> RegisteredNodeConfig(const v1::Hello& hello,
                                                const RegistrationPolicy& policy) {
  const std::string node = absl::CHexEscape(hello.node());
  const v1::Registration& reg = hello.registration();
  // With servers per GPU the capacity is theirs (checked below).
  if (reg.gpu_servers_size() == 0 && (reg.capacity() < 1 || reg.capacity() > 1'000'000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", node,
                     "' is not in the config and its agent registers no capacity in 1..1000000 "
                     "(--capacity, --address)"));
  }
  if (!common::ParseHostPort(reg.address(), "address").ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node '", node, "': registration address '",
                                                   absl::CHexEscape(reg.address()),
                                                   "' is not HOST:PORT (--address)"));
  }
  Role role = policy.default_role;
  if (auto it = reg.labels().find(policy.role_label); it != reg.labels().end()) {
    std::optional<Role> r = ParseRole(it->second);
    if (!r) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node, "': label ", policy.role_label,
                                                     "='", absl::CHexEscape(it->second),
                                                     "' is not active, passive or buffer"));
    }
    role = *r;
  }
  std::vector<GpuServerConfig> gpu_servers;
  int64_t capacity = reg.capacity();
  if (reg.gpu_servers_size() > 0) {
    capacity = 0;
    for (const v1::GpuServer& g : reg.gpu_servers()) {
      gpu_servers.push_back({g.index(), g.address(), g.capacity(),
                             g.has_slice() ? std::optional(g.slice()) : std::nullopt, g.profile(),
                             g.grpc_address()});
      capacity += g.capacity();
    }
    if (absl::Status s = CheckGpuServers(gpu_servers); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node, "': registration ",
                                                     s.message(), " (the agent's server.per_gpu)"));
    }
  }
  std::string domain;
  for (const std::string& label : policy.domain_labels) {
    auto it = reg.labels().find(label);
    if (it == reg.labels().end()) continue;
    if (!common::ValidName(it->second)) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node, "': label ", label, "='",
                                                     absl::CHexEscape(it->second), "' must be ",
                                                     common::kNameRule, " (a failure domain)"));
    }
    domain = it->second;
    break;
  }
  if (!reg.grpc_address().empty() && !common::ParseHostPort(reg.grpc_address(), "grpc").ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node '", node, "': registration grpc_address '",
                                                   absl::CHexEscape(reg.grpc_address()),
                                                   "' is not HOST:PORT"));
  }
  return NodeConfig{{hello.node(), role, capacity, reg.cpu_only(), "", domain},
                    reg.address(),
                    gpu_servers,
                    reg.grpc_address()};
}

}  // namespace

absl::StatusOr<Controller::NodeState*> Controller::RegisterLocked(const v1::Hello& hello,
                                                                  const std::string& peer_ip) {
  const RegistrationPolicy& policy = config_.registration;
  const std::string node = absl::CHexEscape(hello.node());
  if (!policy.enabled) {
    return absl::NotFoundError(absl::StrCat(
        "node '", node, "' is not in the controller's config (and registration is off)"));
  }
  if (absl::Status s = CheckJoinTokenLocked(hello, peer_ip); !s.ok()) return s;
  if (!common::ValidName(hello.node())) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", node, "': a name must be ", common::kNameRule));
  }
  absl::StatusOr<NodeConfig> cfg = RegisteredNodeConfig(hello, policy);
  if (!cfg.ok()) return cfg.status();
  if (static_cast<int64_t>(nodes_.size()) >= policy.max_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("node '", node, "': the cluster holds ", nodes_.size(),
                     " nodes, registration.max_nodes (", policy.max_nodes, ")"));
  }
  NodeState& n = nodes_[hello.node()];
  n.cfg = *std::move(cfg);
  n.registered = true;
  n.agent_ip = peer_ip;
  n.lifecycle = NodeLifecycle::kPending;
  for (const NodeSpec& unit : UnitSpecs(n.cfg)) {
    if (absl::Status s = placement_.AddNode(unit, /*available=*/false); !s.ok()) {
      nodes_.erase(hello.node());
      return s;
    }
  }
  const NodeSpec& spec = n.cfg.spec;
  EventLocked(
      "registered", hello.node(),
      absl::StrCat(RoleName(spec.role), ", capacity ", spec.capacity, ", server ", n.cfg.address,
                   n.cfg.gpu_servers.empty()
                       ? ""
                       : absl::StrCat(", ", n.cfg.gpu_servers.size(), " servers per GPU or slice"),
                   spec.domain.empty() ? "" : ", domain " + spec.domain,
                   spec.cpu_only ? ", CPU only" : ""));
  return &n;
}

}  // namespace gpuha::controller
