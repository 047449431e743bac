#include "gpu/pci_presence.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/testing/temp_dir.h"

namespace gpuha::gpu {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// A fake /sys/bus/pci/devices: one folder per function with vendor, class,
// config space and a driver link.
class PciPresenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = gpuha::testing::TestTempDir() / "devices";
    fs::create_directories(dir_ / "../drivers/nvidia");
    fs::create_directories(dir_ / "../drivers/vfio-pci");
  }
  void Add(const std::string& address, const std::string& vendor, const std::string& cls,
           const std::string& driver = "nvidia") {
    fs::create_directories(dir_ / address);
    std::ofstream(dir_ / address / "vendor") << vendor << "\n";
    std::ofstream(dir_ / address / "class") << cls << "\n";
    std::ofstream(dir_ / address / "config", std::ios::binary) << "\xde\x10\xb5\x20";
    if (!driver.empty()) fs::create_symlink("../../drivers/" + driver, dir_ / address / "driver");
  }
  std::vector<DeviceInfo> Devices(std::vector<std::string> bus_ids) {
    std::vector<DeviceInfo> out(bus_ids.size());
    for (size_t i = 0; i < bus_ids.size(); ++i) {
      out[i].index = static_cast<uint32_t>(i);
      out[i].pci_bus_id = bus_ids[i];
    }
    return out;
  }
  PciScan Scan() {
    auto s = ScanNvidiaGpus(dir_.string());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.value_or(PciScan{});
  }
  fs::path dir_;
};

TEST_F(PciPresenceTest, ListsNvidiaDisplayFunctionsOnly) {
  Add("0000:41:00.0", "0x10de", "0x030200");              // 3D controller (A100, H100)
  Add("0000:42:00.0", "0x10DE", "0x030000");              // VGA (L4, RTX)
  Add("0000:42:00.1", "0x10de", "0x040300");              // the same card's audio function
  Add("0000:00:1f.0", "0x8086", "0x060100");              // not NVIDIA
  Add("0000:43:00.0", "0x15b3", "0x020000");              // a NIC
  Add("0000:44:00.0", "0x10de", "0x030200", "vfio-pci");  // passed through to a guest
  Add("0000:45:00.4", "0x10de", "0x030200");              // an SR-IOV virtual function
  fs::create_directory_symlink("../0000:41:00.0", dir_ / "0000:45:00.4" / "physfn");
  EXPECT_THAT(Scan(), ElementsAre(Pair("0000:41:00", true), Pair("0000:42:00", true),
                                  Pair("0000:44:00", false)));
}

TEST_F(PciPresenceTest, AGpuGoneFromTheBusOrReadingAllOnesHasVanished) {
  Add("0000:41:00.0", "0x10de", "0x030200");
  Add("0000:42:00.0", "0x10de", "0x030200");
  Add("0000:43:00.0", "0x10de", "0x030200");
  std::vector<DeviceInfo> devices =
      Devices({"00000000:41:00.0", "00000000:42:00.0", "00000000:43:00.0"});
  const PciScan at_start = Scan();
  PciCheck c = ComparePci(devices, at_start, Scan());
  EXPECT_TRUE(c.vanished.empty());
  EXPECT_TRUE(c.unseen.empty());
  fs::remove_all(dir_ / "0000:42:00.0");  // hot-unplugged
  // Fallen off the bus: the entry stays, its config space reads all ones.
  std::ofstream(dir_ / "0000:43:00.0" / "config", std::ios::binary) << "\xff\xff\xff\xff";
  c = ComparePci(devices, at_start, Scan());
  EXPECT_THAT(c.vanished, ElementsAre(1u, 2u));
}

TEST_F(PciPresenceTest, OnlyAGpuOnTheBusAtStartCanVanishAndOnlyNvidiasCanBeUnseen) {
  // A VM without a PCI tree for its GPU: never "vanished".
  std::vector<DeviceInfo> devices = Devices({"00000000:41:00.0", "00000000:99:00.0"});
  Add("0000:41:00.0", "0x10de", "0x030200");
  Add("0000:43:00.0", "0x10de", "0x030200");              // on the bus, not listed
  Add("0000:44:00.0", "0x10de", "0x030200", "vfio-pci");  // a guest's
  const PciScan at_start = Scan();
  PciCheck c = ComparePci(devices, at_start, Scan());
  EXPECT_TRUE(c.vanished.empty());
  EXPECT_THAT(c.unseen, ElementsAre("0000:43:00"));
}

TEST_F(PciPresenceTest, AMissingTreeIsAnError) {
  auto scan = ScanNvidiaGpus((dir_ / "nope").string());
  ASSERT_FALSE(scan.ok());
  EXPECT_THAT(scan.status().message(), HasSubstr("PCI devices '"));
}

}  // namespace
}  // namespace gpuha::gpu
