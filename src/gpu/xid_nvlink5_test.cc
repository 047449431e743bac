#include "gpu/xid_nvlink5.h"

#include <gtest/gtest.h>

namespace gpuha::gpu {
namespace {

// Issue 39: XIDs 144-150 are decoded by sub-error, from IGNORE to
// RESET_GPU, the sub-error in IntrInfo bits 9:5 before R575 and 6:0 from it.
TEST(Nvlink5Test, SubErrorsDecodeToTheirCatalogActions) {
  // R575 and later: 0x04082907's bits 6:0 are 7, RLW_SRC_TRACK; its Error
  // Status 0x8 is lost packets, whose action the XID 154 beside it says.
  auto d = DecodeNvlink5(145, 0x04082907, 0x00000008, 580);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->subcode, "RLW_SRC_TRACK");
  EXPECT_EQ(d->action, "XID_154_EVAL");
  // The same registers read the old way (bits 9:5 and the unit in 4:0)
  // match nothing.
  EXPECT_FALSE(DecodeNvlink5(145, 0x04082907, 0x00000008, 560).has_value());
  // Before R575: bits 9:5 are 4 (RLW_REMAP), Error Status 0x40: a reset.
  d = DecodeNvlink5(145, 0x00000082, 0x00000040, 560);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->subcode, "RLW_REMAP");
  EXPECT_EQ(d->action, "RESET_GPU");
  EXPECT_EQ(DecodeNvlink5(145, 0x00000082, 0x00000100, 560)->action, "IGNORE");
  // 144 SAW_MVB: 0x1 is ignored, 0x2 resets.
  EXPECT_EQ(DecodeNvlink5(144, 0x00000001, 0x00000001, 580)->action, "IGNORE");
  EXPECT_EQ(DecodeNvlink5(144, 0x00000001, 0x00000002, 580)->action, "RESET_GPU");
}

// XID 149's link-down reason (IntrInfo bits 25:20): most reset the GPU,
// reasons 38 and 40 are ignored.
TEST(Nvlink5Test, LinkDownReasonsDecide149) {
  const uint32_t link_down_v1 = 0x1c6;  // bits 9:5 = 14 (NETIR_LINK_EVT), 4:0 = 6 (NETIR)
  auto d = DecodeNvlink5(149, 0x025525c6, 0, 560);  // reason 37: the peer
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->subcode, "NETIR_LINK_EVT/NETIR_LINK_DOWN");
  EXPECT_EQ(d->action, "RESET_GPU");
  EXPECT_EQ(DecodeNvlink5(149, (38u << 20) | link_down_v1, 0, 560)->action, "IGNORE");
  EXPECT_EQ(DecodeNvlink5(149, (40u << 20) | link_down_v1, 0, 560)->action, "IGNORE");
  EXPECT_EQ(DecodeNvlink5(149, (2u << 20) | 0x11, 0, 580)->action, "RESET_GPU");  // R575: 6:0 = 17
  EXPECT_FALSE(DecodeNvlink5(149, (3u << 20) | 0x11, 0, 580).has_value());        // no such reason
}

// RLW_RXPIPE's "Action 2": the promotion bit (V1 bit 10, V2 bit 7) turns an
// ignored error into a reset.
TEST(Nvlink5Test, ThePromotionBitTurnsAnIgnoredRxPipeErrorIntoAReset) {
  EXPECT_EQ(DecodeNvlink5(145, 0x06, 0x1, 580)->action, "IGNORE");
  EXPECT_EQ(DecodeNvlink5(145, 0x86, 0x1, 580)->action, "RESET_GPU");
  EXPECT_EQ(DecodeNvlink5(145, 0xc2, 0x2, 560)->action, "IGNORE");      // 9:5 = 6, 4:0 = 2
  EXPECT_EQ(DecodeNvlink5(145, 0x4c2, 0x2, 560)->action, "RESET_GPU");  // and bit 10
  EXPECT_EQ(DecodeNvlink5(145, 0x86, 0x8, 580)->action, "IGNORE");      // 0x8: no Action 2
}

// A driver branch not known: both encodings tried, the worse action wins.
TEST(Nvlink5Test, AnUnknownDriverTriesBothEncodings) {
  // 0x82 is RLW_REMAP before R575 and bits 6:0 = 2 (no 145 row) after.
  EXPECT_EQ(DecodeNvlink5(145, 0x82, 0x40, 0)->action, "RESET_GPU");
  EXPECT_EQ(DecodeNvlink5(145, 0x04082907, 0x8, 0)->action, "XID_154_EVAL");
  EXPECT_FALSE(DecodeNvlink5(145, 0x7f, 0x1, 0).has_value());   // a sub-error the table lacks
  EXPECT_FALSE(DecodeNvlink5(143, 0x82, 0x40, 0).has_value());  // not an NVLink5 XID
  // The branch from NVML's driver version.
  EXPECT_EQ(DriverMajor("580.159.04"), 580u);
  EXPECT_EQ(DriverMajor(""), 0u);
  // 150 MSE: Error Status 0 or 0xFFFFFFFF.
  EXPECT_EQ(DecodeNvlink5(150, 0, 0xFFFFFFFF, 580)->action, "RESET_GPU");
}

}  // namespace
}  // namespace gpuha::gpu
