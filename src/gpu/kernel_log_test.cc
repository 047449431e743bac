#include "gpu/kernel_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/testing/temp_dir.h"

namespace gpuha::gpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(KernelXidTest, ParsesTheDriversXidLinesInEveryForm) {
  // A /dev/kmsg record, a dmesg line and a journal line.
  auto x = ParseKernelXid(
      "4,1873,58211834203,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2217, name=python3, GPU has "
      "fallen off the bus.");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci_slot, "0000:3b:00");
  EXPECT_EQ(x->event.xid, 79u);
  x = ParseKernelXid(
      "[ 5123.778231] NVRM: Xid (PCI:0000:AF:00): 48, pid='<unknown>', name=<unknown>, An "
      "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci_slot, "0000:af:00");
  EXPECT_EQ(x->event.xid, 48u);
  x = ParseKernelXid(
      "Dec 01 10:02:11 gpu-7 kernel: NVRM: Xid (PCI:0001:1a:00): 13, Graphics "
      "SM Warp Exception");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci_slot, "0001:1a:00");
  EXPECT_EQ(x->event.xid, 13u);
  // "Fallen off the bus" without an Xid line is XID 79.
  x = ParseKernelXid("6,99,1,-;NVRM: GPU 0000:41:00.0: GPU has fallen off the bus.");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci_slot, "0000:41:00");
  EXPECT_EQ(x->event.xid, 79u);
  x = ParseKernelXid(
      "NVRM: The NVIDIA GPU 0000:42:00.0 (PCI ID: 10de:20b5) installed in this system has "
      "fallen off the bus and is not responding to commands.");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->pci_slot, "0000:42:00");
}

TEST(KernelXidTest, OtherLinesAndDamagedOnesAreNotXids) {
  for (const char* line : {
           "", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03",
           "NVRM: GPU at PCI:0000:3b:00: GPU-6a7e3f7c-7a1f-4f5e-9d40-1b8c7e2f0a11",
           "NVRM: Xid (PCI:0000:3b:00) 79",               // no ": "
           "NVRM: Xid (PCI:zz:3b:00): 79, x",             // not hex
           "NVRM: Xid (PCI:0000:3b:00): , pid=1",         // no number
           "NVRM: Xid (PCI:0000:3b:00): 99999999999, x",  // out of range
           "usb 1-1: fallen off the bus",                 // not the driver
           "NVRM: something fallen off the bus",          // no address
       }) {
    EXPECT_FALSE(ParseKernelXid(line).has_value()) << line;
  }
}

TEST(KernelXidTest, PciSlotReadsNvmlSysfsAndLogForms) {
  EXPECT_EQ(PciSlot("00000000:3B:00.0"), "0000:3b:00");
  EXPECT_EQ(PciSlot("0000:3b:00.0"), "0000:3b:00");
  EXPECT_EQ(PciSlot("PCI:0000:3b:00"), "0000:3b:00");
  EXPECT_EQ(PciSlot("3b:00.1"), "0000:3b:00");
  EXPECT_EQ(PciSlot("0000:3b"), "");
  EXPECT_EQ(PciSlot("0000:3b:00.0.1"), "");
  EXPECT_EQ(PciSlot("10000:3b:00.0"), "");
  EXPECT_EQ(PciSlot("0000:3b:20.0"), "");            // device numbers stop at 0x1f
  EXPECT_EQ(PciSlot("0000:3b:00.8"), "0000:3b:00");  // one hex digit function
}

std::vector<std::string> Lines(KernelLog& log) {
  auto lines = log.ReadNew();
  EXPECT_TRUE(lines.ok()) << lines.status();
  return lines.value_or(std::vector<std::string>{});
}

TEST(KernelLogTest, FollowsAGrowingFileFromItsEndAndStartsOverWhenItShrinks) {
  std::string path = (gpuha::testing::TestTempDir() / "kern.log").string();
  std::ofstream(path) << "NVRM: Xid (PCI:0000:41:00): 79, old, before the agent started\n";
  auto log = KernelLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE(Lines(**log).empty());  // the past is not replayed
  {
    std::ofstream out(path, std::ios::app);
    out << "line one\nNVRM: Xid (PCI:0000:41:00): 48, DBE\npart";
  }
  EXPECT_THAT(Lines(**log), ElementsAre("line one", "NVRM: Xid (PCI:0000:41:00): 48, DBE"));
  std::ofstream(path, std::ios::app) << "ial line\n";
  EXPECT_THAT(Lines(**log), ElementsAre("partial line"));
  std::ofstream(path) << "truncated\n";  // copytruncate: the same file, shorter
  EXPECT_THAT(Lines(**log), ElementsAre("truncated"));
}

TEST(KernelLogTest, AFileRenamedAwayIsReadToItsEndThenTheNewOne) {
  std::string path = (gpuha::testing::TestTempDir() / "kern.log").string();
  std::ofstream(path) << "";
  auto log = KernelLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  std::ofstream(path, std::ios::app) << "last line of the old file\n";
  std::filesystem::rename(path, path + ".1");  // logrotate's default
  std::ofstream(path) << "first line of the new file\n";
  EXPECT_THAT(Lines(**log), ElementsAre("last line of the old file", "first line of the new file"));
  std::ofstream(path, std::ios::app) << "second\n";
  EXPECT_THAT(Lines(**log), ElementsAre("second"));
}

TEST(KernelLogTest, OnlyTheKernelsOwnKmsgRecordsCount) {
  auto msg = KmsgKernelMessage(
      "4,1873,58211834203,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
      " SUBSYSTEM=pci\n");
  ASSERT_TRUE(msg.has_value());
  EXPECT_EQ(*msg, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
  // A process that writes to /dev/kmsg gets facility 1 (user): prio 12 = 1<<3 | 4.
  EXPECT_FALSE(KmsgKernelMessage("12,1874,58211834300,-;NVRM: Xid (PCI:0000:3b:00): 79, x"));
  EXPECT_FALSE(KmsgKernelMessage("no separator"));
  EXPECT_FALSE(KmsgKernelMessage("x,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79, x"));
}

TEST(KernelLogTest, AMissingLogOrADirectoryIsAClearError) {
  auto missing = KernelLog::Open("/nonexistent/kmsg");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("kernel log '/nonexistent/kmsg'"));
  auto dir = KernelLog::Open(gpuha::testing::TestTempDir().string());
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("not a character device or a file"));
}

TEST(XidDeduperTest, OneXidFromTwoSourcesIsReportedOnce) {
  common::FakeClock clock;
  XidDeduper d(std::chrono::seconds(10));
  constexpr XidSource kNvml = XidSource::kNvml, kLog = XidSource::kKernelLog;
  EXPECT_TRUE(d.Fresh(kNvml, 0, 79, clock.Now()));   // NVML's event
  EXPECT_FALSE(d.Fresh(kLog, 0, 79, clock.Now()));   // the kernel log's line
  EXPECT_TRUE(d.Fresh(kNvml, 1, 79, clock.Now()));   // another GPU
  EXPECT_TRUE(d.Fresh(kLog, 0, 48, clock.Now()));    // another XID
  EXPECT_FALSE(d.Fresh(kNvml, 0, 48, clock.Now()));  // its other copy, the log's first
  clock.Advance(std::chrono::seconds(10));
  // GPU 1's NVML copy is out of the window: a log line now is another occurrence.
  EXPECT_TRUE(d.Fresh(kLog, 1, 79, clock.Now()));
}

// Issue 38: three real XID 31s 4.3 s apart, each told by both sources, are
// three occurrences (a per-(GPU, XID) window counted one and dropped five).
// Each copy pairs with one copy of the other source, whichever comes first.
TEST(XidDeduperTest, RepeatsAreEachAnOccurrenceOnlyTheTwoCopiesOfOneMerge) {
  common::FakeClock clock;
  XidDeduper d;
  constexpr XidSource kNvml = XidSource::kNvml, kLog = XidSource::kKernelLog;
  int fresh = 0;
  for (int i = 0; i < 3; ++i) {
    fresh += d.Fresh(kNvml, 0, 31, clock.Now());
    clock.Advance(std::chrono::milliseconds(3));
    fresh += d.Fresh(kLog, 0, 31, clock.Now());
    clock.Advance(std::chrono::milliseconds(4300));
  }
  EXPECT_EQ(fresh, 3);
  // A burst from one source (one fault per SM) is that many occurrences,
  // and the other source's copies of them pair one to one.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(d.Fresh(kLog, 0, 13, clock.Now()));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(d.Fresh(kNvml, 0, 13, clock.Now()));
  EXPECT_TRUE(d.Fresh(kNvml, 0, 13, clock.Now()));
}

TEST(KernelXidTest, TheProcessTheDriverNamesIsRead) {
  auto k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:00:06): 31, pid=702, name=python3, Ch 00000008, intr 00000000. MMU "
      "Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00010000");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.xid, 31u);
  EXPECT_EQ(k->event.pid, 702);
  EXPECT_EQ(k->event.process, "python3");
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:AF:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.pid, 0);
  EXPECT_EQ(k->event.process, "");
}

// XID 13 says where on the GPU its exception was: the place its repeat rule
// counts by (NVIDIA's XID 13 workflow).
TEST(KernelXidTest, Xid13GivesTheGpcAndTpcItsMessageNames) {
  auto k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3b:00): 13, pid=4121, name=python3, Graphics SM Warp Exception on "
      "(GPC 3, TPC 1, SM 0): Out Of Range Address");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.gpc, 3u);
  EXPECT_EQ(k->event.tpc, 1u);
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3b:00): 13, pid=4121, name=python3, Graphics Exception: ESR "
      "0x504648=0x102000e 0x504650=0x0");
  ASSERT_TRUE(k.has_value());
  EXPECT_FALSE(k->event.gpc.has_value());  // no place in this line
  EXPECT_FALSE(k->event.tpc.has_value());
}

// Issue 52, item 7: XID 74's line names the link and REG0-REG6, whose
// bits NVSentinel's rules read; a line without them gives none.
TEST(KernelXidTest, Xid74GivesItsLinkAndRegisters) {
  auto k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error "
      "detected on link 6(0x10000, 0x0, 0x2000, 0x0, 0x0, 0x0, 0x0)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.link, 6u);
  EXPECT_EQ(k->event.nvlink_regs, (std::vector<uint32_t>{0x10000, 0, 0x2000, 0, 0, 0, 0}));
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:03:00): 74, pid=..., NVLink: Fatal error detected on link 4");
  ASSERT_TRUE(k.has_value());
  EXPECT_FALSE(k->event.link.has_value());
  EXPECT_TRUE(k->event.nvlink_regs.empty());
}

// XID 154 carries its action in its message (issue 16), by value and in
// words (issue 39: R610's words differ, the value does not).
TEST(KernelLogTest, Xid154GivesTheRecoveryActionItsMessageNames) {
  auto k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
      "(Node Reboot Required)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.xid, 154u);
  EXPECT_EQ(k->event.recovery_value, 2);
  EXPECT_EQ(k->event.recovery_action, "Node Reboot Required");
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
      "(Drain and Reset)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.recovery_value, 4);
  EXPECT_EQ(k->event.recovery_action, "Drain and Reset");
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF "
      "FLR)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.recovery_value, 1);
  EXPECT_EQ(k->event.recovery_action, "PF FLR");
  k = ParseKernelXid("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.recovery_value, -1);  // no action named: the catalog's drain stands
  EXPECT_EQ(k->event.recovery_action, "");
  k = ParseKernelXid("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus (to 0x1)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.recovery_action, "");  // only XID 154 has one
  EXPECT_EQ(k->event.recovery_value, -1);
  // NVML's event and the log's line of one XID 154 are one occurrence.
  common::FakeClock clock;
  XidDeduper d;
  EXPECT_TRUE(d.Fresh(XidSource::kNvml, 0, 154, clock.Now()));
  EXPECT_FALSE(d.Fresh(XidSource::kKernelLog, 0, 154, clock.Now()));
}

// Issue 39: the lines whose words decide an XID's action: 144-150's
// registers, XID 45's cause, a MIG instance's XID.
TEST(KernelLogTest, NvlinkRegistersXid45sCauseAndMigInstancesAreRead) {
  auto k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3f:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 10 (0x04082907 "
      "0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.xid, 145u);
  EXPECT_EQ(k->event.intr_info, 0x04082907u);
  EXPECT_EQ(k->event.error_status, 0x8u);
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 "
      "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->pci_slot, "0018:01:00");
  EXPECT_EQ(k->event.intr_info, 0x025525c6u);
  EXPECT_EQ(k->event.error_status, 0u);
  k = ParseKernelXid("NVRM: Xid (PCI:0000:3f:00): 145, RLW_SRC_TRACK Nonfatal (garbled");
  ASSERT_TRUE(k.has_value());
  EXPECT_FALSE(k->event.intr_info.has_value());  // no registers: the catalog's drain stands
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:3b:00): 45, pid=9120, name=python3, Ch 00000010 caused by previous "
      "Xid 31");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.caused_by, 31u);
  k = ParseKernelXid("NVRM: Xid (PCI:0000:3b:00): 45, pid=9120, name=python3, Ch 00000010");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->event.caused_by, 0u);
  // A MIG instance's XID names the instance after the GPU's slot.
  k = ParseKernelXid(
      "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, name=python3, Contained: CE User "
      "Channel (0x9). RST: No, D-RST: No");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->pci_slot, "0000:01:00");
  EXPECT_EQ(k->event.xid, 94u);
  EXPECT_EQ(k->event.pid, 7194);
  k = ParseKernelXid("NVRM: Xid (PCI:0000:01:00 GPU-I:02 GPU-CI:00): 31, pid=N/A, name=x, y");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->pci_slot, "0000:01:00");
  EXPECT_EQ(k->event.pid, 0);
}

}  // namespace
}  // namespace gpuha::gpu
