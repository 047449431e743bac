// The controller's side of its agents' streams: a hello (admitted by
// controller_registration.cc, then the welcome with its heartbeat datagram
// session), each heartbeat from the stream or a datagram, a goodbye, a
// stream that ends.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/heartbeat_datagram.h"
#include "common/log.h"
#include "common/net_util.h"
#include "controller/controller.h"

namespace gpuha::controller {

absl::Status Controller::AgentConnected(const v1::Hello& hello, std::shared_ptr<AgentSink> sink,
                                        bool proven, const std::string& peer_ip) {
  if (absl::Status s = CheckActing(); !s.ok()) return s;  // before waiting on the lock
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  absl::StatusOr<NodeState*> admitted = AdmitAgentLocked(hello, proven, peer_ip);
  if (!admitted.ok()) return admitted.status();
  NodeState* n = *admitted;
  if (absl::Status s = UpdateRegistrationLocked(*n, hello); !s.ok()) return s;
  n->sink = std::move(sink);
  n->healthy_since.reset();
  // An agent that has seen a later epoch than ours (a store restored from
  // an old backup, or lost with --init) would ignore every fence of this
  // one: move past it first.
  if (hello.last_epoch() > epoch_ && hello.last_epoch() < kMaxEpoch) {
    AdvanceEpochLocked(hello.last_epoch(), absl::StrCat("agent ", hello.node(), " has seen epoch ",
                                                        hello.last_epoch()));
  }
  const bool back = n->restart_until.has_value();
  n->restart_until.reset();
  if (placement_.Available(hello.node())) detector_.Connected(hello.node());
  n->gpus = hello.gpus_size();
  JobReportLocked(*n, hello.jobs(), hello.fenced());
  if (!n->known || back) {
    n->known = true;  // from now on a restarted controller expects it back
    // (and, back from a planned restart, no longer gives it the grace)
    std::vector<StoreWrite> batch;
    PersistNodeLocked(*n, &batch);
    CommitLocked(std::move(batch));
  }
  WelcomeLocked(*n, hello);
  // A joining node's agent may still hold a fence (from an earlier life of
  // the cluster, a store lost or --init; or its restart lost the rejoin
  // message): it must run its server to join.
  if (n->joining() && hello.fenced()) SendRejoinLocked(*n);
  EventLocked(
      "agent_connected", hello.node(),
      absl::StrCat(hello.gpus_size(), " GPU(s) via ", hello.gpu_backend(),
                   back ? ", back from a planned restart" : "", n->fenced() ? ", fenced" : "",
                   n->joining() ? "; joins once its server is ready" : ""));
  return absl::OkStatus();
}

void Controller::WelcomeLocked(NodeState& n, const v1::Hello& hello) {
  v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_epoch(epoch_);
  welcome.mutable_welcome()->set_role(RoleName(RoleToTellLocked(n)));
  welcome.mutable_welcome()->set_fenced(n.fenced());
  // A new stream: a new agent process may count its beats from 1 again,
  // and its datagrams get a session and key of their own.
  n.beat_seq = 0;
  EndDatagramsLocked(n);
  if (const uint16_t port = datagram_port_.load(); port != 0) {
    if (absl::StatusOr<DatagramSessions::Offer> offer = datagram_sessions_.Start(hello.node());
        offer.ok()) {
      n.datagram_session = offer->session;
      v1::HeartbeatDatagrams* d = welcome.mutable_welcome()->mutable_datagrams();
      d->set_port(port);
      d->set_session(offer->session);
      d->set_key(offer->key);
    } else {
      // Not offered: the agent beats on its stream.
      EventLocked("datagrams_off", hello.node(), std::string(offer.status().message()));
    }
  }
  n.sink->Send(welcome);
}

void Controller::AgentHeartbeat(const std::string& node, const v1::Heartbeat& hb,
                                const AgentSink* from) {
  if (!acting()) return;
  Step step(this);
  if (!acting()) return;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return;
  if (from != nullptr && n->sink.get() != from) return;  // a replaced stream's late beat
  // A stream beat behind a newer datagram (the stream's bytes were slower,
  // or the agent sent it both ways before it heard) is old news: its
  // telemetry and XIDs count, its state and liveness do not (the newer
  // beat's state was applied; this one's could undo it).
  const bool fresh = hb.seq() == 0 || hb.seq() > n->beat_seq;
  // Beats this one skipped went as datagrams: count the ones that did not come.
  if (fresh && n->datagrams_heard && hb.seq() > n->beat_seq + 1) {
    n->beats_missing += hb.seq() - n->beat_seq - 1;
  }
  HeartbeatLocked(n, node, hb, fresh);
}

void Controller::DatagramsTickLocked(common::TimePoint now, bool stalled) {
  // A second: twenty quiet beats at the default cadence, two telemetry
  // beats on the stream. Three skipped: one or two lost datagrams is no
  // pattern.
  constexpr common::Duration kSilence = std::chrono::seconds(1);
  constexpr uint64_t kMissing = 3;
  // The kernel dropped datagrams unread on the controller's socket (a
  // flood, a burst): a datagram-fed node's silence may be those drops, not
  // the node. Each such node's silence is forgiven and it is told to beat
  // on its stream (TCP, which a UDP flood does not starve); a node that is
  // really gone is then judged by its stream.
  if (const uint64_t dropped = drops_unjudged_.exchange(0); dropped > 0) {
    const std::string why = absl::StrCat(
        "the controller's UDP socket dropped ", dropped,
        " datagram(s) unread (a flood or a burst past its buffer), so heartbeats may be among "
        "them; every beat goes on the stream");
    for (auto& [id, n] : nodes_) {
      if (!n.datagrams_heard || !n.sink) continue;
      DatagramsLostLocked(n, id, why);
      detector_.ForgiveSilence(id);
    }
  }
  for (auto& [id, n] : nodes_) {
    if (!n.datagrams_heard) continue;
    if (stalled) {
      n.last_datagram_at = now;
      continue;
    }
    if (n.beats_missing < kMissing || now - n.last_datagram_at < kSilence || !n.sink) continue;
    const std::string why = absl::StrCat(
        "no heartbeat datagram arrived, not even late, for ",
        common::ToMillis(now - n.last_datagram_at), " ms while its stream beats skipped ",
        n.beats_missing, " beats (UDP blocked on the way?); every beat goes on the stream");
    DatagramsLostLocked(n, id, why);
  }
}

void Controller::DatagramsLostLocked(NodeState& n, const std::string& id, const std::string& why) {
  v1::ControllerMessage lost;
  lost.mutable_datagrams_lost()->set_session(n.datagram_session);
  lost.mutable_datagrams_lost()->set_reason(why);
  n.sink->Send(lost);
  EndDatagramsLocked(n);
  counters_.datagram_fallbacks++;
  EventLocked("datagrams_lost", id, why);
}

void Controller::CountDatagramDrops(uint64_t dropped) {
  datagrams_dropped_ += dropped;
  drops_unjudged_ += dropped;
}

absl::Status Controller::AgentDatagram(absl::string_view datagram) {
  if (!acting()) return absl::UnavailableError("this controller does not lead");
  // Counted without mu_, and verified without it (DatagramSessions).
  absl::StatusOr<DatagramSessions::Beat> beat = datagram_sessions_.Verify(datagram);
  if (!beat.ok()) {
    (absl::IsAlreadyExists(beat.status()) ? datagrams_stale_ : datagrams_refused_)++;
    return beat.status();
  }
  const uint64_t session = beat->session;
  const std::string& node = beat->node;
  const v1::Heartbeat& hb = beat->heartbeat;
  Step step(this);
  if (!acting()) return absl::UnavailableError("this controller does not lead");
  NodeState* n = FindLocked(node);
  // Its stream ended or was replaced while this one was verified.
  if (n == nullptr || n->datagram_session != session) {
    datagrams_stale_++;
    return DatagramSessions::Ended(session);
  }
  // Late or not, the path works.
  n->last_datagram_at = clock_->Now();
  n->beats_missing = 0;
  if (hb.seq() <= n->beat_seq) {
    datagrams_stale_++;
    return absl::AlreadyExistsError(absl::StrCat("node '", node, "': heartbeat ", hb.seq(),
                                                 " is not newer than ", n->beat_seq,
                                                 " (a duplicate, a late datagram or a replay)"));
  }
  counters_.heartbeat_datagrams++;
  if (!n->datagrams_heard && n->sink) {
    n->datagrams_heard = true;
    v1::ControllerMessage heard;
    heard.mutable_datagrams_heard()->set_session(session);
    n->sink->Send(heard);
  }
  HeartbeatLocked(n, node, hb, /*fresh=*/true);
  return absl::OkStatus();
}

void Controller::EndDatagramsLocked(NodeState& n) {
  datagram_sessions_.End(n.datagram_session);
  n.datagram_session = 0;
  n.datagrams_heard = false;
  n.beats_missing = 0;
}

void Controller::HeartbeatLocked(NodeState* n, const std::string& node, const v1::Heartbeat& hb,
                                 bool fresh) {
  n->beat_seq = std::max(n->beat_seq, hb.seq());
  if (hb.gpus_size() > 0 || hb.nics_size() > 0) n->last = hb;  // telemetry is not on every beat
  RecordXidsLocked(*n, hb);
  if (!fresh) return;
  counters_.heartbeats++;
  v1::NodeHealth before = n->health;
  n->health = hb.health();
  for (const v1::GpuHealth& g : hb.gpu_health()) {
    NodeState::GpuState& st = n->gpu_states[GpuServerName(
        g.index(), g.has_slice() ? std::optional(g.slice()) : std::nullopt)];
    st.reported = true;
    st.last = g;
  }
  n->reasons.assign(hb.reasons().begin(), hb.reasons().end());
  bool in_service = placement_.Available(node);
  if (in_service) detector_.Heartbeat(node);
  if (hb.fenced()) n->fenced_beat_at = clock_->Now();
  JobReportLocked(*n, hb.jobs(), hb.fenced());
  RefenceLocked(*n, hb);
  std::string why = n->reasons.empty()
                        ? HealthName(hb.health())
                        : n->reasons.front().code() + ": " + n->reasons.front().detail();
  if (hb.health() != before && hb.health() == v1::NODE_HEALTH_DEGRADED) {
    EventLocked("alert", node, why);
  }
  if (hb.health() == v1::NODE_HEALTH_HEALTHY) {
    if (!n->healthy_since) n->healthy_since = clock_->Now();
  } else {
    n->healthy_since.reset();
  }
  // A server that was ready and stops answering its readiness probe while the
  // node serves (a CUDA call stuck on a hung GPU, a crashed server) takes the
  // node out even though the agent itself is healthy. A server that has not
  // become ready yet (starting, rejoining) does not.
  bool server_was_ready = n->server_ready;
  n->server_ready = hb.server().ready() && !hb.fenced();
  JudgeHeartbeatLocked(*n, node, hb, server_was_ready, in_service, why);
}

void Controller::RecordXidsLocked(NodeState& n, const v1::Heartbeat& hb) {
  // Recent XIDs go into the node's row, timed by the agent: the dashboard's
  // outlive a controller restart and the node's own reboot.
  bool new_xid = false;
  for (const v1::XidEvent& x : hb.xids()) {
    const RecentXid r{x.gpu_index(), x.xid(), static_cast<double>(x.unix_nanos()) / 1e6};
    if (std::any_of(n.xids.begin(), n.xids.end(), [&](const RecentXid& o) {
          return o.gpu == r.gpu && o.xid == r.xid &&
                 std::abs(r.unix_ms - o.unix_ms) < kXidRepeatQuietMs;
        })) {
      continue;
    }
    n.xids.push_back(r);
    if (n.xids.size() > kRecentXids) n.xids.erase(n.xids.begin());
    new_xid = true;
  }
  if (new_xid) {
    std::vector<StoreWrite> batch;
    PersistNodeLocked(n, &batch);
    CommitLocked(std::move(batch));
  }
}

void Controller::RefenceLocked(NodeState& n, const v1::Heartbeat& hb) {
  // An agent acting under an old epoch, or serving while fenced, is corrected.
  // Re-sent with backoff (100 ms doubling to 5 s), and logged once per run:
  // an agent that never confirms once cost an event and a store write per
  // heartbeat. A heartbeat that says fenced ends the run.
  if (n.fenced() && !hb.fenced() && hb.epoch() < epoch_ && n.sink) {
    const common::TimePoint now = clock_->Now();
    if (now >= n.refence_at) {
      const bool first = n.refence_gap == common::Duration::zero();
      n.refence_gap = first ? kRefenceFirst : std::min(2 * n.refence_gap, kRefenceMax);
      n.refence_at = now + n.refence_gap;
      if (first) {
        counters_.stale_agents_corrected++;
        FenceLocked(n, "still serving while fenced");
      } else {
        counters_.fence_repeats++;
        SendFenceLocked(n, "still serving while fenced");
      }
    }
  } else if (hb.fenced()) {
    n.refence_gap = common::Duration::zero();
    n.refence_at = common::TimePoint();
  }
}

void Controller::JudgeHeartbeatLocked(NodeState& n, const std::string& node,
                                      const v1::Heartbeat& hb, bool server_was_ready,
                                      bool in_service, const std::string& why) {
  if (n.joining()) {
    if (n.server_ready && GpuServersUpLocked(n) &&
        (hb.health() == v1::NODE_HEALTH_HEALTHY || hb.health() == v1::NODE_HEALTH_DEGRADED)) {
      JoinLocked(n);
      GpuVerdictsLocked(n);  // a GPU that is down joins out
    } else if (n.lifecycle == NodeLifecycle::kRejoining && hb.health() == v1::NODE_HEALTH_FAILED) {
      RejoinFailedLocked(n, "agent reports failed while rejoining: " + why);
    }
    return;
  }
  if (!in_service || clock_->Now() < grace_until_) return;
  if (server_was_ready && !n.server_ready && !hb.fenced() &&
      hb.health() != v1::NODE_HEALTH_FAILED) {
    TakeOutLocked(n, "inference server not ready (agent's readiness probe)", clock_->UnixNanos(),
                  /*make_before_break=*/false, /*count_failure=*/true, NodeLifecycle::kFenced);
    return;
  }
  const bool verdict =
      hb.health() == v1::NODE_HEALTH_FAILED || hb.health() == v1::NODE_HEALTH_DRAINING;
  // Held only while its server still answers ready: a node whose server
  // stopped serves nothing, whatever the share.
  if (verdict && n.server_ready && !QuarantineAllowsLocked()) {
    if (!n.quarantine_held) {
      n.quarantine_held = true;
      counters_.quarantines_held++;
      EventLocked("quarantine_held", node,
                  absl::StrCat("not taken out (", why, "): more than ",
                               static_cast<int>(config_.quarantine_max_share * 100),
                               "% of the nodes would be out (fence.quarantine_max_share); "
                               "`gpuha ctl drain ",
                               node, "` moves its work and takes it out"));
    }
    return;
  }
  n.quarantine_held = false;
  if (hb.health() == v1::NODE_HEALTH_FAILED) {
    TakeOutLocked(n, "agent reports failed: " + why, hb.health_changed_unix_nanos(),
                  /*make_before_break=*/false, /*count_failure=*/true, NodeLifecycle::kFenced);
  } else if (hb.health() == v1::NODE_HEALTH_DRAINING) {
    TakeOutLocked(n, "agent reports draining: " + why, hb.health_changed_unix_nanos(),
                  /*make_before_break=*/true, /*count_failure=*/true, NodeLifecycle::kFenced);
  } else {
    GpuVerdictsLocked(n);
  }
}

void Controller::AgentDisconnected(const std::string& node, const AgentSink* sink) {
  if (!acting()) return;  // deposed: gRPC threads must not wait on a hung store write
  Step step(this);
  NodeState* n = FindLocked(node);
  if (n == nullptr || n->sink.get() != sink) return;  // a newer stream took over
  n->sink.reset();
  EndDatagramsLocked(*n);
  n->healthy_since.reset();
  if (!n->restart_until) detector_.StreamBroken(node);
  EventLocked(
      "agent_disconnected", node,
      n->restart_until ? "heartbeat stream closed after its goodbye" : "heartbeat stream closed");
}

void Controller::AgentGoodbye(const std::string& node, const AgentSink* sink,
                              const v1::Goodbye& goodbye) {
  Step step(this);
  if (!acting()) return;
  NodeState* n = FindLocked(node);
  if (n == nullptr || n->sink.get() != sink) return;
  const std::string why = absl::StrCat("planned stop: ", goodbye.reason());
  if (!placement_.Available(node)) {
    EventLocked("agent_goodbye", node, absl::StrCat(why, "; the node has no work"));
    // Its agent waits for a fence before it stops its server: nothing to move.
    if (goodbye.server_stops()) SendFenceLocked(*n, why);
  } else if (goodbye.server_stops()) {
    // Its server stops with it: move the work first, then fence. A planned
    // move, not a failure.
    TakeOutLocked(*n, why + "; its server stops with it", 0, /*make_before_break=*/true,
                  /*count_failure=*/false, NodeLifecycle::kFenced);
  } else if (config_.restart_grace > common::Duration::zero()) {
    n->restart_until = clock_->Now() + config_.restart_grace;
    detector_.Forget(node);
    std::vector<StoreWrite> batch;  // a new leader keeps the grace
    PersistNodeLocked(*n, &batch);
    CommitLocked(std::move(batch));
    EventLocked(
        "agent_goodbye", node,
        absl::StrCat(why, "; its server serves on, and nothing fails over for ",
                     common::ToMillis(config_.restart_grace), " ms unless a router sees it fail"));
  } else {
    EventLocked("agent_goodbye", node, why + "; no restart grace (recovery.restart_grace_ms 0)");
  }
}

absl::Status Controller::RebindNode(const std::string& node) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  if (!n->registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " is listed in the config, not registered: nothing binds it"));
  }
  EventLocked("registration_freed", node,
              absl::StrCat("was bound to ", n->agent_ip.empty() ? "nothing" : n->agent_ip,
                           "; the next agent to register it binds it"));
  n->agent_ip.clear();
  std::vector<StoreWrite> batch;
  PersistNodeLocked(*n, &batch);
  CommitLocked(std::move(batch));
  return StoredLocked();
}

absl::Status Controller::RemoveNode(const std::string& node) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  if (!n->registered) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node, " is listed in the config: take it out of `nodes` there and restart"));
  }
  if (n->sink != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, "'s agent is connected",
                     n->agent_ip.empty() ? "" : absl::StrCat(" (from ", n->agent_ip, ")"),
                     "; stop it first, or drain the node to keep it out"));
  }
  for (const auto& [id, j] : jobs_) {
    if (j.r.node == node) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " still names node ", node, "; remove the job first"));
    }
  }
  if (absl::Status s = placement_.RemoveNode(node); !s.ok()) return s;
  detector_.Forget(node);
  EndDatagramsLocked(*n);
  EventLocked(
      "node_removed", node,
      absl::StrCat("registered node forgotten; its name can register again",
                   n->agent_ip.empty() ? "" : absl::StrCat(" (was bound to ", n->agent_ip, ")")));
  nodes_.erase(node);
  std::vector<StoreWrite> batch{{"node", node, std::nullopt}};
  CommitLocked(std::move(batch));
  PushRoutesLocked("node " + node + " removed");
  return StoredLocked();
}

}  // namespace gpuha::controller
