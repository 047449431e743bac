// The controller's adapters to the outside: the /api/v1 JSON views and the
// Prometheus text. They read the controller's state under its lock and
// change nothing.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/prometheus.h"
#include "controller/controller.h"

namespace gpuha::controller {

using nlohmann::json;

// Servers per GPU: each GPU is a placement unit with its own state.
json Controller::GpuUnitsJsonLocked(const NodeState& n) const {
  const std::string& id = n.cfg.spec.id;
  const json unknown;  // null
  json units = json::array();
  for (const GpuServerConfig& g : n.cfg.gpu_servers) {
    const std::string unit = GpuUnitId(id, g);
    json u = {{"unit", unit},
              {"index", g.index},
              {"slice", g.slice ? json(*g.slice) : unknown},
              {"profile", g.profile},
              {"address", g.address},
              {"capacity", g.capacity},
              {"load", placement_.LoadOf(unit)},
              {"role", RoleName(placement_.RoleOf(unit).value_or(n.cfg.spec.role))},
              {"in_service", placement_.Available(unit)},
              {"health", unknown},
              {"server_ready", unknown},
              {"reasons", json::array()}};
    if (auto it = n.gpu_states.find(g.Name()); it != n.gpu_states.end() && !standby_) {
      u["health"] = HealthName(it->second.last.health());
      u["server_ready"] = it->second.last.server_ready();
      for (const v1::HealthReason& r : it->second.last.reasons()) {
        u["reasons"].push_back({{"code", r.code()}, {"detail", r.detail()}});
      }
    }
    units.push_back(std::move(u));
  }
  return units;
}

json Controller::NodeJsonLocked(const NodeState& n) const {
  const std::string& id = n.cfg.spec.id;
  // A standby knows what etcd holds, not what the agents said to the
  // leader: its live fields are null and a serving node reads "serving".
  std::string state = n.lifecycle == NodeLifecycle::kHeldOut     ? "held-out"
                      : n.lifecycle == NodeLifecycle::kDrained   ? "drained"
                      : n.lifecycle == NodeLifecycle::kPending   ? "pending"
                      : n.lifecycle == NodeLifecycle::kRejoining ? "rejoining"
                      : !placement_.Available(id)                ? "failed"
                      : n.restart_until                          ? "restarting"
                      : standby_                                 ? "serving"
                      : !n.sink                                  ? "disconnected"
                                : LivenessName(detector_.state(id));
  json gpus = json::array();
  for (const v1::GpuSample& g : n.last.gpus()) {
    json xids = json::array();
    for (const RecentXid& x : n.xids) {
      if (x.gpu == g.index()) xids.push_back({{"xid", x.xid}, {"unix_ms", x.unix_ms}});
    }
    gpus.push_back({{"index", g.index()},
                    {"lost", g.lost()},
                    {"temperature_c", g.temperature_c()},
                    {"power_w", g.power_w()},
                    {"power_limit_w", g.power_limit_w()},
                    {"utilization_pct", g.utilization_pct()},
                    {"memory_used_bytes", g.memory_used_bytes()},
                    {"memory_total_bytes", g.memory_total_bytes()},
                    {"xids", xids}});
  }
  json reasons = json::array();
  for (const v1::HealthReason& r : n.reasons)
    reasons.push_back({{"code", r.code()}, {"detail", r.detail()}});
  const json unknown;  // null
  return {{"name", id},
          {"role", RoleName(placement_.RoleOf(id).value_or(n.cfg.spec.role))},
          {"state", state},
          {"health", standby_ ? unknown : json(HealthName(n.health))},
          {"connected", standby_ ? unknown : json(n.sink != nullptr)},
          {"lifecycle", NodeLifecycleName(n.lifecycle)},
          {"fenced", n.fenced()},
          // The agent's last word on its inference server (false while
          // fenced, and while a server stops or starts).
          {"server_ready", standby_ ? unknown : json(n.server_ready)},
          {"drained", n.lifecycle == NodeLifecycle::kDrained},
          {"held_out", n.lifecycle == NodeLifecycle::kHeldOut},
          {"capacity", n.cfg.spec.capacity},
          {"cpu_only", n.cfg.spec.cpu_only},
          {"load", placement_.LoadOf(id)},
          {"address", n.cfg.address},
          {"domain", n.cfg.spec.domain},
          {"reasons", reasons},
          {"gpus", gpus},
          {"gpu_units", GpuUnitsJsonLocked(n)},
          // A registered node's bound agent IP (null: listed, or not bound).
          {"agent_ip", n.registered && !n.agent_ip.empty() ? json(n.agent_ip) : json(nullptr)}};
}

json Controller::NodesJson() const {
  absl::MutexLock lock(&mu_);
  json out = json::array();
  for (const auto& [id, n] : nodes_) out.push_back(NodeJsonLocked(n));
  return out;
}

absl::StatusOr<json> Controller::NodeJson(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  return NodeJsonLocked(it->second);
}

json Controller::StreamsJson() const {
  absl::MutexLock lock(&mu_);
  json out = json::array();
  for (const Assignment& a : placement_.Assignments()) {
    const StreamSpec& s = specs_.at(a.stream);
    out.push_back({{"id", a.stream},
                   {"tenant", s.tenant},
                   {"weight", s.weight},
                   {"primary", a.primary},
                   {"standby", a.standby},
                   {"placed", !a.primary.empty()}});
  }
  return out;
}

absl::StatusOr<json> Controller::StreamJson(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto a = placement_.Find(id);
  if (!a) return absl::NotFoundError(absl::StrCat("stream ", id, " not found"));
  const StreamSpec& s = specs_.at(id);
  return json{{"id", id},
              {"tenant", s.tenant},
              {"weight", s.weight},
              {"primary", a->primary},
              {"standby", a->standby},
              {"placed", !a->primary.empty()}};
}

json Controller::CapacityJson() const {
  absl::MutexLock lock(&mu_);
  CapacityFigures c = placement_.Capacity();
  // GPU-level headroom, with servers per GPU: how many more of the largest
  // GPUs may fail on top of the N+k reserve with every stream still placed.
  // A split GPU counts whole (its slices' sum); slices count alone too.
  int64_t largest_gpu = 0, largest_slice = 0;
  for (const auto& [id, n] : nodes_) {
    std::map<uint32_t, int64_t> per_gpu;
    for (const GpuServerConfig& g : n.cfg.gpu_servers) {
      per_gpu[g.index] += g.capacity;
      if (g.slice) largest_slice = std::max(largest_slice, g.capacity);
    }
    for (const auto& [gpu, capacity] : per_gpu) largest_gpu = std::max(largest_gpu, capacity);
  }
  const int64_t headroom = std::max<int64_t>(c.headroom_units, 0);
  const json gpu_headroom = largest_gpu == 0 ? json() : json(headroom / largest_gpu);
  const json slice_headroom = largest_slice == 0 ? json() : json(headroom / largest_slice);
  return {{"redundancy", c.redundancy},
          {"total_units", c.total_units},
          {"failover_reserve_units", c.reserve_units},
          {"reserve_by_domain", c.reserve_by_domain},
          {"max_production_units", c.max_production_units},
          {"admitted_units", c.admitted_units},
          {"headroom_units", c.headroom_units},
          {"survives_node_loss", c.headroom_units >= 0 && c.redundancy >= 1},
          {"degraded_units", c.degraded_units},
          {"gpu_failures_absorbed", gpu_headroom},
          {"slice_failures_absorbed", slice_headroom},
          {"unplaced_streams", c.unplaced_streams}};
}

json Controller::StatusJson() const {
  absl::MutexLock lock(&mu_);
  common::Duration left = std::max(common::Duration::zero(), grace_until_ - clock_->Now());
  const json unknown;  // null: on a standby, only the leader knows
  return {{"epoch", epoch_},
          {"leading", acting()},
          {"route_version", standby_ && route_version_ == 0 ? unknown : json(route_version_)},
          {"startup_grace_left_ms", standby_ ? unknown : json(common::ToMillis(left))},
          {"routers", standby_ ? unknown : json(router_acks_.held().size())},
          {"store", store_->Kind()},
          {"store_up", standby_ ? unknown : json(store_up_)}};
}

json Controller::TenantsJson() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::pair<int, int64_t>> usage;
  for (const std::string& t : config_.tenants) usage[t];
  for (const auto& [id, s] : specs_) {
    usage[s.tenant].first++;
    usage[s.tenant].second += s.weight;
  }
  json out = json::array();
  for (const auto& [t, u] : usage)
    out.push_back({{"name", t}, {"streams", u.first}, {"units", u.second}});
  return out;
}

json Controller::EventsJson(std::optional<int64_t> after_id, size_t limit) const {
  absl::MutexLock lock(&mu_);
  json out = json::array();
  for (const Event& e : after_id ? events_.Since(*after_id, limit) : events_.Newest(limit)) {
    out.push_back(EventJson(e));
  }
  return out;
}

json Controller::FailoversJson() const {
  absl::MutexLock lock(&mu_);
  json out = json::array();
  for (const FailoverTiming& t : FailoverTimings(events_.Since(0))) {
    const Event& d = t.detected;
    json f = {{"node", d.node},
              {"epoch", d.epoch},
              {"reason", d.detail},
              {"detected_unix_ms", d.unix_ms}};
    if (t.fault_seen) {
      f["fault_to_detected_ms"] = d.unix_ms - t.fault_seen->unix_ms;
      f["fault_seen_by"] = t.fault_seen->type == "router_hint" ? "router" : "agent";
    }
    if (t.fenced) f["detected_to_fenced_ms"] = t.fenced->mono_ms - d.mono_ms;
    if (t.routes_pushed) f["detected_to_routes_pushed_ms"] = t.routes_pushed->mono_ms - d.mono_ms;
    if (t.routers_acked) f["detected_to_routers_acked_ms"] = t.routers_acked->mono_ms - d.mono_ms;
    out.push_back(std::move(f));
  }
  return out;
}

json Controller::HistoryJson() const {
  absl::MutexLock lock(&mu_);
  // Failovers (of a node, or of one GPU's server) from the stored events,
  // so that a restarted controller (or a standby that took over) still
  // draws the ones before it; from the oldest event kept, so that no
  // minute before the log began reads 0.
  const double now_ms = static_cast<double>(clock_->UnixNanos()) / 1e6;
  double since_ms = now_ms;
  std::vector<double> detected;
  events_.ForEach([&](const Event& e) {
    since_ms = std::min(since_ms, e.unix_ms);
    if (e.type == "detected" || e.type == "gpu_out") detected.push_back(e.unix_ms);
  });
  return {{"interval_ms", 1000},
          {"points", traffic_.PointsJson()},
          {"failovers", TrafficHistory::FailoversPerMinute(detected, since_ms, now_ms)}};
}

json Controller::RoutersJson() const {
  absl::MutexLock lock(&mu_);
  json traffic = traffic_.RoutersJson();
  json out = json::array();
  for (const auto& [id, version] : router_acks_.held()) {
    json r = {{"router", id}, {"route_version", version}, {"current", version == route_version_}};
    for (const json& t : traffic) {
      if (t["router"] == id) r.update(t);
    }
    out.push_back(std::move(r));
  }
  return out;
}

// The per-node and per-unit series.
void Controller::AppendNodeFamiliesLocked(common::PromText* p) const {
  // Liveness, role and lifecycle as series of their own: a role change
  // does not change the identity of the liveness series (Kubernetes'
  // kube_node_status_condition and kube_node_role do the same).
  p->Family("gpuha_controller_node_up", "gauge",
            "1 when the node serves or stands by (joined, in placement, not fenced).");
  for (const auto& [id, n] : nodes_) {
    p->Sample("gpuha_controller_node_up", {{"node", id}}, placement_.Available(id));
  }
  p->Family("gpuha_controller_gpu_up", "gauge",
            "Nodes with a server per GPU (or per MIG slice, `slice` set): 1 while it is in "
            "placement.");
  for (const auto& [id, n] : nodes_) {
    for (const GpuServerConfig& g : n.cfg.gpu_servers) {
      common::PromLabels labels = {{"node", id}, {"gpu", absl::StrCat(g.index)}};
      if (g.slice) labels.emplace_back("slice", absl::StrCat(*g.slice));
      p->Sample("gpuha_controller_gpu_up", labels, placement_.Available(GpuUnitId(id, g)));
    }
  }
  p->Family("gpuha_controller_node_role", "gauge", "1 for the node's current role.");
  for (const auto& [id, n] : nodes_) {
    p->Sample("gpuha_controller_node_role",
              {{"node", id}, {"role", RoleName(placement_.RoleOf(id).value_or(n.cfg.spec.role))}},
              1);
  }
  p->Family("gpuha_controller_node_state", "gauge",
            "1 for the node's current lifecycle state, 0 for the others.");
  for (const auto& [id, n] : nodes_) {
    for (NodeLifecycle l : kNodeLifecycles) {
      p->Sample("gpuha_controller_node_state", {{"node", id}, {"state", NodeLifecycleName(l)}},
                n.lifecycle == l);
    }
  }
  p->Family("gpuha_controller_node_connected", "gauge",
            "1 while the node's agent holds its heartbeat stream.");
  for (const auto& [id, n] : nodes_) {
    p->Sample("gpuha_controller_node_connected", {{"node", id}}, n.sink != nullptr);
  }
}

std::string Controller::MetricsText() const {
  absl::MutexLock lock(&mu_);
  common::PromText p;
  CapacityFigures c = placement_.Capacity();
  failover_steps_.Observe(FailoverTimings(events_.Since(0)));
  failover_steps_.AppendTo(&p);
  // 1 on a controller that acts: the one on SQLite, or the leader on etcd
  // (standbys export 0, from StandbyServer). No 1 across the fleet is the
  // "no controller leads" alert.
  p.Family("gpuha_controller_leader", "gauge", kLeaderHelp);
  p.Sample("gpuha_controller_leader", {{"store", store_->Kind()}}, acting() ? 1 : 0);
  p.Family("gpuha_controller_store_up", "gauge", kStoreUpHelp);
  p.Sample("gpuha_controller_store_up", {{"store", store_->Kind()}}, store_up_ ? 1 : 0);
  p.Family("gpuha_controller_epoch", "gauge", "Cluster epoch.");
  p.Sample("gpuha_controller_epoch", {}, double(epoch_));
  p.Family("gpuha_controller_route_version", "gauge", "Version of the route snapshot.");
  p.Sample("gpuha_controller_route_version", {}, double(route_version_));
  AppendNodeFamiliesLocked(&p);
  p.Family("gpuha_controller_quarantine_held_nodes", "gauge",
           "Nodes whose agent's failed or draining verdict the quarantine breaker holds.");
  size_t held = 0;
  for (const auto& [id, n] : nodes_) held += n.quarantine_held;
  p.Sample("gpuha_controller_quarantine_held_nodes", {}, double(held));
  p.Family("gpuha_controller_jobs", "gauge",
           "Stateful jobs by phase; blocked ones wait for an operator to confirm a fence.");
  for (JobPhase phase : kJobPhases) {
    size_t count = 0;
    for (const auto& [id, j] : jobs_) count += j.r.phase == phase;
    p.Sample("gpuha_controller_jobs", {{"phase", JobPhaseName(phase)}}, double(count));
  }
  struct Gauge {
    const char* name;
    const char* help;
    double value;
  };
  const Gauge gauges[] = {
      {"gpuha_controller_capacity_total_units", "Capacity of available GPU nodes.",
       double(c.total_units)},
      {"gpuha_controller_capacity_max_production_units",
       "Load the cluster carries after losing k nodes.", double(c.max_production_units)},
      {"gpuha_controller_admitted_units", "Stream units admitted.", double(c.admitted_units)},
      {"gpuha_controller_headroom_units", "max_production - admitted.", double(c.headroom_units)},
      {"gpuha_controller_unplaced_streams", "Admitted streams that fit nowhere now.",
       double(c.unplaced_streams)},
      {"gpuha_controller_degraded_units", "CPU-only buffer capacity (degraded).",
       double(c.degraded_units)},
  };
  for (const Gauge& g : gauges) {
    p.Family(g.name, "gauge", g.help);
    p.Sample(g.name, {}, g.value);
  }
  const ControllerCounters counted = CountersLocked();
#define GPUHA_FAMILY(name, help)                                 \
  p.Family("gpuha_controller_" #name "_total", "counter", help); \
  p.Sample("gpuha_controller_" #name "_total", {}, double(counted.name));
  GPUHA_CONTROLLER_COUNTERS(GPUHA_FAMILY)
#undef GPUHA_FAMILY
  common::AppendProcessFamilies("controller", &p);
  return p.str();
}

}  // namespace gpuha::controller
