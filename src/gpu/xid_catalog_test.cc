#include "gpu/xid_catalog.h"

#include <gtest/gtest.h>

#include <set>

namespace gpuha::gpu {
namespace {

TEST(XidCatalogTest, IssueXidsHaveTheirConsequences) {
  EXPECT_EQ(ConsequenceOf(79), XidConsequence::kFailAndFence);  // fallen off the bus
  EXPECT_EQ(ConsequenceOf(48), XidConsequence::kFailAndFence);  // double-bit ECC
  EXPECT_EQ(ConsequenceOf(63), XidConsequence::kDrain);         // row remapping recorded
  EXPECT_EQ(ConsequenceOf(64), XidConsequence::kDrain);
  EXPECT_EQ(ConsequenceOf(94), XidConsequence::kDrain);          // contained ECC
  EXPECT_EQ(ConsequenceOf(95), XidConsequence::kFailAndFence);   // uncontained ECC
  EXPECT_EQ(ConsequenceOf(119), XidConsequence::kFailAndFence);  // GSP RPC timeout
  EXPECT_EQ(ConsequenceOf(120), XidConsequence::kFailAndFence);
  EXPECT_EQ(ConsequenceOf(43), XidConsequence::kIgnore);
  EXPECT_EQ(ConsequenceOf(13), XidConsequence::kAlert);
}

TEST(XidCatalogTest, UnknownXidIsAnAlertNotAFailover) {
  EXPECT_EQ(FindXid(4242), nullptr);
  EXPECT_EQ(ConsequenceOf(4242), XidConsequence::kAlert);
}

TEST(XidCatalogTest, EntriesAreUniqueAndDescribed) {
  std::set<uint32_t> seen;
  for (const XidInfo& x : XidCatalog()) {
    EXPECT_TRUE(seen.insert(x.xid).second) << "duplicate XID " << x.xid;
    EXPECT_FALSE(x.meaning.empty());
    EXPECT_EQ(FindXid(x.xid), &x);
  }
  EXPECT_EQ(XidConsequenceName(XidConsequence::kFailAndFence), "fail-and-fence");
}

}  // namespace
}  // namespace gpuha::gpu
