#include "gpu/pci_presence.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/testing/temp_dir.h"

namespace gpuha::gpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fake /sys/bus/pci/devices: one folder per function with vendor and class.
class PciPresenceTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = gpuha::testing::TestTempDir() / "devices"; }
  void Add(const std::string& address, const std::string& vendor, const std::string& cls) {
    std::filesystem::create_directories(dir_ / address);
    std::ofstream(dir_ / address / "vendor") << vendor << "\n";
    std::ofstream(dir_ / address / "class") << cls << "\n";
  }
  std::filesystem::path dir_;
};

TEST_F(PciPresenceTest, ListsNvidiaDisplayFunctionsOnly) {
  Add("0000:41:00.0", "0x10de", "0x030200");  // 3D controller (A100, H100)
  Add("0000:42:00.0", "0x10DE", "0x030000");  // VGA (L4, RTX)
  Add("0000:42:00.1", "0x10de", "0x040300");  // the same card's audio function
  Add("0000:00:1f.0", "0x8086", "0x060100");  // not NVIDIA
  Add("0000:43:00.0", "0x15b3", "0x020000");  // a NIC
  auto slots = ListNvidiaGpus(dir_.string());
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_THAT(*slots, ElementsAre("0000:41:00", "0000:42:00"));
}

TEST_F(PciPresenceTest, AVanishedGpuAndAnUnseenOneAreBothFound) {
  Add("0000:41:00.0", "0x10de", "0x030200");
  Add("0000:43:00.0", "0x10de", "0x030200");  // on the bus, not listed by NVML
  std::vector<DeviceInfo> devices(2);
  devices[0].pci_bus_id = "00000000:41:00.0";
  devices[1].index = 1;
  devices[1].pci_bus_id = "00000000:42:00.0";
  PciCheck c = ComparePci(devices, *ListNvidiaGpus(dir_.string()));
  EXPECT_THAT(c.vanished, ElementsAre(1u));
  EXPECT_THAT(c.unseen, ElementsAre("0000:43:00"));
  // All present: nothing to say.
  Add("0000:42:00.0", "0x10de", "0x030200");
  std::filesystem::remove_all(dir_ / "0000:43:00.0");
  c = ComparePci(devices, *ListNvidiaGpus(dir_.string()));
  EXPECT_TRUE(c.vanished.empty());
  EXPECT_TRUE(c.unseen.empty());
}

TEST_F(PciPresenceTest, AMissingTreeIsAnError) {
  auto slots = ListNvidiaGpus((dir_ / "nope").string());
  ASSERT_FALSE(slots.ok());
  EXPECT_THAT(slots.status().message(), HasSubstr("PCI devices '"));
}

}  // namespace
}  // namespace gpuha::gpu
