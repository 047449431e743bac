#include "gpu/fault_script.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::gpu {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(FaultScriptTest, ParsesEveryKind) {
  absl::StatusOr<std::vector<Fault>> f = ParseFaultScript(R"(
faults:
  - { at_ms: 100, gpu: 1, kind: temp_ramp, to_c: 95, over_ms: 5000 }
  - { at_ms: 200, gpu: 0, kind: xid, xid: 79 }
  - { at_ms: 300, gpu: 0, kind: ecc_burst, corrected: 50, uncorrected: 2 }
  - { at_ms: 400, gpu: 0, kind: power_excursion, watts: 110, for_ms: 1000 }
  - { at_ms: 500, gpu: 0, kind: lost }
  - { at_ms: 600, kind: agent_hang, for_ms: 2000 }
  - { at_ms: 700, gpu: 0, kind: clear }
  - { at_ms: 800, gpu: 1, kind: driver_hang, for_ms: 1500 }
  - { at_ms: 900, gpu: 0, kind: driver_hang }
)",
                                                          "s.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 9u);
  EXPECT_EQ((*f)[0].kind, FaultKind::kTempRamp);
  EXPECT_EQ((*f)[0].gpu, 1u);
  EXPECT_DOUBLE_EQ((*f)[0].to_c, 95);
  EXPECT_EQ((*f)[1].xid, 79u);
  EXPECT_EQ((*f)[2].uncorrected, 2u);
  EXPECT_DOUBLE_EQ((*f)[3].watts, 110);
  EXPECT_EQ((*f)[5].kind, FaultKind::kAgentHang);
  EXPECT_EQ((*f)[5].for_ms, 2000);
  EXPECT_EQ((*f)[6].kind, FaultKind::kClear);
  EXPECT_EQ((*f)[7].kind, FaultKind::kDriverHang);
  EXPECT_EQ((*f)[7].for_ms, 1500);
  EXPECT_EQ((*f)[8].for_ms, 0);  // until a clear
}

TEST(FaultScriptTest, UnknownXidIsNamed) {
  auto f = ParseFaultScript("faults:\n  - { at_ms: 1, kind: xid, xid: 4242 }\n", "s.yaml");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(Msg(f.status()), HasSubstr("s.yaml:2:33: faults[0].xid: 4242 is not a known XID"));
}

TEST(FaultScriptTest, UnknownKindAndMissingFieldsAreNamed) {
  EXPECT_THAT(Msg(ParseFaultScript("faults:\n  - { kind: meteor }\n", "s").status()),
              HasSubstr("faults[0].kind: 'meteor' is not one of"));
  EXPECT_THAT(Msg(ParseFaultScript("faults:\n  - { kind: temp_ramp }\n", "s").status()),
              HasSubstr("faults[0].to_c: is required but missing"));
  EXPECT_THAT(Msg(ParseFaultScript("faults:\n  - { kind: lost, at_ms: -5 }\n", "s").status()),
              HasSubstr("faults[0].at_ms: must not be negative"));
  EXPECT_THAT(Msg(ParseFaultScript("faults:\n  - { kind: lost, colour: red }\n", "s").status()),
              HasSubstr("faults[0].colour: unknown key"));
}

TEST(FaultScriptTest, FlagFormParsesLikeYaml) {
  absl::StatusOr<Fault> f = ParseFaultSpec("at_ms=2000,gpu=1,kind=xid,xid=48");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->at_ms, 2000);
  EXPECT_EQ(f->gpu, 1u);
  EXPECT_EQ(f->xid, 48u);
}

TEST(FaultScriptTest, MigLostNamesItsSlot) {
  absl::StatusOr<Fault> f = ParseFaultSpec("gpu=3,kind=mig_lost,slice=6");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, FaultKind::kMigLost);
  EXPECT_EQ(f->gpu, 3u);
  EXPECT_EQ(f->slice, 6u);
  EXPECT_THAT(Msg(ParseFaultSpec("kind=mig_lost").status()), HasSubstr("slice: is required"));
  EXPECT_THAT(Msg(ParseFaultSpec("kind=mig_lost,slice=64").status()),
              HasSubstr("slice: must be a MIG slot 0..63, got 64"));
  EXPECT_THAT(Msg(ParseFaultSpec("kind=lost,slice=1").status()), HasSubstr("slice: unknown key"));
}

TEST(FaultScriptTest, FlagFormErrorsNameTheFlag) {
  EXPECT_THAT(Msg(ParseFaultSpec("kind=xid,xid=7777").status()),
              HasSubstr("--fault 'kind=xid,xid=7777'"));
  EXPECT_THAT(Msg(ParseFaultSpec("kind=xid,xid=7777").status()),
              HasSubstr("7777 is not a known XID"));
  EXPECT_THAT(Msg(ParseFaultSpec("kind").status()), HasSubstr("'kind' is not key=value"));
  EXPECT_THAT(Msg(ParseFaultSpec("kind=lost,gpu={x}").status()), HasSubstr("is not key=value"));
}

}  // namespace
}  // namespace gpuha::gpu
