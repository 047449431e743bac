// Placement: streams on nodes under the N+k rule (seed 002 section 5), each with
// a standby chosen in advance so a node's failure moves its streams
// predictably, and the moves a failure makes.
//
//   Placement p(/*k=*/1);
//   p.AddNode({"n1", Role::kActive, 10});  ... p.AddNode({"n4", Role::kPassive, 10});
//   auto a = p.Admit({"cam-17", "acme", 1});   // 409-worthy error when N+k breaks
//   auto moves = p.FailNode("n1");            // passive n4 takes n1's streams 1:1
//
// Primaries go on active nodes, least loaded first. A standby is a ready
// passive node when there is one, else the node with the most spare capacity.
//
// A placement node is a unit of capacity: a whole machine, or one GPU (or
// slice) of a machine that runs a server per GPU (issue 16). Units name their
// machine (`host`) and may name a failure domain (a rack or zone label). A
// stream's standby is never on its primary's host, and is in another domain
// where one has room. N+k reserves the k largest domains; a unit without a
// domain is one with its host, so without labels that is the k largest hosts.
//
//   p.AddNode({"n1/gpu0", Role::kActive, 4, false, "n1", "rack-a"});
//   auto plans = p.FailNodes(p.UnitsOf("n1"));  // the whole machine
//   auto plan = p.FailNode("n1/gpu0");           // one GPU: its streams only
// Thread-safety: none; the controller's loop owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::placement {

enum class Role { kActive, kPassive, kBuffer };
const char* RoleName(Role r);
// "active", "passive" or "buffer"; nullopt for anything else.
std::optional<Role> ParseRole(std::string_view name);

struct NodeSpec {
  std::string id;
  Role role = Role::kActive;
  int64_t capacity = 0;   // stream units
  bool cpu_only = false;  // a CPU buffer: degraded capacity, outside the N+k sums
  std::string host{};     // the machine this unit is on; empty: the unit is one
  std::string domain{};   // failure domain (rack, zone); empty: its host
};

struct StreamSpec {
  std::string id;
  std::string tenant;
  int64_t weight = 1;
};

struct Assignment {
  std::string stream;
  std::string primary;  // empty while the stream fits nowhere
  std::string standby;  // empty when no other node can take it
};

// Live N+k figures, the same arithmetic `gpuha plan` does.
struct CapacityFigures {
  int64_t redundancy = 0;
  int64_t total_units = 0;         // available GPU nodes, all roles
  int64_t reserve_units = 0;       // the k largest available hosts (or domains)
  bool reserve_by_domain = false;  // some node names a failure domain
  int64_t max_production_units = 0;
  int64_t admitted_units = 0;
  int64_t headroom_units = 0;
  int64_t degraded_units = 0;  // CPU-only buffer capacity, not counted above
  int64_t unplaced_streams = 0;
};

struct FailoverPlan {
  std::string failed;
  std::string promoted;                   // passive node that became active, if any
  std::vector<std::string> promoted_all;  // every one (a host's units may take several)
  std::vector<Assignment> moved;          // new primaries for the failed node's streams
  std::vector<Assignment> restandbyed;    // streams whose standby was the failed node
  std::vector<std::string> unplaced;      // streams that fit nowhere
};

class Placement {
 public:
  explicit Placement(int64_t redundancy) : k_(redundancy) {}

  // `available` false loads a node that is out (failed, fenced or drained).
  [[nodiscard]] absl::Status AddNode(const NodeSpec& node, bool available = true);
  // Restores a stored assignment without admission (controller restart).
  [[nodiscard]] absl::Status LoadStream(const StreamSpec& stream, const std::string& primary,
                                        const std::string& standby);
  // Admits a stream when the cluster still survives losing any k nodes;
  // FailedPrecondition (HTTP 409) otherwise, with the arithmetic.
  [[nodiscard]] absl::StatusOr<Assignment> Admit(const StreamSpec& stream);
  [[nodiscard]] absl::Status Remove(const std::string& stream);
  // Every call below that takes a node takes a unit or a host: a host's
  // name acts on all of its units (the controller's node is the host).
  //
  // Takes a node out (failure, fence, drain) and moves its streams. A
  // host's plan holds all of its units' moves.
  FailoverPlan FailNode(const std::string& node);
  // The load of `node` (a host's units together) that failing it would
  // leave with nowhere to go: more than the free units of every other
  // host in service. An estimate (stream weights may not pack): 0 when the
  // free units suffice.
  int64_t LoadWithNowhereToGo(const std::string& node) const;
  // Takes several units out at once (a machine's GPUs), so that none of
  // them takes another's streams; one plan per unit that was available.
  std::vector<FailoverPlan> FailNodes(const std::vector<std::string>& nodes);
  // Checks whether taking `node` out now keeps N+k for the admitted load.
  // A host's name checks all of its units.
  [[nodiscard]] absl::Status CanRemoveNode(const std::string& node) const;
  // The units on `host`, in the order they were added; a unit that is its
  // own host gives itself; empty when unknown.
  std::vector<std::string> UnitsOf(const std::string& host) const;
  // Brings a node back as passive (stickiness: nothing moves back to it).
  // `as_passive` false brings an active node back active, as a scheduler
  // without standby roles does (Kubernetes; `gpuha sim`'s scenarios).
  [[nodiscard]] absl::Status RestoreNode(const std::string& node, bool as_passive = true);
  [[nodiscard]] absl::Status SetRole(const std::string& node, Role role);
  // Forgets a node that is out (FailNode) and holds no stream, as primary or
  // standby; FailedPrecondition otherwise. A host's name forgets its units.
  // The last added unit takes the removed one's index.
  [[nodiscard]] absl::Status RemoveNode(const std::string& node);

  CapacityFigures Capacity() const;
  // Units of the available GPU nodes that no placed stream takes: the room a
  // drain can use. O(1). (Unplaced streams take none; Capacity()'s
  // headroom counts them as admitted.)
  int64_t FreeUnits() const { return capacity_sum_ - counted_load_; }
  std::optional<Assignment> Find(const std::string& stream) const;
  // Sorted by stream id.
  std::vector<Assignment> Assignments() const;
  // A host's role is its first unit's; it is available from RestoreNode of
  // its name to FailNode of it, whatever its units are; its load is its
  // units'.
  std::optional<Role> RoleOf(const std::string& node) const;
  bool Available(const std::string& node) const;
  int64_t LoadOf(const std::string& node) const;

 private:
  struct Stream;
  // A failure domain's counted capacity, for the k-largest reserve.
  struct Group {
    int64_t capacity = 0;
    // Its units' indices: when they are one run (a rack's hosts added
    // together), a standby search skips the whole run at once.
    uint32_t lo = UINT32_MAX, hi = 0, units = 0;
    bool run() const { return units > 0 && hi - lo + 1 == units; }
  };
  struct Node;
  struct Host {
    std::vector<Node*> units;
    // The machine is in service (FailNode and RestoreNode of its name); its
    // units may each be out alone meanwhile.
    bool available = true;
  };
  // Nodes and streams live in node-based hash maps, so pointers to them stay
  // valid; the indices below hold pointers and numbers, never copies of ids.
  struct Node {
    NodeSpec spec;
    uint32_t index = 0;  // order of AddNode; breaks ties deterministically
    bool available = true;
    int64_t load = 0;
    Host* host = nullptr;
    Group* group = nullptr;  // its domain, or its host's when it names none
    // Streams this node serves / stands by for; each stream knows its slot,
    // so joining and leaving are O(1) swaps with no allocation.
    std::vector<Stream*> primaries;
    std::vector<Stream*> standbys;
  };
  struct Stream {
    StreamSpec spec;
    Node* primary = nullptr;  // null while the stream fits nowhere
    Node* standby = nullptr;
    size_t primary_slot = 0;
    size_t standby_slot = 0;
  };
  int64_t Free(const Node& n) const { return n.spec.capacity - n.load; }
  bool Counts(const Node& n) const { return n.available && !n.spec.cpu_only; }
  // Capacity the cluster keeps after losing its k largest domains (and
  // `without`'s units).
  int64_t SurvivableUnits(const std::vector<const Node*>& without = {}) const;
  std::set<std::pair<int64_t, uint32_t>>* FreeIndex(const Node& n);
  void IndexFree(Node& n);
  void UnindexFree(Node& n);
  void Count(const Node& n, bool add);
  void ChangeRole(Node& n, Role role);
  void SetPrimary(Stream& s, Node* node);
  void SetStandby(Stream& s, Node* node);
  // Keeps unplaced_ and standbyless_ true after a stream's nodes change.
  void Track(Stream& s);
  // The unit with the most free capacity of at least `weight`; when `away`
  // is set, not in its group (`other_group`) or not on its host.
  Node* PickPrimary(int64_t weight, const Node* away = nullptr, bool other_group = false) const;
  Node* PickStandby(const Stream& s) const;
  // Moves the streams of a unit already taken out of the indices.
  FailoverPlan MoveOff(Node& failed);
  Node* FindNode(const std::string& id);
  const Node* FindNode(const std::string& id) const;
  // The unit `id`, or the units of host `id`; empty when neither.
  std::vector<Node*> Resolve(const std::string& id) const;
  std::vector<FailoverPlan> FailUnits(const std::vector<Node*>& units);
  [[nodiscard]] absl::Status RestoreUnit(Node& n, bool as_passive);
  static Assignment ToAssignment(const Stream& s);
  // Keys of hosts_ and groups_.
  static const std::string& HostKey(const NodeSpec& spec);
  static std::string GroupKey(const NodeSpec& spec);

  const int64_t k_;
  // Hash maps: admission of 100,000 streams must stay under 200 ms.
  std::unordered_map<std::string, Node> nodes_;
  std::unordered_map<std::string, Stream> streams_;
  std::vector<Node*> by_index_;
  // Available active (and buffer) nodes by (free capacity, index), most free last.
  std::set<std::pair<int64_t, uint32_t>> active_free_;
  std::set<std::pair<int64_t, uint32_t>> buffer_free_;
  std::set<uint32_t> passive_ready_;         // available passive nodes, by index
  std::unordered_set<Stream*> unplaced_;     // no primary
  std::unordered_set<Stream*> standbyless_;  // a primary but no standby
  std::unordered_map<std::string, Host> hosts_;
  // Keyed "host:ID" or "domain:LABEL"; the sums of available GPU units.
  std::unordered_map<std::string, Group> groups_;
  std::set<std::pair<int64_t, const Group*>> group_capacities_;  // capacity > 0
  bool by_domain_ = false;
  int64_t capacity_sum_ = 0;
  int64_t counted_load_ = 0;  // stream units placed on the nodes in capacity_sum_
  int64_t admitted_units_ = 0;
};

}  // namespace gpuha::placement
