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

std::optional<Role> ParseRole(std::string_view name) {
  for (Role r : {Role::kActive, Role::kPassive, Role::kBuffer}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

Placement::Node* Placement::FindNode(const std::string& id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

const Placement::Node* Placement::FindNode(const std::string& id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

Assignment Placement::ToAssignment(const Stream& s) {
  return {s.spec.id, s.primary ? s.primary->spec.id : "", s.standby ? s.standby->spec.id : ""};
}

std::set<std::pair<int64_t, uint32_t>>* Placement::FreeIndex(const Node& n) {
  if (!n.available) return nullptr;
  if (n.spec.role == Role::kActive) return &active_free_;
  if (n.spec.role == Role::kBuffer) return &buffer_free_;
  return nullptr;
}

void Placement::IndexFree(Node& n) {
  if (auto* index = FreeIndex(n)) index->emplace(Free(n), n.index);
  if (n.available && n.spec.role == Role::kPassive) passive_ready_.insert(n.index);
}

void Placement::UnindexFree(Node& n) {
  if (auto* index = FreeIndex(n)) index->erase({Free(n), n.index});
  passive_ready_.erase(n.index);
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
    counted_load_ += n.load;
  } else {
    capacities_.erase(capacities_.find(n.spec.capacity));
    capacity_sum_ -= n.spec.capacity;
    counted_load_ -= n.load;
  }
}

int64_t Placement::SurvivableUnits(const Node* without) const {
  int64_t total = capacity_sum_;
  int64_t skip = 0;  // `without`'s capacity, once, from the multiset
  if (without != nullptr && Counts(*without)) {
    total -= without->spec.capacity;
    skip = without->spec.capacity;
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
  auto [it, inserted] = nodes_.try_emplace(spec.id);
  if (!inserted)
    return absl::AlreadyExistsError(absl::StrCat("node ", spec.id, " is listed twice"));
  Node& n = it->second;
  n.spec = spec;
  n.available = available;
  n.index = static_cast<uint32_t>(by_index_.size());
  by_index_.push_back(&n);
  IndexFree(n);
  Count(n, true);
  return absl::OkStatus();
}

Placement::Node* Placement::PickPrimary(int64_t weight, const Node* avoid) const {
  for (const auto* index : {&active_free_, &buffer_free_}) {
    for (auto it = index->rbegin(); it != index->rend() && it->first >= weight; ++it) {
      Node* n = by_index_[it->second];
      if (n != avoid) return n;
    }
  }
  return nullptr;
}

Placement::Node* Placement::PickStandby(const Stream& s) const {
  // A ready passive node first: a failure then moves the whole node 1:1.
  for (uint32_t i : passive_ready_) {
    Node* p = by_index_[i];
    if (p != s.primary && p->spec.capacity >= s.spec.weight) return p;
  }
  return PickPrimary(s.spec.weight, s.primary);
}

namespace {

// Membership of a stream in a node's list, by slot: O(1) join and leave.
template <typename Stream>
void Join(std::vector<Stream*>& list, Stream* s, size_t* slot) {
  *slot = list.size();
  list.push_back(s);
}

template <typename Stream>
void Leave(std::vector<Stream*>& list, size_t slot, size_t Stream::*slot_of) {
  Stream* last = list.back();
  list[slot] = last;
  last->*slot_of = slot;
  list.pop_back();
}

}  // namespace

void Placement::SetPrimary(Stream& s, Node* node) {
  if (s.primary != nullptr) {
    Node& old = *s.primary;
    UnindexFree(old);
    old.load -= s.spec.weight;
    if (Counts(old)) counted_load_ -= s.spec.weight;
    Leave(old.primaries, s.primary_slot, &Stream::primary_slot);
    IndexFree(old);
  }
  s.primary = node;
  if (node != nullptr) {
    UnindexFree(*node);
    node->load += s.spec.weight;
    if (Counts(*node)) counted_load_ += s.spec.weight;
    Join(node->primaries, &s, &s.primary_slot);
    IndexFree(*node);
  }
  Track(s);
}

void Placement::Track(Stream& s) {
  if (s.primary == nullptr) {
    unplaced_.insert(&s);
  } else {
    unplaced_.erase(&s);
  }
  if (s.primary != nullptr && s.standby == nullptr) {
    standbyless_.insert(&s);
  } else {
    standbyless_.erase(&s);
  }
}

void Placement::SetStandby(Stream& s, Node* node) {
  if (s.standby != nullptr) Leave(s.standby->standbys, s.standby_slot, &Stream::standby_slot);
  s.standby = node;
  if (node != nullptr) Join(node->standbys, &s, &s.standby_slot);
  Track(s);
}

absl::StatusOr<Assignment> Placement::Admit(const StreamSpec& spec) {
  if (spec.id.empty()) return absl::InvalidArgumentError("id: a stream needs an id");
  if (spec.weight < 1) return absl::InvalidArgumentError("weight: must be at least 1");
  if (streams_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("stream ", spec.id, " already exists"));
  }
  int64_t survivable = SurvivableUnits();  // O(k)
  if (admitted_units_ + spec.weight > survivable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "admitting stream ", spec.id, " (", spec.weight, " units) would break N+", k_, ": ",
        admitted_units_, " admitted + ", spec.weight, " > ", survivable, " survivable (",
        capacity_sum_, " total - ", capacity_sum_ - survivable, " reserve for the ", k_,
        " largest node(s)). If you run all GPUs at 100%, no HA exists."));
  }
  Node* primary = PickPrimary(spec.weight, nullptr);
  if (primary == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no active or buffer node has ", spec.weight,
                                                      " free units for stream ", spec.id,
                                                      "; promote a passive node or add capacity"));
  }
  Stream& s = streams_[spec.id];
  s.spec = spec;
  SetPrimary(s, primary);
  SetStandby(s, PickStandby(s));
  admitted_units_ += spec.weight;
  return ToAssignment(s);
}

absl::Status Placement::LoadStream(const StreamSpec& spec, const std::string& primary,
                                   const std::string& standby) {
  if (streams_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("stream ", spec.id, " already exists"));
  }
  Node* p = primary.empty() ? nullptr : FindNode(primary);
  Node* b = standby.empty() ? nullptr : FindNode(standby);
  if ((!primary.empty() && p == nullptr) || (!standby.empty() && b == nullptr)) {
    return absl::NotFoundError(absl::StrCat("stream ", spec.id, " names unknown node ",
                                            p == nullptr && !primary.empty() ? primary : standby));
  }
  Stream& s = streams_[spec.id];
  s.spec = spec;
  SetPrimary(s, p);
  SetStandby(s, b);
  admitted_units_ += spec.weight;
  return absl::OkStatus();
}

absl::Status Placement::Remove(const std::string& id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return absl::NotFoundError(absl::StrCat("stream ", id, " not found"));
  SetPrimary(it->second, nullptr);
  SetStandby(it->second, nullptr);
  unplaced_.erase(&it->second);
  admitted_units_ -= it->second.spec.weight;
  streams_.erase(it);
  return absl::OkStatus();
}

absl::Status Placement::CanRemoveNode(const std::string& id) const {
  const Node* n = FindNode(id);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  if (!n->available) return absl::OkStatus();
  int64_t survivable = SurvivableUnits(n);
  if (admitted_units_ > survivable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "taking ", id, " out would break N+", k_, ": ", admitted_units_, " admitted > ", survivable,
        " survivable without it. Maintenance at peak load leaves no HA; use force "
        "to override"));
  }
  return absl::OkStatus();
}

namespace {
template <typename T>
std::vector<T*> SortedById(const std::vector<T*>& list) {
  std::vector<T*> out = list;
  std::sort(out.begin(), out.end(), [](T* a, T* b) { return a->spec.id < b->spec.id; });
  return out;
}
}  // namespace

FailoverPlan Placement::FailNode(const std::string& id) {
  FailoverPlan plan;
  plan.failed = id;
  Node* failed = FindNode(id);
  if (failed == nullptr || !failed->available) return plan;
  UnindexFree(*failed);
  Count(*failed, false);
  failed->available = false;

  std::vector<Stream*> moving = SortedById(failed->primaries);  // deterministic moves
  plan.moved.reserve(moving.size());
  // A ready passive node big enough takes every stream 1:1 and becomes active.
  Node* promoted = nullptr;
  for (uint32_t i : moving.empty() ? std::set<uint32_t>{} : passive_ready_) {
    if (by_index_[i]->spec.capacity >= failed->load) {
      promoted = by_index_[i];
      ChangeRole(*promoted, Role::kActive);
      plan.promoted = promoted->spec.id;
      break;
    }
  }
  for (Stream* s : moving) {
    Node* target = promoted;
    if (target == nullptr && s->standby != nullptr && s->standby->available &&
        Free(*s->standby) >= s->spec.weight) {
      if (s->standby->spec.role == Role::kPassive) ChangeRole(*s->standby, Role::kActive);
      target = s->standby;
    }
    if (target == nullptr) target = PickPrimary(s->spec.weight, failed);
    SetPrimary(*s, target);
    if (target == nullptr) {
      plan.unplaced.push_back(s->spec.id);
      SetStandby(*s, nullptr);
      continue;
    }
    SetStandby(*s, PickStandby(*s));
    plan.moved.push_back(ToAssignment(*s));
  }
  // A stream's new standby does not depend on the others' (standbys take no
  // capacity), so the orphans need no sorting: a promoted passive node
  // stands by for most of a fleet, and sorting its list by id was most of
  // a failover's cost at 10,000 nodes.
  std::vector<Stream*> orphaned = failed->standbys;
  if (promoted != nullptr) {
    // The promoted node no longer stands by for anyone.
    orphaned.insert(orphaned.end(), promoted->standbys.begin(), promoted->standbys.end());
  }
  plan.restandbyed.reserve(orphaned.size());
  for (Stream* s : orphaned) {
    if (s->primary == nullptr) continue;
    SetStandby(*s, PickStandby(*s));
    plan.restandbyed.push_back(ToAssignment(*s));
  }
  return plan;
}

absl::Status Placement::RestoreNode(const std::string& id, bool as_passive) {
  Node* n = FindNode(id);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  if (n->available) return absl::OkStatus();
  n->available = true;
  if (as_passive && n->spec.role == Role::kActive) {
    n->spec.role = Role::kPassive;  // rejoin as standby
  }
  IndexFree(*n);
  Count(*n, true);
  // Streams that fit nowhere during the outage are placed now; nothing else
  // moves. Both sets are kept as streams change, so a repair costs what it
  // changes, not a scan of every stream (a 10,000-node fleet repairs a node
  // every few minutes).
  for (Stream* s : std::vector<Stream*>(standbyless_.begin(), standbyless_.end())) {
    SetStandby(*s, PickStandby(*s));
  }
  std::vector<Stream*> waiting(unplaced_.begin(), unplaced_.end());
  std::sort(waiting.begin(), waiting.end(),
            [](Stream* a, Stream* b) { return a->spec.id < b->spec.id; });
  for (Stream* s : waiting) {
    Node* target = PickPrimary(s->spec.weight, nullptr);
    if (target == nullptr && n->spec.role == Role::kPassive && Free(*n) >= s->spec.weight) {
      ChangeRole(*n, Role::kActive);
      target = n;
    }
    if (target == nullptr) continue;
    SetPrimary(*s, target);
    SetStandby(*s, PickStandby(*s));
  }
  // A node back as passive is the standby again for streams that had to
  // stand by on an active node meanwhile: a failure then moves 1:1 again.
  // Those streams are on the standby lists of the nodes that are not passive.
  if (n->spec.role == Role::kPassive) {
    for (Node* other : by_index_) {
      if (other->spec.role == Role::kPassive) continue;
      for (Stream* s : std::vector<Stream*>(other->standbys)) {
        if (s->primary != nullptr && n->spec.capacity >= s->spec.weight) SetStandby(*s, n);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Placement::SetRole(const std::string& id, Role role) {
  Node* n = FindNode(id);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  if (n->spec.role == Role::kActive && role != Role::kActive && !n->primaries.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, " still serves ", n->primaries.size(), " stream(s); drain it first"));
  }
  ChangeRole(*n, role);
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
  for (const Node* n : by_index_) {
    if (n->available && n->spec.cpu_only) c.degraded_units += n->spec.capacity;
  }
  c.unplaced_streams = static_cast<int64_t>(unplaced_.size());
  return c;
}

std::optional<Assignment> Placement::Find(const std::string& id) const {
  auto it = streams_.find(id);
  if (it == streams_.end()) return std::nullopt;
  return ToAssignment(it->second);
}

std::vector<Assignment> Placement::Assignments() const {
  std::vector<Assignment> out;
  out.reserve(streams_.size());
  for (const auto& [id, s] : streams_) out.push_back(ToAssignment(s));
  std::sort(out.begin(), out.end(),
            [](const Assignment& a, const Assignment& b) { return a.stream < b.stream; });
  return out;
}

std::optional<Role> Placement::RoleOf(const std::string& id) const {
  const Node* n = FindNode(id);
  if (n == nullptr) return std::nullopt;
  return n->spec.role;
}

bool Placement::Available(const std::string& id) const {
  const Node* n = FindNode(id);
  return n != nullptr && n->available;
}

int64_t Placement::LoadOf(const std::string& id) const {
  const Node* n = FindNode(id);
  return n == nullptr ? 0 : n->load;
}

}  // namespace gpuha::controller
