#include "common/net_util.h"

#include <gtest/gtest.h>

namespace gpuha::common {
namespace {

TEST(KeepAliveTimeoutTest, ReadsTheTimeoutParameterAmongOthers) {
  EXPECT_EQ(KeepAliveTimeout("timeout=5"), 5);
  EXPECT_EQ(KeepAliveTimeout("timeout=5, max=100"), 5);
  EXPECT_EQ(KeepAliveTimeout("max=100,  Timeout=75 "), 75);
  EXPECT_EQ(KeepAliveTimeout("timeout=0"), 0);
}

TEST(KeepAliveTimeoutTest, AbsentOrMalformedIsNothing) {
  EXPECT_EQ(KeepAliveTimeout(""), std::nullopt);
  EXPECT_EQ(KeepAliveTimeout("max=100"), std::nullopt);
  EXPECT_EQ(KeepAliveTimeout("timeout="), std::nullopt);
  EXPECT_EQ(KeepAliveTimeout("timeout=5s"), std::nullopt);
  EXPECT_EQ(KeepAliveTimeout("timeout=-1"), std::nullopt);
  EXPECT_EQ(KeepAliveTimeout("timeout=99999999999"), std::nullopt);  // no overflow
}

// The controller binds a registered node to its agent's IP, read from the
// gRPC peer string of the agent's stream.
TEST(GrpcPeerIpTest, TheIpOfEachFormAndNothingElse) {
  EXPECT_EQ(GrpcPeerIp("ipv4:10.0.0.7:51234"), "10.0.0.7");
  EXPECT_EQ(GrpcPeerIp("ipv6:[fd00::7]:51234"), "fd00::7");
  EXPECT_EQ(GrpcPeerIp("ipv6:%5B::1%5D:51234"), "::1");
  EXPECT_EQ(GrpcPeerIp("unix:/run/gpuha.sock"), "");
  EXPECT_EQ(GrpcPeerIp("ipv4:not-an-ip:1"), "");
  EXPECT_EQ(GrpcPeerIp("ipv6:[fd00::7"), "");
  EXPECT_EQ(GrpcPeerIp(""), "");
  EXPECT_TRUE(IsIpAddress("10.0.0.7"));
  EXPECT_TRUE(IsIpAddress("::1"));
  EXPECT_FALSE(IsIpAddress("localhost"));
  EXPECT_FALSE(IsIpAddress("10.0.0.7:80"));
}

}  // namespace
}  // namespace gpuha::common
