#include "placement/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpuha::placement {

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

std::vector<Placement::Node*> Placement::Resolve(const std::string& id) const {
  if (auto it = nodes_.find(id); it != nodes_.end()) return {by_index_[it->second.index]};
  if (auto h = hosts_.find(id); h != hosts_.end()) return h->second.units;
  return {};
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
  Group& g = *n.group;
  group_capacities_.erase({g.capacity, &g});
  g.capacity += add ? n.spec.capacity : -n.spec.capacity;
  if (g.capacity > 0) group_capacities_.emplace(g.capacity, &g);
  capacity_sum_ += add ? n.spec.capacity : -n.spec.capacity;
  counted_load_ += add ? n.load : -n.load;
}

int64_t Placement::SurvivableUnits(const std::vector<const Node*>& without) const {
  int64_t total = capacity_sum_;
  // The groups `without` cuts, with what it cuts from each: a handful.
  std::vector<std::pair<const Group*, int64_t>> cut;
  for (const Node* n : without) {
    if (!Counts(*n)) continue;
    total -= n->spec.capacity;
    auto it =
        std::find_if(cut.begin(), cut.end(), [&](const auto& c) { return c.first == n->group; });
    if (it == cut.end()) {
      cut.emplace_back(n->group, n->spec.capacity);
    } else {
      it->second += n->spec.capacity;
    }
  }
  // The k largest groups: untouched ones keep their order in the index, so
  // the k largest of those plus every cut one hold the answer.
  std::vector<int64_t> largest;
  largest.reserve(static_cast<size_t>(k_) + cut.size());
  for (const auto& [g, c] : cut) largest.push_back(g->capacity - c);
  int64_t taken = 0;
  for (auto it = group_capacities_.rbegin(); it != group_capacities_.rend() && taken < k_; ++it) {
    if (std::any_of(cut.begin(), cut.end(), [&](const auto& c) { return c.first == it->second; })) {
      continue;
    }
    largest.push_back(it->first);
    ++taken;
  }
  std::sort(largest.rbegin(), largest.rend());
  int64_t reserve = 0;
  for (size_t i = 0; i < largest.size() && static_cast<int64_t>(i) < k_; ++i) reserve += largest[i];
  return total - reserve;
}

const std::string& Placement::HostKey(const NodeSpec& spec) {
  return spec.host.empty() ? spec.id : spec.host;
}

std::string Placement::GroupKey(const NodeSpec& spec) {
  return spec.domain.empty() ? absl::StrCat("host:", HostKey(spec))
                             : absl::StrCat("domain:", spec.domain);
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
  n.host = &hosts_[HostKey(spec)];
  n.host->units.push_back(&n);
  n.host->available = available;
  n.group = &groups_[GroupKey(spec)];
  if (!spec.domain.empty()) by_domain_ = true;
  n.group->lo = std::min(n.group->lo, n.index);
  n.group->hi = std::max(n.group->hi, n.index);
  ++n.group->units;
  IndexFree(n);
  Count(n, true);
  return absl::OkStatus();
}

Placement::Node* Placement::PickPrimary(int64_t weight, const Node* away, bool other_group) const {
  for (const auto* index : {&active_free_, &buffer_free_}) {
    for (auto it = index->rbegin(); it != index->rend() && it->first >= weight;) {
      Node* n = by_index_[it->second];
      if (away == nullptr || (other_group ? n->group != away->group : n->host != away->host)) {
        return n;
      }
      if (other_group && n->group->run()) {
        // The rest of the group at this free level sits just below: skip it.
        it = std::make_reverse_iterator(index->lower_bound({it->first, n->group->lo}));
        continue;
      }
      ++it;
    }
  }
  return nullptr;
}

Placement::Node* Placement::PickStandby(const Stream& s) const {
  const Node* p = s.primary;
  // Another domain first, when the primary's group is a domain; then any
  // other host. Never the primary's own host: a machine's failure takes all
  // of its GPUs.
  bool domain = !p->spec.domain.empty();
  for (bool other_group : {true, false}) {
    if (!other_group && !domain) break;
    auto away = [&](const Node* n) {
      return other_group ? n->group != p->group : n->host != p->host;
    };
    // A ready passive node first: a failure then moves the whole node 1:1.
    for (uint32_t i : passive_ready_) {
      Node* c = by_index_[i];
      if (away(c) && c->spec.capacity >= s.spec.weight) return c;
    }
    if (Node* c = PickPrimary(s.spec.weight, p, other_group)) return c;
  }
  return nullptr;
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
        by_domain_ ? " largest failure domain(s))" : " largest node(s))",
        ". If you run all GPUs at 100%, no HA exists."));
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
  std::vector<Node*> units = Resolve(id);
  if (units.empty()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  // Units already out take nothing more away (draining a fenced node).
  std::erase_if(units, [](const Node* n) { return !n->available; });
  if (units.empty()) return absl::OkStatus();
  int64_t survivable = SurvivableUnits({units.begin(), units.end()});
  if (admitted_units_ > survivable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "taking ", id, " out would break N+", k_, ": ", admitted_units_, " admitted > ", survivable,
        " survivable without it. Maintenance at peak load leaves no HA; use force "
        "to override"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Placement::UnitsOf(const std::string& host) const {
  std::vector<std::string> out;
  auto h = hosts_.find(host);
  if (h == hosts_.end()) return out;
  for (const Node* n : h->second.units) out.push_back(n->spec.id);
  return out;
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
  FailoverPlan merged;
  merged.failed = id;
  if (nodes_.count(id) == 0) {
    if (auto h = hosts_.find(id); h != hosts_.end()) h->second.available = false;
  }
  for (FailoverPlan& plan : FailUnits(Resolve(id))) {
    if (merged.promoted.empty()) merged.promoted = plan.promoted;
    auto append = [](auto& to, auto& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
    };
    append(merged.promoted_all, plan.promoted_all);
    append(merged.moved, plan.moved);
    append(merged.restandbyed, plan.restandbyed);
    append(merged.unplaced, plan.unplaced);
  }
  return merged;
}

int64_t Placement::LoadWithNowhereToGo(const std::string& id) const {
  std::vector<Node*> units = Resolve(id);
  int64_t load = 0;
  for (const Node* n : units) load += n->available ? n->load : 0;
  if (load == 0) return 0;
  int64_t free = 0;
  for (const auto& [other, n] : nodes_) {
    const bool same_host =
        std::any_of(units.begin(), units.end(), [&](const Node* u) { return u->host == n.host; });
    if (Counts(n) && !same_host) free += std::max<int64_t>(0, Free(n));
  }
  return std::max<int64_t>(0, load - free);
}

std::vector<FailoverPlan> Placement::FailNodes(const std::vector<std::string>& ids) {
  std::vector<Node*> units;
  for (const std::string& id : ids) {
    for (Node* n : Resolve(id)) units.push_back(n);
  }
  return FailUnits(units);
}

std::vector<FailoverPlan> Placement::FailUnits(const std::vector<Node*>& units) {
  // Every unit leaves the indices first, so no stream moves onto a unit that
  // is about to fail with it.
  std::vector<Node*> failing;
  for (Node* n : units) {
    if (!n->available || std::find(failing.begin(), failing.end(), n) != failing.end()) continue;
    UnindexFree(*n);
    Count(*n, false);
    n->available = false;
    failing.push_back(n);
  }
  std::vector<FailoverPlan> plans;
  plans.reserve(failing.size());
  for (Node* failed : failing) plans.push_back(MoveOff(*failed));
  return plans;
}

FailoverPlan Placement::MoveOff(Node& failed) {
  FailoverPlan plan;
  plan.failed = failed.spec.id;
  std::vector<Stream*> moving = SortedById(failed.primaries);  // deterministic moves
  plan.moved.reserve(moving.size());
  // A ready passive node big enough takes every stream 1:1 and becomes
  // active. Not one on the failed unit's host: a GPU's fault may be its
  // machine's first symptom.
  Node* promoted = nullptr;
  for (uint32_t i : moving.empty() ? std::set<uint32_t>{} : passive_ready_) {
    Node* p = by_index_[i];
    if (p->host != failed.host && p->spec.capacity >= failed.load) {
      promoted = p;
      ChangeRole(*promoted, Role::kActive);
      plan.promoted = promoted->spec.id;
      plan.promoted_all.push_back(plan.promoted);
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
    if (target == nullptr) target = PickPrimary(s->spec.weight);
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
  std::vector<Stream*> orphaned = failed.standbys;
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
  std::vector<Node*> units = Resolve(id);
  if (units.empty()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  if (nodes_.count(id) == 0) hosts_.at(id).available = true;
  for (Node* n : units) {
    if (absl::Status s = RestoreUnit(*n, as_passive); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Placement::RestoreUnit(Node& unit, bool as_passive) {
  Node* n = &unit;
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
  // It must be away from the primary's host, and from its domain unless
  // the standby it has is in that domain too.
  if (n->spec.role == Role::kPassive) {
    for (Node* other : by_index_) {
      if (other->spec.role == Role::kPassive) continue;
      for (Stream* s : std::vector<Stream*>(other->standbys)) {
        const Node* p = s->primary;
        if (p == nullptr || n->spec.capacity < s->spec.weight || n->host == p->host) continue;
        if (n->group == p->group && other->group != p->group) continue;
        SetStandby(*s, n);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Placement::SetRole(const std::string& id, Role role) {
  std::vector<Node*> units = Resolve(id);
  if (units.empty()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  size_t serving = 0;
  for (const Node* n : units) {
    if (n->spec.role == Role::kActive && role != Role::kActive) serving += n->primaries.size();
  }
  if (serving > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " still serves ", serving, " stream(s); drain it first"));
  }
  for (Node* n : units) ChangeRole(*n, role);
  return absl::OkStatus();
}

absl::Status Placement::RemoveNode(const std::string& id) {
  std::vector<Node*> units = Resolve(id);
  if (units.empty()) return absl::NotFoundError(absl::StrCat("node ", id, " not found"));
  for (const Node* n : units) {
    if (n->available || n->host->available) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", id, " is in service; drain or fail it first"));
    }
    if (!n->primaries.empty() || !n->standbys.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("node ", id, " still holds ",
                                                        n->primaries.size() + n->standbys.size(),
                                                        " stream(s) as primary or standby"));
    }
  }
  for (Node* n : units) {
    // Out of service, so in no free index and not counted.
    Node* last = by_index_.back();
    if (last != n) {
      UnindexFree(*last);
      last->index = n->index;
      by_index_[n->index] = last;
      IndexFree(*last);
      // The groups' runs are a shortcut: a moved index breaks its run, so
      // the search walks that group unit by unit (run() is false).
      last->group->lo = std::min(last->group->lo, last->index);
    }
    by_index_.pop_back();
    if (--n->group->units == 0) groups_.erase(GroupKey(n->spec));
    std::vector<Node*>& siblings = n->host->units;
    siblings.erase(std::find(siblings.begin(), siblings.end(), n));
    if (siblings.empty()) hosts_.erase(HostKey(n->spec));
    nodes_.erase(n->spec.id);
  }
  return absl::OkStatus();
}

CapacityFigures Placement::Capacity() const {
  CapacityFigures c;
  c.redundancy = k_;
  c.total_units = capacity_sum_;
  c.max_production_units = SurvivableUnits();
  c.reserve_units = capacity_sum_ - c.max_production_units;
  c.reserve_by_domain = by_domain_;
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
  std::vector<Node*> units = Resolve(id);
  if (units.empty()) return std::nullopt;
  return units.front()->spec.role;
}

bool Placement::Available(const std::string& id) const {
  if (const Node* n = FindNode(id)) return n->available;
  auto h = hosts_.find(id);
  return h != hosts_.end() && h->second.available;
}

int64_t Placement::LoadOf(const std::string& id) const {
  int64_t load = 0;
  for (const Node* n : Resolve(id)) load += n->load;
  return load;
}

}  // namespace gpuha::placement
