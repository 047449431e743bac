// The controller's state read back from its store at start, at a takeover
// (Recover) and by a standby (LoadAsStandby): meta, nodes, streams, jobs
// and the recent events, each row checked as the API checks its input.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "controller/controller.h"
#include "controller/state_codec.h"

namespace gpuha::controller {

using nlohmann::json;

namespace {

// A row that does not read back (damaged by hand, by another writer, by
// a bug) is set aside, named, and left as it is in the store: the rest
// of the cluster is served. One bad row must not keep every controller
// from leading (each would fail its takeover the same way).
void SetAside(std::vector<std::pair<std::string, std::string>>* aside, std::string row,
              const absl::Status& why) {
  spdlog::error(
      "controller: store: {}: {}; set aside (not served) until it is written again or deleted", row,
      why.message());
  aside->emplace_back(std::move(row), std::string(why.message()));
}

}  // namespace

absl::Status Controller::Recover() { return RecoverImpl(/*standby=*/false); }

absl::Status Controller::LoadAsStandby() {
  acting_ = false;  // before anything is read: nothing may act or write
  standby_ = true;
  return RecoverImpl(/*standby=*/true);
}

absl::Status Controller::RecoverImpl(bool standby) {
  Step step(this);
  auto meta = store_->Load("meta");
  if (!meta.ok()) return meta.status();
  if (absl::Status s = RecoverMetaLocked(*meta, standby); !s.ok()) return s;
  SetAsideRows aside;
  auto stored_nodes = store_->Load("node");
  if (!stored_nodes.ok()) return stored_nodes.status();
  if (absl::Status s = RecoverNodesLocked(*stored_nodes, &aside); !s.ok()) return s;
  if (absl::Status s = RecoverStreamsLocked(*stored_nodes, &aside); !s.ok()) return s;
  if (absl::Status s = RecoverJobsLocked(&aside); !s.ok()) return s;
  // A restarted controller starts a new epoch: its route versions count from
  // 1 again, and routers take a newer epoch's snapshot over any older one.
  // Recorded once every row has been read: a takeover that fails reading
  // moves nothing. A standby only reads: the leader's epoch is the one it
  // shows.
  if (!standby) {
    ++epoch_;
    if (absl::Status s = store_->Apply(MetaWritesLocked()); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("store: cannot record the new epoch: ", s.message()));
    }
  }
  counters_.store_rows_set_aside = aside.size();
  if (absl::Status s = RecoverEventsLocked(); !s.ok()) return s;
  // A restarted controller has heard from nobody yet: it waits one detection
  // window for agents to reconnect before it fails anything over.
  grace_until_ = clock_->Now() + config_.startup_grace;
  // Only nodes seen before the restart are watched now; a node whose agent
  // has never connected is watched from its first connection.
  for (auto& [id, n] : nodes_) {
    n.known = stored_nodes->count(id) != 0;
    if (n.known && placement_.Available(id) && !n.restart_until) detector_.Connected(id);
  }
  if (standby) return absl::OkStatus();
  EventLocked(
      "controller_started", "",
      absl::StrCat(specs_.size(), " stream(s), epoch ", epoch_, ", ", nodes_.size(), " node(s)"));
  for (const auto& [row, why] : aside) {
    EventLocked("store_row_set_aside", "",
                absl::StrCat(row, ": ", why, "; not served until it is written again or deleted"));
  }
  return absl::OkStatus();
}

absl::Status Controller::RecoverMetaLocked(const std::map<std::string, std::string>& meta,
                                           bool standby) {
  if (auto it = meta.find("epoch"); it != meta.end()) {
    // A negative epoch was once read as 18446744073709551615.
    if (!absl::SimpleAtoi(it->second, &epoch_) || epoch_ >= kMaxEpoch) {
      return absl::DataLossError(
          absl::StrCat("store: meta.epoch: '", absl::CHexEscape(it->second), "' is not an epoch"));
    }
  }
  if (auto it = meta.find("job_epoch"); it != meta.end()) {
    if (!absl::SimpleAtoi(it->second, &job_epoch_)) {
      return absl::DataLossError(absl::StrCat("store: meta.job_epoch: '",
                                              absl::CHexEscape(it->second), "' is not an epoch"));
    }
  }
  // A standby serves the route version the leader last committed; 0 (none
  // written yet, or by an older binary) serves no routes.
  if (standby) {
    route_version_ = 0;
    auto it = meta.find("route_version");
    if (it != meta.end() && !absl::SimpleAtoi(it->second, &route_version_)) {
      return absl::DataLossError(absl::StrCat("store: meta.route_version: '",
                                              absl::CHexEscape(it->second), "' is not a version"));
    }
  }
  return absl::OkStatus();
}

absl::Status Controller::RecoverNodesLocked(std::map<std::string, std::string>& stored_nodes,
                                            SetAsideRows* aside) {
  // Nodes their agents registered come back from their rows (a listed node
  // keeps the config's values).
  for (auto& [id, text] : stored_nodes) {
    if (nodes_.count(id) != 0) continue;
    absl::StatusOr<NodeRecord> r = DecodeNode(id, text);
    if (!r.ok()) {
      SetAside(aside, absl::StrCat("node ", absl::CHexEscape(id)), r.status());
      continue;
    }
    if (!r->registered) continue;  // a node since removed from the config
    NodeState& n = nodes_[id];
    n.cfg = {
        {id, r->role, r->registered->capacity, r->registered->cpu_only, "", r->registered->domain},
        r->registered->address,
        r->registered->gpu_servers,
        r->registered->grpc_address};
    n.registered = true;
    n.agent_ip = r->registered->agent_ip;
  }
  for (auto& [id, n] : nodes_) {
    NodeSpec spec = n.cfg.spec;
    // A node never stored has never had its agent connect: it waits.
    bool available = false;
    n.lifecycle = NodeLifecycle::kPending;
    absl::StatusOr<NodeRecord> r = absl::NotFoundError("no row");
    if (auto it = stored_nodes.find(id); it != stored_nodes.end()) {
      r = DecodeNode(id, it->second);
      // A listed node whose row is damaged starts as one never stored: it
      // waits for its agent, and its row is written anew when it joins.
      // (Its row stays in stored_nodes: a node with a row is no older
      // binary's, whose streams would mark it serving below.)
      if (!r.ok()) SetAside(aside, absl::StrCat("node ", id), r.status());
    }
    if (r.ok()) {
      spec.role = r->role;
      available = r->available;
      n.xids = r->xids;
      // A planned agent restart under the previous leader keeps its grace,
      // and at least the startup grace every node gets to reconnect.
      const int64_t left_ms = r->restart_until_unix_ms - clock_->UnixNanos() / 1'000'000;
      if (available && r->restart_until_unix_ms > 0 && left_ms > 0) {
        n.restart_until =
            clock_->Now() +
            std::max<common::Duration>(std::chrono::milliseconds(left_ms), config_.startup_grace);
      }
      // Restored, not a transition. A node placement counts is serving,
      // whatever else an older row said (a fence hook that failed after the
      // node had rejoined once marked such a node held out).
      n.lifecycle = available ? NodeLifecycle::kServing : r->lifecycle;
    }
    for (NodeSpec unit : UnitSpecs(n.cfg)) {
      unit.role = spec.role;
      if (absl::Status s = placement_.AddNode(unit, available); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Controller::RecoverStreamsLocked(std::map<std::string, std::string>& stored_nodes,
                                              SetAsideRows* aside) {
  auto streams = store_->Load("stream");
  if (!streams.ok()) return streams.status();
  for (auto& [id, text] : *streams) {
    const std::string row = absl::StrCat("stream '", absl::CHexEscape(id), "'");
    absl::StatusOr<StreamRecord> r = DecodeStream(id, text);
    if (!r.ok()) {
      SetAside(aside, row, r.status());
      continue;
    }
    StreamSpec spec{id, r->tenant, r->weight};
    // Every row read back is checked as the API checks its input.
    if (absl::Status s = CheckStreamLocked(spec); !s.ok()) {
      SetAside(aside, row, s);
      continue;
    }
    absl::Status too_heavy;
    for (const std::string* node : {&r->primary, &r->standby}) {
      const NodeState* n = node->empty() ? nullptr : FindLocked(*node);
      if (n != nullptr && r->weight > n->cfg.spec.capacity) {
        too_heavy = absl::DataLossError(absl::StrCat("weight ", r->weight, " exceeds node ", *node,
                                                     "'s capacity ", n->cfg.spec.capacity));
      }
    }
    if (!too_heavy.ok()) {
      SetAside(aside, row, too_heavy);
      continue;
    }
    // A listed node with no row that stored streams name was placed before
    // nodes waited to join (an older binary): it serves as it did, and the
    // detector watches it, rather than holding streams while pending.
    for (const std::string* node : {&r->primary, &r->standby}) {
      NodeState* n = node->empty() ? nullptr : FindLocked(*node);
      if (n != nullptr && n->lifecycle == NodeLifecycle::kPending &&
          stored_nodes.count(*node) == 0) {
        n->lifecycle = NodeLifecycle::kServing;
        if (absl::Status s = placement_.RestoreNode(*node, /*as_passive=*/false); !s.ok()) {
          return s;
        }
        stored_nodes.emplace(*node, "");  // known from now on
      }
    }
    // A node whose GPU layout changed since (servers per GPU on or off)
    // no longer has the units a row names: the stream waits to be placed.
    for (std::string* end : {&r->primary, &r->standby}) {
      if (!end->empty() && !placement_.RoleOf(*end)) {
        spdlog::warn("controller: stream {} names unit {}, which no node has now", id, *end);
        end->clear();
      }
    }
    // A standby on its own primary protects nothing: the stream waits for
    // a standby as any other that lost one.
    if (!r->standby.empty() && r->standby == r->primary) {
      spdlog::warn(
          "controller: stream {} names {} as both primary and standby; its standby "
          "is chosen anew",
          id, r->primary);
      r->standby.clear();
    }
    if (absl::Status s = placement_.LoadStream(spec, r->primary, r->standby); !s.ok()) {
      SetAside(aside, row, s);
      continue;
    }
    specs_[id] = spec;
  }
  return absl::OkStatus();
}

absl::Status Controller::RecoverJobsLocked(SetAsideRows* aside) {
  auto jobs = store_->Load("job");
  if (!jobs.ok()) return jobs.status();
  for (auto& [id, text] : *jobs) {
    absl::StatusOr<JobRecord> r = DecodeJob(id, text);
    if (!r.ok()) {
      SetAside(aside, absl::StrCat("job '", absl::CHexEscape(id), "'"), r.status());
      continue;
    }
    JobState& j = jobs_[id];
    j.r = std::move(*r);
    job_epoch_ = std::max(job_epoch_, j.r.job_epoch);
    // A fence this process did not see begin is waited for afresh: its
    // agent may still confirm it, else the hook runs after fence.timeout_ms.
    j.fence_since = clock_->Now();
  }
  return absl::OkStatus();
}

absl::Status Controller::RecoverEventsLocked() {
  // The recent events come back too, so the failover history survives a
  // restart. An event row that does not parse keeps its id as an
  // "unreadable" event, with a warning.
  auto events = store_->LoadEvents(0, SIZE_MAX);
  if (!events.ok()) return events.status();
  for (auto& [id, text] : *events) {
    absl::StatusOr<Event> e = EventFromJson(json::parse(text, nullptr, false));
    if (!e.ok()) {
      spdlog::warn("controller: store event {}: {}; skipped", id, e.status().message());
      e = Event{.type = "unreadable"};
    }
    e->id = id;
    events_.Restore(std::move(*e));
  }
  // Failovers before the restart were counted by the previous process.
  failover_steps_.Skip(FailoverTimings(events_.Since(0)));
  return absl::OkStatus();
}

}  // namespace gpuha::controller
