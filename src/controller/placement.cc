#include "controller/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

const char* RoleName(Role r) {
  switch (r) {
    case Role::kActive:
      return "active";
    case Role::kPassive:
      return "passive";
    case Role::kBuffer:
      return "buffer";
  }
  return "active";
}

std::set<std::pair<int64_t, std::string>>* Placement::FreeIndex(const Node& n) {
  if (!n.available) return nullptr;
  if (n.spec.role == Role::kActive) return &active_free_;
  if (n.spec.role == Role::kBuffer) return &buffer_free_;
  return nullptr;
}

void Placement::IndexFree(Node& n) {
  if (auto* index = FreeIndex(n)) index->emplace(Free(n), n.spec.id);
  if (n.available && n.spec.role == Role::kPassive) passive_ready_.insert(n.spec.id);
}

void Placement::UnindexFree(Node& n) {
  if (auto* index = FreeIndex(n)) index->erase({Free(n), n.spec.id});
  passive_ready_.erase(n.spec.id);
}

void Placement::ChangeRole(Node& n, Role role) {
  UnindexFree(n);
  n.spec.role = role;
  IndexFree(n);
}

void Placement::Count(const Node& n, bool add) {
  if (!Counts(n)) return;
  if (add) {
    capacities_.insert(n.spec.capacity);
    capacity_sum_ += n.spec.capacity;
  } else {
    capacities_.erase(capacities_.find(n.spec.capacity));
    capacity_sum_ -= n.spec.capacity;
  }
}

int64_t Placement::SurvivableUnits(const std::string& without) const {
  int64_t total = capacity_sum_;
  int64_t skip = 0;  // `without`'s capacity, once, from the multiset
  auto it = nodes_.find(without);
  if (it != nodes_.end() && Counts(it->second)) {
    total -= it->second.spec.capacity;
    skip = it->second.spec.capacity;
  }
  int64_t reserve = 0;
  int64_t taken = 0;
  for (auto c = capacities_.rbegin(); c != capacities_.rend() && taken < k_; ++c) {
    if (skip != 0 && *c == skip) {
      skip = 0;
      continue;
    }
    reserve += *c;
    ++taken;
  }
  return total - reserve;
}

absl::Status Placement::AddNode(const NodeSpec& spec, bool available) {
  if (spec.id.empty()) return absl::InvalidArgumentError("node id is empty");
  if (spec.capacity < 0) {
    return absl::InvalidArgumentError(absl::StrCat("node ", spec.id, ": capacity is negative"));
  }
  if (nodes_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("node ", spec.id, " is listed twice"));
  }
  Node& n = nodes_[spec.id];
  n.spec = spec;
  n.available = available;
  IndexFree(n);
  Count(n, true);
  return absl::OkStatus();
}

std::string Placement::PickPrimary(int64_t weight, const std::string& avoid) const {
  for (const auto* index : {&active_free_, &buffer_free_}) {
    for (auto it = index->rbegin(); it != index->rend() && it->first >= weight; ++it) {
      if (it->second != avoid) return it->second;
    }
  }
  return "";
}

std::string Placement::PickStandby(const Stream& s) const {
  // A ready passive node first: a failure then moves the whole node 1:1.
  for (const std::string& id : passive_ready_) {
    if (id != s.primary && nodes_.at(id).spec.capacity >= s.spec.weight) return id;
  }
  return PickPrimary(s.spec.weight, s.primary);
}

void Placement::SetPrimary(Stream& s, const std::string& node) {
  if (!s.primary.empty()) {
    Node& old = nodes_.at(s.primary);
    UnindexFree(old);
    old.load -= s.spec.weight;
    old.primaries.erase(s.spec.id);
    IndexFree(old);
  }
  s.primary = node;
  if (!node.empty()) {
    Node& n = nodes_.at(node);
    UnindexFree(n);
    n.load += s.spec.weight;
    n.primaries.insert(s.spec.id);
    IndexFree(n);
  }
}

void Placement::SetStandby(Stream& s, const std::string& node) {
  if (!s.standby.empty()) nodes_.at(s.standby).standbys.erase(s.spec.id);
  s.standby = node;
  if (!node.empty()) nodes_.at(node).standbys.insert(s.spec.id);
}

absl::StatusOr<Assignment> Placement::Admit(const StreamSpec& spec) {
  if (spec.id.empty()) return absl::InvalidArgumentError("id: a stream needs an id");
  if (spec.weight < 1) return absl::InvalidArgumentError("weight: must be at least 1");
  if (streams_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("stream ", spec.id, " already exists"));
  }
  int64_t survivable = SurvivableUnits();
  if (admitted_units_ + spec.weight > survivable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "admitting stream ", spec.id, " (", spec.weight, " units) would break N+", k_, ": ",
        admitted_units_, " admitted + ", spec.weight, " > ", survivable, " survivable (",
        capacity_sum_, " total - ", capacity_sum_ - survivable, " reserve for the ", k_,
        " largest node(s)). If you run all GPUs at 100%, no HA exists."));
  }
  std::string primary = PickPrimary(spec.weight, "");
  if (primary.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no active or buffer node has ", spec.weight,
                                                      " free units for stream ", spec.id,
                                                      "; promote a passive node or add capacity"));
  }
  Stream& s = streams_[spec.id];
  s.spec = spec;
  SetPrimary(s, primary);
  SetStandby(s, PickStandby(s));
  admitted_units_ += spec.weight;
  return Assignment{spec.id, s.primary, s.standby};
}

absl::Status Placement::LoadStream(const StreamSpec& spec, const std::string& primary,
                                   const std::string& standby) {
  if (streams_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("stream ", spec.id, " already exists"));
  }
  for (const std::string& n : {primary, standby}) {
    if (!n.empty() && nodes_.count(n) == 0) {
      return absl::NotFoundError(absl::StrCat("stream ", spec.id, " names unknown node ", n));
    }
  }
  Stream& s = streams_[spec.id];
  s.spec = spec;
  SetPrimary(s, primary);
  SetStandby(s, standby);
  admitted_units_ += spec.weight;
  return absl::OkStatus();
}

absl::Status Placement::Remove(const std::string& id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return absl::NotFoundError(absl::StrCat("stream ", id, " not found"));
  SetPrimary(it->second, "");
  SetStandby(it->second, "");
  admitted_units_ -= it->second.spec.weight;
  streams_.erase(it);
  return absl::OkStatus();
}

absl::Status Placement::CanRemoveNode(const std::string& id) const {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  if (!it->second.available) return absl::OkStatus();
  int64_t survivable = SurvivableUnits(id);
  if (admitted_units_ > survivable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "taking ", id, " out would break N+", k_, ": ", admitted_units_, " admitted > ", survivable,
        " survivable without it. Maintenance at peak load leaves no HA; use force "
        "to override"));
  }
  return absl::OkStatus();
}

FailoverPlan Placement::FailNode(const std::string& id) {
  FailoverPlan plan;
  plan.failed = id;
  auto nit = nodes_.find(id);
  if (nit == nodes_.end() || !nit->second.available) return plan;
  Node& failed = nit->second;
  UnindexFree(failed);
  Count(failed, false);
  failed.available = false;

  std::vector<std::string> moving(failed.primaries.begin(), failed.primaries.end());
  std::sort(moving.begin(), moving.end());  // deterministic moves and events
  // A ready passive node big enough takes every stream 1:1 and becomes active.
  for (const std::string& pid : moving.empty() ? std::set<std::string>{} : passive_ready_) {
    Node& p = nodes_.at(pid);
    if (p.spec.capacity >= failed.load) {
      plan.promoted = pid;
      ChangeRole(p, Role::kActive);
      break;
    }
  }
  for (const std::string& sid : moving) {
    Stream& s = streams_.at(sid);
    std::string target = plan.promoted;
    if (target.empty() && !s.standby.empty()) {
      Node& sb = nodes_.at(s.standby);
      if (sb.available && Free(sb) >= s.spec.weight) {
        if (sb.spec.role == Role::kPassive) ChangeRole(sb, Role::kActive);
        target = s.standby;
      }
    }
    if (target.empty()) target = PickPrimary(s.spec.weight, id);
    SetPrimary(s, target);
    if (target.empty()) {
      plan.unplaced.push_back(sid);
      SetStandby(s, "");
      continue;
    }
    SetStandby(s, PickStandby(s));
    plan.moved.push_back({sid, s.primary, s.standby});
  }
  std::vector<std::string> orphaned(failed.standbys.begin(), failed.standbys.end());
  if (!plan.promoted.empty()) {
    // The promoted node no longer stands by for anyone.
    const auto& was = nodes_.at(plan.promoted).standbys;
    orphaned.insert(orphaned.end(), was.begin(), was.end());
  }
  std::sort(orphaned.begin(), orphaned.end());
  for (const std::string& sid : orphaned) {
    Stream& s = streams_.at(sid);
    if (s.primary.empty()) continue;
    SetStandby(s, PickStandby(s));
    plan.restandbyed.push_back({sid, s.primary, s.standby});
  }
  return plan;
}

absl::Status Placement::RestoreNode(const std::string& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  Node& n = it->second;
  if (n.available) return absl::OkStatus();
  n.available = true;
  if (n.spec.role == Role::kActive) n.spec.role = Role::kPassive;  // rejoin as standby
  IndexFree(n);
  Count(n, true);
  // Streams that fit nowhere during the outage are placed now; nothing else moves.
  for (auto& [sid, s] : streams_) {
    if (!s.primary.empty()) {
      if (s.standby.empty()) SetStandby(s, PickStandby(s));
      continue;
    }
    std::string target = PickPrimary(s.spec.weight, "");
    if (target.empty() && n.spec.role == Role::kPassive && Free(n) >= s.spec.weight) {
      ChangeRole(n, Role::kActive);
      target = id;
    }
    if (target.empty()) continue;
    SetPrimary(s, target);
    SetStandby(s, PickStandby(s));
  }
  return absl::OkStatus();
}

absl::Status Placement::SetRole(const std::string& id, Role role) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  Node& n = it->second;
  if (n.spec.role == Role::kActive && role != Role::kActive && !n.primaries.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, " still serves ", n.primaries.size(), " stream(s); drain it first"));
  }
  ChangeRole(n, role);
  return absl::OkStatus();
}

CapacityFigures Placement::Capacity() const {
  CapacityFigures c;
  c.redundancy = k_;
  c.total_units = capacity_sum_;
  c.max_production_units = SurvivableUnits();
  c.reserve_units = capacity_sum_ - c.max_production_units;
  c.admitted_units = admitted_units_;
  c.headroom_units = c.max_production_units - admitted_units_;
  for (const auto& [id, n] : nodes_) {
    if (n.available && n.spec.cpu_only) c.degraded_units += n.spec.capacity;
  }
  for (const auto& [id, s] : streams_) c.unplaced_streams += s.primary.empty() ? 1 : 0;
  return c;
}

std::optional<Assignment> Placement::Find(const std::string& id) const {
  auto it = streams_.find(id);
  if (it == streams_.end()) return std::nullopt;
  return Assignment{id, it->second.primary, it->second.standby};
}

std::vector<Assignment> Placement::Assignments() const {
  std::vector<Assignment> out;
  out.reserve(streams_.size());
  for (const auto& [id, s] : streams_) out.push_back({id, s.primary, s.standby});
  std::sort(out.begin(), out.end(),
            [](const Assignment& a, const Assignment& b) { return a.stream < b.stream; });
  return out;
}

std::optional<Role> Placement::RoleOf(const std::string& id) const {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.spec.role;
}

bool Placement::Available(const std::string& id) const {
  auto it = nodes_.find(id);
  return it != nodes_.end() && it->second.available;
}

int64_t Placement::LoadOf(const std::string& id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? 0 : it->second.load;
}

}  // namespace gpuha::controller
