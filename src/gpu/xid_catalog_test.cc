#include "gpu/xid_catalog.h"

#include <gtest/gtest.h>

#include <set>

namespace gpuha::gpu {
namespace {

TEST(XidCatalogTest, ConsequencesFollowNvidiasBuckets) {
  EXPECT_EQ(ConsequenceOf(79), XidConsequence::kFailAndFence);   // fallen off the bus: RESTART_BM
  EXPECT_EQ(ConsequenceOf(48), XidConsequence::kFailAndFence);   // double-bit ECC
  EXPECT_EQ(ConsequenceOf(95), XidConsequence::kFailAndFence);   // uncontained ECC: RESET_GPU
  EXPECT_EQ(ConsequenceOf(64), XidConsequence::kFailAndFence);   // row remap failed: RESET_GPU
  EXPECT_EQ(ConsequenceOf(109), XidConsequence::kFailAndFence);  // was only an alert
  // Too strong before: NVIDIA keeps these serving.
  EXPECT_EQ(ConsequenceOf(8), XidConsequence::kAlert);    // RESTART_APP
  EXPECT_EQ(ConsequenceOf(38), XidConsequence::kIgnore);  // IGNORE
  EXPECT_EQ(ConsequenceOf(63), XidConsequence::kIgnore);  // row remap pending: IGNORE
  EXPECT_EQ(ConsequenceOf(94), XidConsequence::kAlert);   // contained ECC: RESTART_APP
  // Missing before (each only alerted): RESET_GPU, and the NVLink5 workflow.
  for (uint32_t x : {110u, 136u, 143u, 46u, 155u, 156u, 158u}) {
    EXPECT_EQ(ConsequenceOf(x), XidConsequence::kFailAndFence) << x;
    EXPECT_EQ(FindXid(x)->nvidia_action, "RESET_GPU") << x;
  }
  for (uint32_t x = 144; x <= 150; ++x) EXPECT_EQ(ConsequenceOf(x), XidConsequence::kDrain) << x;
  EXPECT_EQ(ConsequenceOf(43), XidConsequence::kIgnore);
  EXPECT_EQ(ConsequenceOf(13), XidConsequence::kAlert);
}

TEST(XidCatalogTest, AnUnknownXidDrains) {
  EXPECT_EQ(FindXid(4242), nullptr);
  EXPECT_EQ(ConsequenceOf(4242), XidConsequence::kDrain);
}

TEST(XidCatalogTest, EntriesAreUniqueAndDescribed) {
  std::set<uint32_t> seen;
  for (const XidInfo& x : XidCatalog()) {
    EXPECT_TRUE(seen.insert(x.xid).second) << "duplicate XID " << x.xid;
    EXPECT_FALSE(x.meaning.empty());
    // Every bucket is one of the catalog's (162 has none there).
    EXPECT_TRUE(x.nvidia_action.empty() || x.nvidia_action == "RESTART_APP" ||
                x.nvidia_action == "RESET_GPU" || x.nvidia_action == "RESTART_BM" ||
                x.nvidia_action == "IGNORE" || x.nvidia_action == "CONTACT_SUPPORT" ||
                x.nvidia_action == "XID_154" || x.nvidia_action.substr(0, 9) == "WORKFLOW_")
        << x.xid;
    EXPECT_EQ(FindXid(x.xid), &x);
  }
  EXPECT_EQ(XidConsequenceName(XidConsequence::kFailAndFence), "fail-and-fence");
}

}  // namespace
}  // namespace gpuha::gpu
