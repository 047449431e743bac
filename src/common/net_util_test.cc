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

}  // namespace
}  // namespace gpuha::common
