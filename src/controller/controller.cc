#include "controller/controller.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/log.h"
#include "common/names.h"
#include "common/net_util.h"
#include "controller/quarantine.h"
#include "controller/state_codec.h"

namespace gpuha::controller {

using nlohmann::json;

const char* HealthName(v1::NodeHealth h) {
  switch (h) {
    case v1::NODE_HEALTH_HEALTHY:
      return "healthy";
    case v1::NODE_HEALTH_DEGRADED:
      return "degraded";
    case v1::NODE_HEALTH_DRAINING:
      return "draining";
    case v1::NODE_HEALTH_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

Controller::Controller(ControllerConfig config, std::unique_ptr<Store> store, common::Clock* clock,
                       FenceRunner* fencer)
    : config_(std::move(config)),
      store_(std::move(store)),
      clock_(clock),
      fencer_(fencer),
      started_(clock->Now()),
      grace_until_(started_),
      placement_(config_.redundancy),
      detector_(config_.detector, clock) {
  for (const NodeConfig& nc : config_.nodes) nodes_[nc.spec.id].cfg = nc;
}

Controller::~Controller() {
  for (std::thread& t : hooks_) t.join();
}

Controller::NodeState* Controller::FindLocked(const std::string& node) {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : &it->second;
}

void Controller::EventLocked(const std::string& type, const std::string& node,
                             const std::string& detail, std::optional<double> unix_ms) {
  Event e;
  e.mono_ms = std::chrono::duration<double, std::milli>(clock_->Now() - started_).count();
  e.unix_ms = unix_ms.value_or(static_cast<double>(clock_->UnixNanos()) / 1e6);
  e.type = type;
  e.node = node;
  e.epoch = epoch_;
  e.detail = detail;
  const Event& logged = events_.Append(std::move(e));
  if (!acting()) {  // the event log is the new leader's now
  } else if (auto id = store_->AppendEvent(EventJson(logged).dump()); !id.ok()) {
    counters_.store_errors++;
    store_up_ = false;
  } else {
    store_up_ = true;
  }
  spdlog::info("controller: {} {} {}", type, node, detail);
}

void Controller::PersistNodeLocked(const NodeState& n, std::vector<StoreWrite>* batch) const {
  const std::string& id = n.cfg.spec.id;
  NodeRecord r{placement_.RoleOf(id).value_or(n.cfg.spec.role), placement_.Available(id),
               n.lifecycle};
  if (n.registered) {
    r.registered = RegisteredNode{n.cfg.address,     n.cfg.spec.capacity, n.cfg.spec.cpu_only,
                                  n.cfg.spec.domain, n.cfg.gpu_servers,   n.cfg.grpc_address,
                                  n.agent_ip};
  }
  if (n.restart_until) {
    r.restart_until_unix_ms =
        clock_->UnixNanos() / 1'000'000 + common::ToMillis(*n.restart_until - clock_->Now());
  }
  r.xids = n.xids;
  batch->push_back({"node", id, EncodeNode(r)});
}

void Controller::PersistStreamLocked(const std::string& id, std::vector<StoreWrite>* batch) const {
  auto a = placement_.Find(id);
  auto spec = specs_.find(id);
  if (!a || spec == specs_.end()) {
    batch->push_back({"stream", id, std::nullopt});
    return;
  }
  batch->push_back(
      {"stream", id,
       EncodeStream({spec->second.tenant, spec->second.weight, a->primary, a->standby})});
}

Controller::Step::Step(Controller* c) ABSL_NO_THREAD_SAFETY_ANALYSIS : c_(c) { c_->mu_.Lock(); }

Controller::Step::~Step() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  c_->FlushLocked();
  c_->mu_.Unlock();
}

void Controller::CommitLocked(std::vector<StoreWrite> batch) {
  if (!acting()) return;
  for (StoreWrite& w : batch) unsaved_[{w.table, w.key}] = std::move(w.value);
  flush_due_ = true;
}

void Controller::FlushLocked() {
  if (!flush_due_) return;
  flush_due_ = false;
  if (!acting()) return;
  // Rows a failed write left unsaved go with this one: the route version it
  // writes must not vouch for rows the store never got.
  std::vector<StoreWrite> all;
  for (const auto& [row, value] : unsaved_) all.push_back({row.first, row.second, value});
  for (StoreWrite& w : MetaWritesLocked()) all.push_back(std::move(w));
  if (absl::Status s = store_->Apply(all); !s.ok()) {
    counters_.store_errors++;
    store_up_ = false;
    spdlog::error("controller: store write failed ({} row(s) kept for the next commit): {}",
                  unsaved_.size(), s.message());
    last_store_error_ = std::string(s.message());
  } else {
    unsaved_.clear();
    store_up_ = true;
  }
}

absl::Status Controller::StoredLocked() {
  FlushLocked();
  if (!acting()) {
    return absl::UnavailableError(
        "this controller no longer leads, so the change was not stored; retry against the "
        "leader");
  }
  if (!unsaved_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the store did not take the change (", last_store_error_,
                     "), so it is not confirmed; it is retried with the next write"));
  }
  return absl::OkStatus();
}

std::vector<StoreWrite> Controller::MetaWritesLocked() const {
  // The route version goes with the state it describes, so that a standby
  // serves the leader's routes under the leader's version (epoch, version).
  return {{"meta", "epoch", std::to_string(epoch_)},
          {"meta", "route_version", std::to_string(route_version_)},
          {"meta", "job_epoch", std::to_string(job_epoch_)}};
}

void Controller::Tick() {
  if (!acting()) return;
  Step step(this);
  if (!acting()) return;  // deposed while this tick waited for the lock
  // Ticks come every few ms. A long gap means this process was starved or
  // blocked, and heartbeats may sit unread in its queues: a node's silence
  // over the gap is the controller's, not the node's.
  common::TimePoint now = clock_->Now();
  const bool stalled = last_tick_ && now - *last_tick_ > config_.detector.floor / 3;
  if (stalled) {
    detector_.ForgiveSilence();
    counters_.stalls++;
    spdlog::warn("controller: tick delayed {} ms; not counting that silence against nodes",
                 common::ToMillis(now - *last_tick_));
  }
  last_tick_ = now;
  DatagramsTickLocked(now, stalled);
  traffic_.Tick(static_cast<double>(clock_->UnixNanos()) / 1e6);
  std::vector<LivenessChange> changes = detector_.Check();
  bool grace = clock_->Now() < grace_until_;
  for (const LivenessChange& c : changes) {
    NodeState* n = FindLocked(c.node);
    if (n == nullptr || !placement_.Available(c.node)) continue;
    if (c.held) {
      // In the startup grace every agent may still be reconnecting: no news.
      if (!grace) {
        counters_.silences_held++;
        EventLocked("silence_held", c.node, c.reason);
      }
    } else if (c.to == Liveness::kSuspect) {
      EventLocked("suspect", c.node, c.reason);
    } else if (c.to == Liveness::kFailed) {
      if (grace) {
        // Not yet: a restarted controller gives agents one window to return.
        detector_.Connected(c.node);
        continue;
      }
      // Silence alone (its stream intact) may be a loaded host's, not a
      // dead node's. Where failing the node would leave streams with
      // nowhere to go, a false verdict costs them for certain and a true
      // one gains nothing: the verdict waits for the detector's ceiling.
      if (const int64_t stranded = placement_.LoadWithNowhereToGo(c.node);
          !c.broken && stranded > 0 && detector_.HoldToCeiling(c.node)) {
        counters_.silences_held_no_capacity++;
        EventLocked("silence_held", c.node,
                    absl::StrCat(c.reason, "; held: failing it would leave ", stranded,
                                 " stream unit(s) with nowhere to go; it fails if unheard for ",
                                 common::ToMillis(config_.detector.ceiling), " ms"));
        continue;
      }
      int64_t last_ns = clock_->UnixNanos() - std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  clock_->Now() - c.last_heartbeat)
                                                  .count();
      TakeOutLocked(*n, "detector: " + c.reason, last_ns, /*make_before_break=*/false,
                    /*count_failure=*/true, NodeLifecycle::kFenced);
    }
  }
  // A planned restart that did not come back in time is a failure.
  // (A reconnect ends the grace; an agent that hangs on its way out, its
  // stream still open, does not extend it.) Its server may still serve:
  // routes move before the fence.
  for (auto& [id, n] : nodes_) {
    if (!n.restart_until || now < *n.restart_until) continue;
    n.restart_until.reset();
    TakeOutLocked(n,
                  absl::StrCat("its agent did not come back within the restart grace (",
                               common::ToMillis(config_.restart_grace), " ms)"),
                  0, /*make_before_break=*/true, /*count_failure=*/true, NodeLifecycle::kFenced);
  }
  // Recovery: a fenced node whose agent has been healthy for healthy_for rejoins.
  for (auto& [id, n] : nodes_) {
    if (n.lifecycle != NodeLifecycle::kFenced || !n.sink || !n.healthy_since) continue;
    if (clock_->Now() - *n.healthy_since < config_.healthy_for) continue;
    // Not while a job waits for its fence: a rejoined agent no longer
    // holds the fence that confirms it.
    if (JobsFencingLocked(id)) continue;
    RejoinLocked(n, "healthy again");
  }
  JobsTickLocked();
}

void Controller::SendFenceLocked(NodeState& n, const std::string& why) {
  if (!acting()) return;
  v1::ControllerMessage m;
  m.mutable_fence()->set_epoch(epoch_);
  m.mutable_fence()->set_reason(why);
  n.sink->Send(m);
}

void Controller::FenceLocked(NodeState& n, const std::string& why) {
  // Deposed while this take-out waited on a store write: no fence, by
  // message or by hook (the new leader decides).
  if (!acting()) return;
  const std::string id = n.cfg.spec.id;
  if (n.sink) {
    SendFenceLocked(n, why);
    EventLocked("fenced", id, "fence command sent to the agent");
    return;
  }
  if (config_.fence_hook.empty()) {
    EventLocked("fence_unconfirmed", id,
                "agent unreachable and no fence hook configured; the node gets no work");
    NodeFenceFailedLocked(id, "its agent is unreachable and no fence hook is configured");
    return;
  }
  RunFenceHookLocked(id);
}

void Controller::RunFenceHookLocked(const std::string& id) {
  std::string command = absl::StrReplaceAll(config_.fence_hook, {{"{node}", id}});
  EventLocked("fence_hook_started", id, command);
  for (auto& [job, j] : jobs_) {
    if (j.r.node == id && j.r.phase == JobPhase::kFencing) j.escalated = true;
  }
  hooks_.emplace_back([this, command, id] {
    if (!acting()) return;
    absl::Status s = fencer_->Run(command, config_.fence_timeout);
    Step step(this);
    if (s.ok()) {
      EventLocked("fenced", id, "fence hook succeeded");
      NodeFenceConfirmedLocked(id, "the fence hook succeeded");
      return;
    }
    counters_.fence_hook_failures++;
    EventLocked("fence_failed", id, std::string(s.message()));
    NodeFenceFailedLocked(id, absl::StrCat("its fence hook failed: ", s.message()));
    NodeState* n = FindLocked(id);
    if (n == nullptr || !n->fenced()) return;  // it rejoined meanwhile: its agent is fenced-aware
    // Never hand an unfenced node work again.
    std::vector<StoreWrite> batch;
    HoldOutLocked(*n, "its fence was not confirmed", &batch);
    CommitLocked(std::move(batch));
  });
}

void Controller::CountFailureLocked(NodeState& n, std::vector<StoreWrite>* batch) {
  common::TimePoint now = clock_->Now();
  n.failures.push_back(now);
  while (!n.failures.empty() && now - n.failures.front() > config_.failure_window) {
    n.failures.pop_front();
  }
  if (static_cast<int>(n.failures.size()) >= config_.max_failures) {
    HoldOutLocked(
        n,
        absl::StrCat(
            n.failures.size(), " failures within ",
            std::chrono::duration_cast<std::chrono::seconds>(config_.failure_window).count(), " s"),
        batch);
  }
}

void Controller::HoldOutLocked(NodeState& n, const std::string& why,
                               std::vector<StoreWrite>* batch) {
  if (n.lifecycle == NodeLifecycle::kHeldOut) return;
  n.lifecycle = NodeLifecycle::kHeldOut;
  EventLocked("held_out", n.cfg.spec.id, absl::StrCat(why, "; an operator must undrain it"));
  PersistNodeLocked(n, batch);
}

void Controller::TakeOutLocked(NodeState& n, const std::string& why, int64_t fault_unix_ns,
                               bool make_before_break, bool count_failure, NodeLifecycle to) {
  if (!acting()) return;
  const std::string id = n.cfg.spec.id;
  if (!placement_.Available(id)) {
    // Already out: only an operator's drain changes its state (a held-out
    // node stays held out).
    if (to == NodeLifecycle::kDrained &&
        (n.lifecycle == NodeLifecycle::kFenced || n.lifecycle == NodeLifecycle::kRejoining)) {
      // A rejoining node's agent was told to serve again: fenced once more.
      if (n.lifecycle == NodeLifecycle::kRejoining) FenceLocked(n, why);
      n.lifecycle = to;
      std::vector<StoreWrite> batch;
      PersistNodeLocked(n, &batch);
      CommitLocked(std::move(batch));
    }
    return;
  }
  n.lifecycle = to;
  n.quarantine_held = false;
  ++epoch_;
  counters_.failovers++;
  n.healthy_since.reset();  // it must prove itself healthy again after the fence
  if (fault_unix_ns > 0)
    EventLocked("fault_seen", id, why, static_cast<double>(fault_unix_ns) / 1e6);
  EventLocked("detected", id, why);
  std::vector<StoreWrite> batch;
  // Its jobs wait for the fence that follows (before it: a fence that
  // cannot be confirmed at once blocks them).
  JobsOffNodeLocked(n, fault_unix_ns, /*planned=*/make_before_break && !count_failure);
  if (!make_before_break) FenceLocked(n, why);
  FailoverPlan plan = placement_.FailNode(id);
  detector_.Forget(id);
  for (auto& [job, j] : jobs_) {
    if (j.r.node == id && j.r.phase == JobPhase::kFencing) j.prefer = NodeOfUnit(plan.promoted);
  }
  for (const Assignment& a : plan.moved) PersistStreamLocked(a.stream, &batch);
  for (const Assignment& a : plan.restandbyed) PersistStreamLocked(a.stream, &batch);
  for (const std::string& s : plan.unplaced) PersistStreamLocked(s, &batch);
  if (count_failure) CountFailureLocked(n, &batch);
  std::string moved =
      absl::StrCat(plan.moved.size(), " stream(s) moved",
                   plan.promoted.empty() ? "" : " to passive " + NodeOfUnit(plan.promoted));
  EventLocked("streams_moved", id, moved);
  if (!plan.unplaced.empty()) {
    counters_.unplaced_streams += plan.unplaced.size();
    EventLocked("streams_unplaced", id,
                absl::StrCat(plan.unplaced.size(), " stream(s) fit nowhere under N+",
                             config_.redundancy, "; they answer 503 until capacity returns"));
  }
  PersistPromotedLocked(plan, &batch);
  PushRoutesLocked(absl::StrCat("failover of ", id));
  if (make_before_break) FenceLocked(n, why);
  PersistNodeLocked(n, &batch);
  for (const auto& [job, j] : jobs_) {
    if (j.r.node == id) PersistJobLocked(j, &batch);
  }
  CommitLocked(std::move(batch));
}

bool Controller::QuarantineAllowsLocked() const {
  if (config_.quarantine_max_share >= 1) return true;
  // Out: every joined node not in placement (fenced, drained, held out,
  // rejoining); nodes that never joined count on neither side.
  int64_t out = 0, joined = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.lifecycle == NodeLifecycle::kPending) continue;
    ++joined;
    out += !placement_.Available(id);
  }
  return QuarantineAllows(config_.quarantine_max_share, out, joined);
}

void Controller::JoinLocked(NodeState& n) {
  const std::string id = n.cfg.spec.id;
  n.gpu_join_wait_since.reset();
  n.quarantine_held = false;
  const bool rejoin = n.lifecycle == NodeLifecycle::kRejoining;
  if (absl::Status s = placement_.RestoreNode(id, /*as_passive=*/rejoin); !s.ok()) return;
  n.lifecycle = NodeLifecycle::kServing;
  n.refence_gap = common::Duration::zero();
  n.refence_at = common::TimePoint();
  detector_.Connected(id);
  EventLocked(
      rejoin ? "rejoined" : "joined", id,
      absl::StrCat(rejoin ? "server ready again" : "agent connected and server ready",
                   "; serves as ", RoleName(placement_.RoleOf(id).value_or(n.cfg.spec.role))));
  std::vector<StoreWrite> batch;
  PersistNodeLocked(n, &batch);
  for (const Assignment& a : placement_.Assignments()) PersistStreamLocked(a.stream, &batch);
  PushRoutesLocked(absl::StrCat(rejoin ? "rejoin of " : "join of ", id));
  CommitLocked(std::move(batch));
}

Role Controller::RoleToTellLocked(const NodeState& n) const {
  Role role = placement_.RoleOf(n.cfg.spec.id).value_or(n.cfg.spec.role);
  // A rejoining active node comes back as passive (JoinLocked).
  if (n.lifecycle == NodeLifecycle::kRejoining && role == Role::kActive) role = Role::kPassive;
  return role;
}

void Controller::SendRejoinLocked(NodeState& n) {
  if (!n.sink || !acting()) return;
  v1::ControllerMessage m;
  m.mutable_rejoin()->set_epoch(epoch_);
  m.mutable_rejoin()->set_role(RoleName(RoleToTellLocked(n)));
  n.sink->Send(m);
}

void Controller::RejoinFailedLocked(NodeState& n, const std::string& why) {
  n.lifecycle = NodeLifecycle::kFenced;
  FenceLocked(n, why);
  std::vector<StoreWrite> batch;
  CountFailureLocked(n, &batch);
  PersistNodeLocked(n, &batch);
  CommitLocked(std::move(batch));
}

void Controller::RejoinLocked(NodeState& n, const std::string& why) {
  if (!acting()) return;
  const std::string id = n.cfg.spec.id;
  if (placement_.Available(id)) return;
  n.lifecycle = NodeLifecycle::kRejoining;
  n.refence_gap = common::Duration::zero();
  n.refence_at = common::TimePoint();
  ++epoch_;
  SendRejoinLocked(n);
  EventLocked("rejoining", id,
              absl::StrCat(why, "; told to serve again, it takes work once its server is ready"));
  std::vector<StoreWrite> batch;
  PersistNodeLocked(n, &batch);
  CommitLocked(std::move(batch));
}

void Controller::StopActing(const std::string& why) {
  if (!acting_.exchange(false)) return;
  spdlog::warn("controller: no longer leads ({}): it acts no more while it stops", why);
  routes_cv_.SignalAll();  // router streams end, and routers find the leader
}

absl::Status Controller::CheckActing() const {
  if (acting()) return absl::OkStatus();
  return absl::UnavailableError("this controller no longer leads; it is stopping");
}

void Controller::PushRoutesLocked(const std::string& why) {
  if (!acting()) return;
  ++route_version_;
  EventLocked("routes_pushed", "", absl::StrCat("version ", route_version_, " (", why, ")"));
  routes_cv_.SignalAll();
}

absl::Status Controller::CheckStreamLocked(const StreamSpec& s) const {
  if (!common::ValidStreamId(s.id)) {
    return absl::InvalidArgumentError(absl::StrCat("id: '", absl::CHexEscape(s.id.substr(0, 140)),
                                                   "' must be ", common::kStreamIdRule,
                                                   ", the rule routers route by"));
  }
  if (!common::ValidName(s.tenant)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant: '", absl::CHexEscape(s.tenant.substr(0, 70)), "' must be ", common::kNameRule));
  }
  if (!config_.tenants.empty() && std::find(config_.tenants.begin(), config_.tenants.end(),
                                            s.tenant) == config_.tenants.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant: '", s.tenant, "' is not a known tenant"));
  }
  if (s.weight < 1 || s.weight > kMaxStreamWeight) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: must be between 1 and ", kMaxStreamWeight, ", got ", s.weight));
  }
  return absl::OkStatus();
}

bool Controller::HasTenant(const std::string& t) const {
  return config_.tenants.empty() ||
         std::find(config_.tenants.begin(), config_.tenants.end(), t) != config_.tenants.end();
}

std::vector<Event> Controller::EventsSince(int64_t after_id) const {
  absl::MutexLock lock(&mu_);
  return events_.Since(after_id);
}

void Controller::AdvanceEpochLocked(uint64_t past, const std::string& why) {
  epoch_ = past + 1;
  EventLocked("epoch_advanced", "", absl::StrCat(why, "; the controller's epoch is now ", epoch_));
  PushRoutesLocked(absl::StrCat("epoch ", epoch_));
  CommitLocked({});
}

uint64_t Controller::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

ControllerCounters Controller::counters() const {
  absl::MutexLock lock(&mu_);
  return CountersLocked();
}

ControllerCounters Controller::CountersLocked() const {
  ControllerCounters c = counters_;
  c.datagrams_refused = datagrams_refused_.load();
  c.datagrams_stale = datagrams_stale_.load();
  c.datagrams_dropped = datagrams_dropped_.load();
  return c;
}

}  // namespace gpuha::controller
