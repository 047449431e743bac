#include "controller/quarantine.h"

#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

TEST(QuarantineTest, OneMoreGoesOutOnlyWithinTheShare) {
  // Half of 10: the fifth may go out, not the sixth.
  EXPECT_TRUE(QuarantineAllows(0.5, 4, 10));
  EXPECT_FALSE(QuarantineAllows(0.5, 5, 10));
  // A share that is a whole count in decimals is one in binary too.
  EXPECT_TRUE(QuarantineAllows(0.3, 2, 10));
  EXPECT_FALSE(QuarantineAllows(0.3, 3, 10));
}

TEST(QuarantineTest, TheFirstOutIsAlwaysAllowedAndOneMeansNoBreaker) {
  EXPECT_TRUE(QuarantineAllows(0.5, 0, 1));  // a one-node cluster still acts
  EXPECT_TRUE(QuarantineAllows(0.1, 0, 3));
  EXPECT_FALSE(QuarantineAllows(0.1, 1, 3));
  EXPECT_TRUE(QuarantineAllows(1, 99, 100));
  EXPECT_TRUE(QuarantineAllows(0.5, 0, 0));  // nothing joined yet
}

}  // namespace
}  // namespace gpuha::controller
