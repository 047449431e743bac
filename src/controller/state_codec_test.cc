#include "controller/state_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

TEST(StateCodecTest, NodeRoundTripsEveryLifecycle) {
  for (NodeLifecycle l : {NodeLifecycle::kServing, NodeLifecycle::kFenced, NodeLifecycle::kDrained,
                          NodeLifecycle::kHeldOut}) {
    NodeRecord r{Role::kPassive, false, l};
    absl::StatusOr<NodeRecord> back = DecodeNode("n1", EncodeNode(r));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->role, Role::kPassive);
    EXPECT_FALSE(back->available);
    EXPECT_EQ(back->lifecycle, l);
  }
}

TEST(StateCodecTest, NodeRowsKeepTheOldBooleansForARollback) {
  std::string row = EncodeNode({Role::kActive, false, NodeLifecycle::kDrained});
  EXPECT_THAT(row, HasSubstr(R"("drained":true)"));
  EXPECT_THAT(row, HasSubstr(R"("fenced":true)"));
  EXPECT_THAT(row, HasSubstr(R"("held_out":false)"));
  // The binary before 'rejoining' refuses a state it does not know: a
  // rejoining node is written as fenced, and is read back fenced.
  row = EncodeNode({Role::kActive, false, NodeLifecycle::kRejoining});
  EXPECT_THAT(row, HasSubstr(R"("state":"fenced")"));
  EXPECT_EQ(DecodeNode("n1", row)->lifecycle, NodeLifecycle::kFenced);
  // A row that says rejoining (a later binary) is read.
  EXPECT_EQ(
      DecodeNode("n1", R"({"role":"passive","available":false,"state":"rejoining"})")->lifecycle,
      NodeLifecycle::kRejoining);
}

TEST(StateCodecTest, NodeRowsFromBeforeTheEnumAreRead) {
  auto r = DecodeNode("n1", R"({"role":"active","available":false,"fenced":true,"drained":true,)"
                            R"("held_out":false})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lifecycle, NodeLifecycle::kDrained);
  r = DecodeNode("n1", R"({"role":"active","fenced":true,"held_out":true})");
  EXPECT_EQ(r->lifecycle, NodeLifecycle::kHeldOut);
  r = DecodeNode("n1", R"({"role":"buffer"})");
  EXPECT_EQ(r->lifecycle, NodeLifecycle::kServing);
  EXPECT_TRUE(r->available);
}

TEST(StateCodecTest, BadNodeRowsNameTheRowAndField) {
  EXPECT_THAT(DecodeNode("n1", "{").status().message(), HasSubstr("store: node n1 is corrupt"));
  EXPECT_THAT(DecodeNode("n1", R"({"role":"boss"})").status().message(),
              HasSubstr("node n1.role: 'boss' is not a role"));
  EXPECT_THAT(DecodeNode("n1", R"({"role":"active","state":"asleep"})").status().message(),
              HasSubstr("node n1.state: 'asleep'"));
  EXPECT_THAT(DecodeNode("n1", R"({"role":"active","available":"yes"})").status().message(),
              HasSubstr("node n1.available: wrong type"));
}

TEST(StateCodecTest, APlannedRestartsGraceIsKeptAndOldRowsHaveNone) {
  NodeRecord r{Role::kActive, true, NodeLifecycle::kServing};
  r.restart_until_unix_ms = 1'796'000'000'000;
  auto back = DecodeNode("n1", EncodeNode(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->restart_until_unix_ms, 1'796'000'000'000);
  EXPECT_EQ(DecodeNode("n1", R"({"role":"active"})")->restart_until_unix_ms, 0);
  EXPECT_THAT(
      DecodeNode("n1", R"({"role":"active","restart_until_unix_ms":"soon"})").status().message(),
      HasSubstr("node n1.restart_until_unix_ms: wrong type"));
}

TEST(StateCodecTest, RegisteredNodesKeepTheirAddressAndCapacity) {
  NodeRecord r{Role::kPassive, false, NodeLifecycle::kPending,
               RegisteredNode{"10.0.0.3:8000", 12, true, "", {}, "10.0.0.3:8001"}};
  auto back = DecodeNode("g3", EncodeNode(r));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->registered.has_value());
  EXPECT_EQ(back->registered->address, "10.0.0.3:8000");
  EXPECT_EQ(back->registered->capacity, 12);
  EXPECT_EQ(back->registered->grpc_address, "10.0.0.3:8001");
  EXPECT_TRUE(back->registered->cpu_only);
  EXPECT_EQ(back->lifecycle, NodeLifecycle::kPending);
  EXPECT_FALSE(DecodeNode("n1", EncodeNode({Role::kActive, true, NodeLifecycle::kServing}))
                   ->registered.has_value());
  auto bad = DecodeNode(
      "g3", R"({"role":"active","registered":{"address":"10.0.0.3:8000","capacity":0}})");
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("node g3.registered.capacity"));
  bad = DecodeNode("g3", R"({"role":"active","registered":{"address":7,"capacity":1}})");
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("node g3.registered.address"));
  bad = DecodeNode(
      "g3",
      R"({"role":"active","registered":{"address":"10.0.0.3:8000","capacity":1,"grpc_address":"x"}})");
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("node g3.registered.grpc_address: 'x' is not HOST:PORT"));
  bad = DecodeNode("g3", R"({"role":"active","registered":{"address":"nowhere","capacity":1}})");
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("node g3.registered.address: 'nowhere' is not HOST:PORT"));
}

TEST(StateCodecTest, RecentXidsRoundTripAndADamagedOneIsNamed) {
  NodeRecord r{Role::kActive, true, NodeLifecycle::kServing};
  r.xids = {{0, 79, 1.7e12}, {3, 13, 1.7e12 + 5.5}};
  absl::StatusOr<NodeRecord> back = DecodeNode("n1", EncodeNode(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->xids, r.xids);
  EXPECT_EQ(EncodeNode({Role::kActive, true, NodeLifecycle::kServing}).find("xids"),
            std::string::npos);  // none: no field, as rows before it
  for (const char* bad : {R"("xids":5)", R"("xids":[[0,79]])", R"("xids":[[-1,79,1]])",
                          R"("xids":[["0",79,1]])", R"("xids":[[0,79,"t"]])"}) {
    absl::StatusOr<NodeRecord> d =
        DecodeNode("n1", std::string(R"({"role":"active","available":true,)") + bad + "}");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("store: node n1.xids")) << bad;
  }
}

TEST(StateCodecTest, StreamRoundTripsAndBadRowsAreRefused) {
  StreamRecord r{"acme", 3, "n1", "n4"};
  absl::StatusOr<StreamRecord> back = DecodeStream("cam-1", EncodeStream(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tenant, "acme");
  EXPECT_EQ(back->weight, 3);
  EXPECT_EQ(back->primary, "n1");
  EXPECT_EQ(back->standby, "n4");
  EXPECT_THAT(DecodeStream("cam-1", "[]").status().message(), HasSubstr("stream cam-1 is corrupt"));
  EXPECT_THAT(DecodeStream("cam-1", R"({"weight":0})").status().message(),
              HasSubstr("stream cam-1.weight: 0 is below 1"));
  EXPECT_THAT(DecodeStream("cam-1", R"({"weight":"x"})").status().message(),
              HasSubstr("stream cam-1.weight: wrong type"));
}

}  // namespace
}  // namespace gpuha::controller
