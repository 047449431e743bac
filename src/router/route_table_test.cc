#include "router/route_table.h"

#include <gtest/gtest.h>

namespace gpuha::router {
namespace {

TEST(RouteTableTest, FromSnapshotIndexesStreamsTenantsAndUpstreams) {
  v1::RouteSnapshot s;
  s.set_version(7);
  s.set_epoch(3);
  auto add = [&](const char* id, const char* tenant, const char* p, const char* sb) {
    v1::Route* r = s.add_routes();
    r->set_stream(id);
    r->set_tenant(tenant);
    if (*p) {
      r->mutable_primary()->set_node(std::string("n-") + p);
      r->mutable_primary()->set_address(p);
    }
    if (*sb) {
      r->mutable_standby()->set_node(std::string("n-") + sb);
      r->mutable_standby()->set_address(sb);
    }
  };
  add("a", "t1", "127.0.0.1:1", "127.0.0.1:3");
  add("b", "t1", "127.0.0.1:1", "127.0.0.1:3");
  add("c", "t2", "127.0.0.1:2", "127.0.0.1:3");
  add("d", "t2", "", "");
  auto t = RouteTable::FromSnapshot(s);
  EXPECT_EQ(t->version(), 7u);
  EXPECT_EQ(t->epoch(), 3u);
  ASSERT_NE(t->Find("a"), nullptr);
  EXPECT_EQ(t->Find("a")->primary.node, "n-127.0.0.1:1");
  EXPECT_TRUE(t->Find("d")->primary.empty());
  EXPECT_EQ(t->Find("zz"), nullptr);
  EXPECT_EQ(t->upstreams().size(), 3u);
}

TEST(RouteTableTest, FromStatic) {
  auto t = RouteTable::FromStatic({{"s", "", "127.0.0.1:1", ""}});
  EXPECT_EQ(t->version(), 1u);
  EXPECT_TRUE(t->Find("s")->standby.empty());
  EXPECT_EQ(t->upstreams().size(), 1u);
}

}  // namespace
}  // namespace gpuha::router
