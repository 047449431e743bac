#include "placement/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::placement {
namespace {

using ::testing::HasSubstr;

// Seed 002's example: three L4 nodes of 10 streams, N+1, plus a passive.
Placement ThreeActiveOnePassive() {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) EXPECT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  EXPECT_TRUE(p.AddNode({"p1", Role::kPassive, 10}).ok());
  return p;
}

TEST(PlacementTest, PrimariesSpreadLeastLoadedFirstAndStandbyIsThePassive) {
  Placement p = ThreeActiveOnePassive();
  std::map<std::string, int> per_node;
  for (int i = 0; i < 9; ++i) {
    auto a = p.Admit({"cam-" + std::to_string(i), "acme", 1});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->standby, "p1");
    per_node[a->primary]++;
  }
  EXPECT_EQ(per_node, (std::map<std::string, int>{{"a1", 3}, {"a2", 3}, {"a3", 3}}));
}

TEST(PlacementTest, AdmissionRefusesTheStreamThatBreaksNPlusOne) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  auto refused = p.Admit({"s20", "t", 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("20 admitted + 1 > 20 survivable (30 total - 10 reserve"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no HA exists"));
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 30);
  EXPECT_EQ(c.max_production_units, 20);
  EXPECT_EQ(c.headroom_units, 0);
}

TEST(PlacementTest, NPlusTwoReservesTheTwoLargestNodes) {
  Placement p(2);
  ASSERT_TRUE(p.AddNode({"big", Role::kActive, 20}).ok());
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 50);
  EXPECT_EQ(c.reserve_units, 30);
  EXPECT_EQ(c.max_production_units, 20);
}

TEST(PlacementTest, CpuBufferIsDegradedCapacityOutsideTheSums) {
  Placement p(1);
  ASSERT_TRUE(p.AddNode({"a1", Role::kActive, 10}).ok());
  ASSERT_TRUE(p.AddNode({"a2", Role::kActive, 10}).ok());
  ASSERT_TRUE(p.AddNode({"cpu", Role::kBuffer, 4, /*cpu_only=*/true}).ok());
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 20);
  EXPECT_EQ(c.degraded_units, 4);
}

TEST(PlacementTest, FailedNodeMovesOneToOneToThePassive) {
  Placement p = ThreeActiveOnePassive();
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  int64_t a1_load = p.LoadOf("a1");
  FailoverPlan plan = p.FailNode("a1");
  EXPECT_EQ(plan.promoted, "p1");
  EXPECT_EQ(static_cast<int64_t>(plan.moved.size()), a1_load);
  for (const Assignment& a : plan.moved) {
    EXPECT_EQ(a.primary, "p1");
    EXPECT_NE(a.standby, "a1");
    EXPECT_FALSE(a.standby.empty());
  }
  EXPECT_TRUE(plan.unplaced.empty());
  EXPECT_EQ(p.RoleOf("p1"), Role::kActive);
  // Every other stream lost its standby (p1 is serving now) and got a new one.
  EXPECT_EQ(plan.restandbyed.size(), 9u - plan.moved.size());
  for (const Assignment& a : p.Assignments()) {
    EXPECT_NE(a.standby, a.primary);
    EXPECT_NE(a.standby, "a1");
    EXPECT_FALSE(a.standby.empty());
  }
}

TEST(PlacementTest, WithoutAPassiveStreamsGoToTheirStandbys) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  std::map<std::string, std::string> standby_before;
  for (const Assignment& a : p.Assignments()) standby_before[a.stream] = a.standby;
  FailoverPlan plan = p.FailNode("a2");
  EXPECT_TRUE(plan.promoted.empty());
  ASSERT_EQ(plan.moved.size(), 4u);
  for (const Assignment& a : plan.moved) EXPECT_EQ(a.primary, standby_before[a.stream]);
  EXPECT_EQ(p.LoadOf("a1") + p.LoadOf("a3"), 12);
}

TEST(PlacementTest, TwoFailuresInNPlusOneReportTheOverflow) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  EXPECT_TRUE(p.FailNode("a1").unplaced.empty());
  FailoverPlan second = p.FailNode("a2");
  EXPECT_EQ(second.unplaced.size(), 10u);  // 20 streams, one node of 10 left
  EXPECT_EQ(p.Capacity().unplaced_streams, 10);
  for (const std::string& s : second.unplaced) EXPECT_EQ(p.Find(s)->primary, "");
}

TEST(PlacementTest, RecoveredNodeRejoinsAsPassiveAndNothingFlapsBack) {
  Placement p = ThreeActiveOnePassive();
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  p.FailNode("a1");
  auto before = p.Assignments();
  ASSERT_TRUE(p.RestoreNode("a1").ok());
  EXPECT_EQ(p.RoleOf("a1"), Role::kPassive);
  for (const Assignment& a : p.Assignments()) EXPECT_NE(a.primary, "a1");
  auto after = p.Assignments();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i].primary, before[i].primary);
}

// Regression: after a failed node rejoined as passive, streams kept the
// standbys they got on active nodes while the passive was serving.
TEST(PlacementTest, RejoinedPassiveBecomesTheStandbyAgain) {
  Placement p = ThreeActiveOnePassive();
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  p.FailNode("a1");  // p1 becomes active; every standby is now an active node
  for (const Assignment& a : p.Assignments()) EXPECT_NE(a.standby, "a1");
  ASSERT_TRUE(p.RestoreNode("a1").ok());
  ASSERT_EQ(p.RoleOf("a1"), Role::kPassive);
  for (const Assignment& a : p.Assignments()) {
    EXPECT_EQ(a.standby, "a1") << a.stream;
    EXPECT_NE(a.primary, "a1") << a.stream;
  }
  // And the next failure moves a node's streams 1:1 onto it.
  FailoverPlan plan = p.FailNode("a2");
  EXPECT_EQ(plan.promoted, "a1");
  for (const Assignment& a : plan.moved) EXPECT_EQ(a.primary, "a1");
}

TEST(PlacementTest, RestoreCarriesStreamsThatHadNowhereToGo) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  p.FailNode("a1");
  p.FailNode("a2");
  ASSERT_TRUE(p.RestoreNode("a2").ok());
  EXPECT_EQ(p.Capacity().unplaced_streams, 0);
}

TEST(PlacementTest, DrainIsRefusedWhenItBreaksNPlusK) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 11; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  absl::Status s = p.CanRemoveNode("a1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("11 admitted > 10 survivable without it"));
  ASSERT_TRUE(p.Remove("s0").ok());
  EXPECT_TRUE(p.CanRemoveNode("a1").ok());
}

TEST(PlacementTest, BadInputIsRefusedCleanly) {
  Placement p = ThreeActiveOnePassive();
  EXPECT_EQ(p.AddNode({"a1", Role::kActive, 10}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(p.AddNode({"", Role::kActive, 10}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Admit({"s", "t", 0}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.Admit({"s", "t", 1}).ok());
  EXPECT_EQ(p.Admit({"s", "t", 1}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(p.Remove("nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.CanRemoveNode("nope").code(), absl::StatusCode::kNotFound);
  auto s = p.Find("s");
  EXPECT_EQ(p.SetRole(s->primary, Role::kPassive).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(p.SetRole("p1", Role::kBuffer).ok());
}

// FreeUnits is the room a drain can use: placed streams take it, unplaced
// ones do not, and a failed node's capacity is not counted.
TEST(PlacementTest, FreeUnitsCountsOnlyPlacedStreamsOnAvailableNodes) {
  Placement p(1);
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 1}).ok());
  ASSERT_TRUE(p.Admit({"s1", "t", 1}).ok());
  ASSERT_TRUE(p.Admit({"s2", "t", 1}).ok());
  EXPECT_EQ(p.FreeUnits(), 1);
  std::string first = p.Find("s1")->primary;
  FailoverPlan one = p.FailNode(first);
  EXPECT_EQ(one.moved.size(), 1u);
  EXPECT_EQ(p.FreeUnits(), 0);
  std::string second = p.Find("s2")->primary;
  FailoverPlan two = p.FailNode(second);
  EXPECT_EQ(two.unplaced.size(), 1u);
  EXPECT_EQ(p.FreeUnits(), 0);  // not -1: the unplaced stream takes no unit
  EXPECT_EQ(p.Capacity().unplaced_streams, 1);
  ASSERT_TRUE(p.RestoreNode(first).ok());  // takes the waiting stream
  EXPECT_EQ(p.Capacity().unplaced_streams, 0);
  EXPECT_EQ(p.FreeUnits(), 0);
  ASSERT_TRUE(p.RestoreNode(second).ok());
  EXPECT_EQ(p.FreeUnits(), 1);
  ASSERT_TRUE(p.Remove("s1").ok());
  EXPECT_EQ(p.FreeUnits(), 2);
}

// A node brought back active (a scheduler without standby roles) serves at
// once and does not become every stream's standby.
TEST(PlacementTest, RestoreAsActiveKeepsTheRole) {
  Placement p(1);
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 2}).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  (void)p.FailNode("a");
  ASSERT_TRUE(p.RestoreNode("a", /*as_passive=*/false).ok());
  EXPECT_EQ(p.RoleOf("a"), Role::kActive);
  EXPECT_EQ(p.FreeUnits(), 2);
  FailoverPlan b = p.FailNode("b");  // b and c are full: only a has room
  EXPECT_TRUE(b.unplaced.empty());
  ASSERT_FALSE(b.moved.empty());
  for (const Assignment& m : b.moved) EXPECT_EQ(m.primary, "a");
  ASSERT_TRUE(p.RestoreNode("b").ok());
  EXPECT_EQ(p.RoleOf("b"), Role::kPassive);
}

// Issue 16: a machine of 4 GPUs is 4 units on one host.
Placement GpuHosts(int64_t k, const std::vector<std::pair<std::string, std::string>>& hosts,
                   int gpus = 4, int64_t per_gpu = 2) {
  Placement p(k);
  for (const auto& [host, domain] : hosts) {
    for (int g = 0; g < gpus; ++g) {
      EXPECT_TRUE(p.AddNode({host + "/gpu" + std::to_string(g), Role::kActive, per_gpu, false, host,
                             domain})
                      .ok());
    }
  }
  return p;
}

std::string HostOf(const std::string& unit) { return unit.substr(0, unit.find('/')); }

TEST(PlacementTest, GpuUnitsReserveTheLargestHostAndStandByOnAnotherHost) {
  Placement p = GpuHosts(1, {{"n1", ""}, {"n2", ""}, {"n3", ""}});
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 24);
  EXPECT_EQ(c.reserve_units, 8);  // one host's four GPUs, not one GPU
  EXPECT_FALSE(c.reserve_by_domain);
  for (int i = 0; i < 16; ++i) {
    auto a = p.Admit({"s" + std::to_string(i), "t", 1});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_NE(HostOf(a->primary), HostOf(a->standby)) << a->primary << " " << a->standby;
  }
  auto refused = p.Admit({"s16", "t", 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("largest node(s)"));
  // At the N+1 limit even one GPU out breaks it: 22 left, 8 reserved.
  absl::Status gpu = p.CanRemoveNode("n1/gpu0");
  EXPECT_THAT(std::string(gpu.message()), HasSubstr("16 admitted > 14 survivable"));
  absl::Status host = p.CanRemoveNode("n1");
  EXPECT_FALSE(host.ok());
  EXPECT_THAT(std::string(host.message()),
              HasSubstr("taking n1 out would break N+1: 16 admitted > 8"));
  EXPECT_EQ(p.CanRemoveNode("n9").code(), absl::StatusCode::kNotFound);
}

TEST(PlacementTest, OneGpuFailureMovesThatGpusStreamsOnly) {
  Placement p = GpuHosts(1, {{"n1", ""}, {"n2", ""}, {"n3", ""}});
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  std::map<std::string, std::string> before;
  for (const Assignment& a : p.Assignments()) before[a.stream] = a.primary;
  int64_t on_gpu = p.LoadOf("n1/gpu0");
  ASSERT_GT(on_gpu, 0);
  FailoverPlan plan = p.FailNode("n1/gpu0");
  EXPECT_EQ(static_cast<int64_t>(plan.moved.size()), on_gpu);
  EXPECT_TRUE(plan.unplaced.empty());
  for (const Assignment& m : plan.moved) {
    EXPECT_EQ(before[m.stream], "n1/gpu0");
    EXPECT_NE(m.primary, "n1/gpu0");
  }
  for (const Assignment& a : p.Assignments()) {
    if (before[a.stream] != "n1/gpu0") {
      EXPECT_EQ(a.primary, before[a.stream]) << a.stream;
    }
    EXPECT_NE(HostOf(a.primary), HostOf(a.standby)) << a.stream;
    EXPECT_NE(a.standby, "n1/gpu0");
  }
  // The other three GPUs of n1 still serve, and count.
  EXPECT_TRUE(p.Available("n1/gpu1"));
  EXPECT_EQ(p.Capacity().total_units, 22);
}

TEST(PlacementTest, FailingAHostMovesNothingOntoItsOtherGpus) {
  Placement p = GpuHosts(1, {{"n1", ""}, {"n2", ""}, {"n3", ""}});
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  EXPECT_EQ(p.UnitsOf("n1"),
            (std::vector<std::string>{"n1/gpu0", "n1/gpu1", "n1/gpu2", "n1/gpu3"}));
  EXPECT_EQ(p.UnitsOf("n1/gpu0"), std::vector<std::string>{});
  std::vector<FailoverPlan> plans = p.FailNodes(p.UnitsOf("n1"));
  ASSERT_EQ(plans.size(), 4u);
  size_t moved = 0;
  for (const FailoverPlan& plan : plans) {
    EXPECT_TRUE(plan.unplaced.empty());
    moved += plan.moved.size();
  }
  EXPECT_EQ(moved, 4u);  // 12 streams spread over 12 GPUs
  for (const Assignment& a : p.Assignments()) {
    EXPECT_NE(HostOf(a.primary), "n1") << a.stream;
    EXPECT_NE(HostOf(a.standby), "n1") << a.stream;
    EXPECT_NE(HostOf(a.primary), HostOf(a.standby)) << a.stream;
  }
  EXPECT_TRUE(p.FailNodes(p.UnitsOf("n1")).empty());  // already out
}

TEST(PlacementTest, FailureDomainsHoldTheStandbyAndTheReserve) {
  // Rack a holds two hosts, rack b one, rack c one: N+1 reserves rack a.
  Placement p =
      GpuHosts(1, {{"a1", "rack-a"}, {"a2", "rack-a"}, {"b1", "rack-b"}, {"c1", "rack-c"}});
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 32);
  EXPECT_EQ(c.reserve_units, 16);
  EXPECT_TRUE(c.reserve_by_domain);
  std::map<std::string, std::string> rack = {{"a1", "a"}, {"a2", "a"}, {"b1", "b"}, {"c1", "c"}};
  for (int i = 0; i < 16; ++i) {
    auto a = p.Admit({"s" + std::to_string(i), "t", 1});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_NE(rack[HostOf(a->primary)], rack[HostOf(a->standby)])
        << a->primary << " " << a->standby;
  }
  auto refused = p.Admit({"s16", "t", 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("largest failure domain(s)"));
  // The rack's loss is survivable: both its hosts at once.
  std::vector<std::string> rack_a = p.UnitsOf("a1");
  for (const std::string& u : p.UnitsOf("a2")) rack_a.push_back(u);
  for (const FailoverPlan& plan : p.FailNodes(rack_a)) EXPECT_TRUE(plan.unplaced.empty());
  EXPECT_EQ(p.Capacity().unplaced_streams, 0);
}

TEST(PlacementTest, ADomainWithoutRoomElsewhereStillGetsAStandbyOnAnotherHost) {
  Placement p = GpuHosts(0, {{"a1", "rack-a"}, {"a2", "rack-a"}}, 1, 4);  // one rack: no N+1
  auto a = p.Admit({"s0", "t", 1});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(HostOf(a->primary), HostOf(a->standby));
  EXPECT_FALSE(a->standby.empty());
}

TEST(PlacementTest, AHostsNameActsOnAllItsGpus) {
  Placement p = GpuHosts(1, {{"n1", ""}, {"n2", ""}, {"n3", ""}});
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  const int64_t load = p.LoadOf("n1");
  EXPECT_EQ(load,
            p.LoadOf("n1/gpu0") + p.LoadOf("n1/gpu1") + p.LoadOf("n1/gpu2") + p.LoadOf("n1/gpu3"));
  const int64_t on_gpu1 = p.LoadOf("n1/gpu1");
  (void)p.FailNode("n1/gpu1");
  EXPECT_TRUE(p.Available("n1"));  // three GPUs still serve
  EXPECT_EQ(p.LoadOf("n1"), load - on_gpu1);
  (void)p.FailNodes({"n2/gpu0", "n2/gpu1", "n2/gpu2", "n2/gpu3"});
  EXPECT_TRUE(p.Available("n2"));  // the machine is in service, its GPUs out
  EXPECT_TRUE(p.FailNode("n2").moved.empty());
  EXPECT_FALSE(p.Available("n2"));
  const int64_t left = p.LoadOf("n1");
  FailoverPlan plan = p.FailNode("n1");  // the three left
  EXPECT_EQ(plan.failed, "n1");
  EXPECT_EQ(static_cast<int64_t>(plan.moved.size()), left);
  EXPECT_TRUE(plan.unplaced.empty());
  EXPECT_FALSE(p.Available("n1"));
  EXPECT_EQ(p.LoadOf("n1"), 0);
  ASSERT_TRUE(p.RestoreNode("n1").ok());  // every GPU, as passive
  for (const std::string& u : p.UnitsOf("n1")) {
    EXPECT_TRUE(p.Available(u)) << u;
    EXPECT_EQ(p.RoleOf(u), Role::kPassive) << u;
  }
  EXPECT_EQ(p.RoleOf("n1"), Role::kPassive);
  ASSERT_TRUE(p.SetRole("n1", Role::kActive).ok());
  EXPECT_EQ(p.RoleOf("n1/gpu3"), Role::kActive);
  absl::Status busy = p.SetRole("n3", Role::kPassive);
  EXPECT_THAT(std::string(busy.message()), HasSubstr("node n3 still serves"));
  EXPECT_EQ(p.RoleOf("n3/gpu0"), Role::kActive);  // all or nothing
  EXPECT_EQ(p.RestoreNode("n9").code(), absl::StatusCode::kNotFound);
}

// Racks whose hosts were added interleaved (no run of indices) still get
// every standby in the other rack.
TEST(PlacementTest, InterleavedDomainsStillStandByInAnotherDomain) {
  Placement p =
      GpuHosts(1, {{"h0", "rack-a"}, {"h1", "rack-b"}, {"h2", "rack-a"}, {"h3", "rack-b"}}, 2, 4);
  std::map<std::string, std::string> rack = {{"h0", "a"}, {"h1", "b"}, {"h2", "a"}, {"h3", "b"}};
  for (int i = 0; i < 16; ++i) {
    auto a = p.Admit({"s" + std::to_string(i), "t", 1});
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_NE(rack[HostOf(a->primary)], rack[HostOf(a->standby)])
        << a->primary << " " << a->standby;
  }
}

// Draining a node already out (fenced) takes nothing more away: allowed
// even when the cluster is past N+k.
TEST(PlacementTest, ANodeAlreadyOutCanAlwaysBeRemoved) {
  Placement p(1);
  for (const char* n : {"a1", "a2", "a3"}) ASSERT_TRUE(p.AddNode({n, Role::kActive, 10}).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  (void)p.FailNode("a1");
  EXPECT_FALSE(p.CanRemoveNode("a2").ok());  // past N+1 now
  EXPECT_TRUE(p.CanRemoveNode("a1").ok());
}

TEST(PlacementTest, ANodeOutWithNoStreamIsForgottenAndTheRestPlaceAsBefore) {
  Placement p = GpuHosts(1, {{"n1", ""}, {"n2", ""}, {"n3", ""}, {"n4", ""}});
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(p.Admit({"s" + std::to_string(i), "t", 1}).ok());
  EXPECT_EQ(p.RemoveNode("n9").code(), absl::StatusCode::kNotFound);
  absl::Status serving = p.RemoveNode("n2");
  EXPECT_EQ(serving.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(serving.message()), HasSubstr("in service"));
  // Out, its streams moved: the whole host is forgotten, every GPU of it.
  (void)p.FailNode("n2");
  ASSERT_TRUE(p.RemoveNode("n2").ok());
  EXPECT_TRUE(p.UnitsOf("n2").empty());
  EXPECT_FALSE(p.RoleOf("n2/gpu0").has_value());
  EXPECT_EQ(p.RemoveNode("n2").code(), absl::StatusCode::kNotFound);
  CapacityFigures c = p.Capacity();
  EXPECT_EQ(c.total_units, 24);
  EXPECT_EQ(c.reserve_units, 8);
  // The units that took the removed ones' indices still place, and every
  // standby is still on another host.
  for (int i = 8; i < 16; ++i) {
    auto a = p.Admit({"s" + std::to_string(i), "t", 1});
    ASSERT_TRUE(a.ok()) << a.status();
  }
  for (const Assignment& a : p.Assignments()) {
    ASSERT_FALSE(a.primary.empty()) << a.stream;
    EXPECT_NE(HostOf(a.primary), HostOf(a.standby)) << a.stream;
    EXPECT_NE(HostOf(a.primary), "n2") << a.stream;
  }
  // A name can be added again once it is forgotten.
  EXPECT_TRUE(p.AddNode({"n2/gpu0", Role::kActive, 2, false, "n2"}).ok());
}

TEST(PlacementTest, ANodeAddedOutIsForgottenAndOneInServiceIsNot) {
  Placement p(0);
  ASSERT_TRUE(p.AddNode({"a1", Role::kActive, 10}).ok());
  ASSERT_TRUE(p.AddNode({"p1", Role::kPassive, 10}).ok());
  ASSERT_TRUE(p.AddNode({"x", Role::kActive, 0}, /*available=*/false).ok());
  ASSERT_TRUE(p.Admit({"s", "t", 1}).ok());
  EXPECT_TRUE(p.RemoveNode("x").ok());  // out and empty from the start
  EXPECT_EQ(p.RemoveNode("a1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.RemoveNode("p1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.Find("s")->standby, "p1");
}

}  // namespace
}  // namespace gpuha::placement
