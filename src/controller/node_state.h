// What the controller holds of each node: its config, its agent's stream,
// its agent's last word, and where it stands (its lifecycle, which only the
// controller's transition functions write). Guarded by the controller's
// lock, as a member of its node map.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/controller_config.h"
#include "controller/node_lifecycle.h"
#include "controller/state_codec.h"
#include "gpuha/v1/agent.pb.h"

namespace gpuha::controller {

// Where the controller sends commands to one connected agent.
class AgentSink {
 public:
  virtual ~AgentSink() = default;
  virtual void Send(const v1::ControllerMessage& m) = 0;
};

struct NodeState {
  NodeConfig cfg;
  std::shared_ptr<AgentSink> sink;
  v1::NodeHealth health = v1::NODE_HEALTH_UNSPECIFIED;
  std::vector<v1::HealthReason> reasons;
  v1::Heartbeat last;  // telemetry, for the API
  // The newest Controller::kRecentXids XIDs its agent reported (the newest
  // last), for the API; stored in its row. The same GPU and XID again within
  // kXidRepeatQuietMs is not added (a flood would be a store write each).
  std::vector<RecentXid> xids;
  // Written only by the controller's transition functions (TakeOutLocked,
  // HoldOutLocked, RejoinLocked, RejoinFailedLocked, JoinLocked).
  NodeLifecycle lifecycle = NodeLifecycle::kPending;
  // Waits for its agent's server to answer ready before it takes work.
  bool joining() const {
    return lifecycle == NodeLifecycle::kPending || lifecycle == NodeLifecycle::kRejoining;
  }
  // Held out of service: its agent must not serve. A joining node's agent
  // runs its server (it cannot become ready otherwise); it gets no work.
  bool fenced() const { return lifecycle != NodeLifecycle::kServing && !joining(); }
  bool known = false;       // its agent has connected at least once (stored)
  bool registered = false;  // added by its agent's registration, not the config
  std::string agent_ip;     // registered: the IP it is bound to (RegisteredNode::agent_ip)
  int64_t gpus = 0;         // its agent's GPU count, from the hello (jobs need them)
  // Its agent's last heartbeat that said fenced: an agent that beats so
  // is obeying a fence (its jobs stopping), and the hook waits.
  common::TimePoint fenced_beat_at{};
  bool quarantine_held = false;  // its verdict waits for the breaker (one event per hold)
  bool server_ready = false;     // the agent's last word on its inference server
  std::deque<common::TimePoint> failures;
  std::optional<common::TimePoint> healthy_since;
  // Its agent said goodbye (a planned restart) and its server serves on:
  // its silence is no failure until then.
  std::optional<common::TimePoint> restart_until;
  // Re-sent fences to an agent that does not confirm: the next one and
  // the gap after it (zero: not in a run).
  common::TimePoint refence_at{};
  common::Duration refence_gap{};
  // The heartbeat datagrams of its agent's stream (0: none offered; the
  // key is in datagram_sessions_), whether one was heard, when the last
  // one came (fresh or late), how many beats its stream's beats skipped
  // since then (sent as datagrams that did not come), and the newest
  // heartbeat's seq by either path: an older one is a duplicate or a replay.
  uint64_t datagram_session = 0;
  bool datagrams_heard = false;
  common::TimePoint last_datagram_at{};
  uint64_t beats_missing = 0;
  uint64_t beat_seq = 0;
  // With servers per GPU: each GPU's last word from its agent.
  struct GpuState {
    bool reported = false;  // its agent has said anything of it
    v1::GpuHealth last;
    std::optional<common::TimePoint> healthy_since;  // out, and healthy since then
    bool quarantine_held = false;
  };
  std::map<std::string, GpuState> gpu_states;  // by GpuServerConfig::Name()
  // A joining node waits at most kGpuJoinWait for its GPUs' servers.
  std::optional<common::TimePoint> gpu_join_wait_since;
};

}  // namespace gpuha::controller
