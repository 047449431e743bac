// NodeLifecycle: where a node stands in the controller's eyes, as one enum
// (keepalived's VRRP states, Pacemaker's node states). The controller's
// transition functions (TakeOutLocked, HoldOutLocked, RejoinLocked,
// RejoinFailedLocked, Undrain) are its only writers; each records its event
// and persists the node once.
//
//   pending --agent connected, server ready--> serving
//   serving --failure--> fenced --healthy for healthy_for--> rejoining
//   serving --drain----> drained --undrain--> rejoining
//   rejoining --server ready--> serving (as passive)
//   rejoining --agent reports failed--> fenced
//   fenced  --too many failures, or the fence hook failed--> held-out
//   held-out --undrain--> rejoining
//
// Only a serving node carries work or stands by. A pending node has never
// served: its agent has not yet connected with a ready server (placement
// once put streams on nodes that never started, and routers answered 502).
// A rejoining node's agent has been told to serve again and restarts its
// server; it takes work once that server answers ready (a node put back at
// once was given a failed node's streams while its server was still
// starting, and routers answered 502). Every other state is fenced (its
// agent stops serving, routers send it nothing).
#pragma once

#include <optional>
#include <string_view>

namespace gpuha::controller {

enum class NodeLifecycle {
  kPending,    // not yet joined: no agent with a ready server so far; no work
  kServing,    // in placement: primary or standby work
  kFenced,     // taken out after a failure; rejoins by itself once healthy
  kRejoining,  // told to serve again; takes work once its server is ready
  kDrained,    // taken out by an operator; stays out until undrained
  kHeldOut,    // failed too often, or its fence was not confirmed: an operator decides
};

inline const char* NodeLifecycleName(NodeLifecycle s) {
  switch (s) {
    case NodeLifecycle::kPending:
      return "pending";
    case NodeLifecycle::kServing:
      return "serving";
    case NodeLifecycle::kFenced:
      return "fenced";
    case NodeLifecycle::kRejoining:
      return "rejoining";
    case NodeLifecycle::kDrained:
      return "drained";
    case NodeLifecycle::kHeldOut:
      return "held-out";
  }
  return "unknown";
}

inline constexpr NodeLifecycle kNodeLifecycles[] = {
    NodeLifecycle::kPending,   NodeLifecycle::kServing, NodeLifecycle::kFenced,
    NodeLifecycle::kRejoining, NodeLifecycle::kDrained, NodeLifecycle::kHeldOut};

inline std::optional<NodeLifecycle> ParseNodeLifecycle(std::string_view s) {
  for (NodeLifecycle l : kNodeLifecycles) {
    if (s == NodeLifecycleName(l)) return l;
  }
  return std::nullopt;
}

}  // namespace gpuha::controller
