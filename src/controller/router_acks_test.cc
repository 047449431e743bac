#include "controller/router_acks.h"

#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

TEST(RouterAcksTest, EveryRouterHoldingTheNewestVersionIsSaidOnce) {
  RouterAcks acks;
  EXPECT_FALSE(acks.Ack("r2", 6, 7));
  EXPECT_FALSE(acks.Ack("r1", 7, 7));  // r2 still holds 6
  EXPECT_TRUE(acks.Ack("r2", 7, 7));
  EXPECT_FALSE(acks.Ack("r2", 7, 7));  // said already
  EXPECT_FALSE(acks.Ack("r1", 7, 7));
  EXPECT_EQ(acks.held().size(), 2u);
  EXPECT_EQ(acks.held().at("r1"), 7u);
  // A lone router holding the newest is every router holding it.
  RouterAcks lone;
  EXPECT_TRUE(lone.Ack("r1", 1, 1));
}

TEST(RouterAcksTest, ARouterThatLeftHoldsNothing) {
  RouterAcks acks;
  EXPECT_FALSE(acks.Ack("r1", 3, 4));
  EXPECT_FALSE(acks.Ack("r2", 4, 4));  // r1 lags
  acks.Gone("r1");
  EXPECT_TRUE(acks.Ack("r2", 4, 4));  // r2 alone holds 4 now
  EXPECT_EQ(acks.held().count("r1"), 0u);
}

TEST(RouterAcksTest, AnAckOfAnOlderVersionSaysNothing) {
  RouterAcks acks;
  EXPECT_FALSE(acks.Ack("r1", 4, 5));
  EXPECT_TRUE(acks.Ack("r1", 5, 5));
  EXPECT_FALSE(acks.Ack("r1", 5, 6));  // the controller moved on
  EXPECT_TRUE(acks.Ack("r1", 6, 6));
}

}  // namespace
}  // namespace gpuha::controller
