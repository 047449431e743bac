// RebindPci against a fake sysfs tree (the real one is never touched).
#include "gpu/pci_rebind.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/file_util.h"
#include "common/testing/temp_dir.h"

namespace gpuha::gpu {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kGpu[] = "0000:3b:00.0";

class PciRebindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = gpuha::testing::TestTempDir() / "sys-bus-pci";
    for (const char* d : {"nvidia", "vfio-pci"}) {
      fs::create_directories(root_ / "drivers" / d);
      Touch(root_ / "drivers" / d / "bind");
      Touch(root_ / "drivers" / d / "unbind");
    }
    fs::create_directories(root_ / "devices" / kGpu);
    Touch(root_ / "devices" / kGpu / "driver_override");
  }
  // The device's driver link, as the kernel keeps it.
  void BoundTo(const std::string& driver) {
    fs::path link = root_ / "devices" / kGpu / "driver";
    std::error_code ec;
    fs::remove(link, ec);
    fs::create_directory_symlink(fs::path("../../drivers") / driver, link);
  }
  static void Touch(const fs::path& p) { std::ofstream(p).flush(); }
  std::string Read(const fs::path& p) { return common::ReadFile(p.string()).value_or("?"); }
  fs::path root_;
};

TEST_F(PciRebindTest, WritesOverrideUnbindAndBindAndReadsTheDriverBack) {
  EXPECT_EQ(BoundDriver(root_.string(), kGpu).value_or("?"), "");
  BoundTo("vfio-pci");  // the kernel's link, already where the bind leads
  EXPECT_EQ(BoundDriver(root_.string(), kGpu).value_or("?"), "vfio-pci");
  ASSERT_TRUE(RebindPci(root_.string(), kGpu, "vfio-pci").ok());
  EXPECT_EQ(Read(root_ / "devices" / kGpu / "driver_override"), "vfio-pci");
  EXPECT_EQ(Read(root_ / "drivers" / "vfio-pci" / "unbind"), kGpu);  // via the driver link
  EXPECT_EQ(Read(root_ / "drivers" / "vfio-pci" / "bind"), kGpu);
}

TEST_F(PciRebindTest, ADeviceLeftOnAnotherDriverIsAnError) {
  BoundTo("nvidia");  // a fake tree's link does not follow the bind, as a refusing kernel's
  absl::Status s = RebindPci(root_.string(), kGpu, "vfio-pci");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("bound to 'nvidia' after binding it to vfio-pci"));
  EXPECT_EQ(Read(root_ / "drivers" / "nvidia" / "unbind"), kGpu);
  EXPECT_EQ(Read(root_ / "drivers" / "vfio-pci" / "bind"), kGpu);
}

TEST_F(PciRebindTest, BadInputNamesWhatIsWrong) {
  EXPECT_THAT(std::string(RebindPci(root_.string(), "3b:00.0", "nvidia").message()),
              HasSubstr("PCI address '3b:00.0' is not DDDD:BB:DD.F"));
  EXPECT_THAT(std::string(RebindPci(root_.string(), kGpu, "nv/../x").message()),
              HasSubstr("is not a driver name"));
  EXPECT_EQ(RebindPci(root_.string(), "0000:3c:00.0", "nvidia").code(),
            absl::StatusCode::kNotFound);
  absl::Status s = RebindPci(root_.string(), kGpu, "nouveau");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no driver nouveau"));
}

}  // namespace
}  // namespace gpuha::gpu
