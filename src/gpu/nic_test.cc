#include "gpu/nic.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/testing/temp_dir.h"

namespace gpuha::gpu {
namespace {

namespace fs = std::filesystem;

fs::path FakeSysfs() {
  fs::path root = gpuha::testing::TestTempDir() / "sysfs_net";
  fs::create_directories(root / "eth0" / "statistics");
  std::ofstream(root / "eth0" / "carrier") << "1\n";
  std::ofstream(root / "eth0" / "operstate") << "up\n";
  std::ofstream(root / "eth0" / "statistics" / "rx_errors") << "7\n";
  std::ofstream(root / "eth0" / "statistics" / "tx_errors") << "2\n";
  fs::create_directories(root / "eth1");
  std::ofstream(root / "eth1" / "carrier") << "0\n";
  std::ofstream(root / "eth1" / "operstate") << "down\n";
  return root;
}

TEST(NicTest, ReadsCarrierStateAndCounters) {
  fs::path root = FakeSysfs();
  NicSample up = ReadNic(root.string(), "eth0");
  EXPECT_TRUE(up.present);
  EXPECT_TRUE(up.carrier);
  EXPECT_EQ(up.operstate, "up");
  EXPECT_EQ(up.rx_errors, 7u);
  EXPECT_EQ(up.tx_errors, 2u);
  EXPECT_TRUE(NicUp(up));
  NicSample down = ReadNic(root.string(), "eth1");
  EXPECT_TRUE(down.present);
  EXPECT_FALSE(NicUp(down));
}

TEST(NicTest, MissingOrHostileNameIsNotPresent) {
  fs::path root = FakeSysfs();
  EXPECT_FALSE(ReadNic(root.string(), "eth9").present);
  EXPECT_FALSE(ReadNic(root.string(), "../eth0").present);
  EXPECT_FALSE(NicUp(ReadNic(root.string(), "")));
}

TEST(NicTest, LoopbackOnThisMachineIsUp) {
  NicSample lo = ReadNic("/sys/class/net", "lo");
  if (!lo.present) GTEST_SKIP() << "no /sys/class/net/lo here";
  EXPECT_TRUE(NicUp(lo));
}

}  // namespace
}  // namespace gpuha::gpu
