#include "gpu/pci_presence.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpu/kernel_log.h"

namespace gpuha::gpu {
namespace {

namespace fs = std::filesystem;

std::string ReadWord(const fs::path& p) {
  std::ifstream in(p);
  std::string word;
  in >> word;
  return absl::AsciiStrToLower(word);
}

// A device off the bus answers config reads with all ones.
bool OffTheBus(const fs::path& dev) {
  std::ifstream in(dev / "config", std::ios::binary);
  unsigned char vendor[2] = {0, 0};
  if (!in.read(reinterpret_cast<char*>(vendor), 2)) return false;  // unreadable: no evidence
  return vendor[0] == 0xff && vendor[1] == 0xff;
}

}  // namespace

absl::StatusOr<PciScan> ScanNvidiaGpus(const std::string& devices_dir) {
  std::error_code ec;
  fs::directory_iterator it(devices_dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("PCI devices '", devices_dir, "': ", ec.message()));
  PciScan scan;
  // increment(ec), not ++: a function unplugged mid-listing must not throw.
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("PCI devices '", devices_dir, "': ", ec.message()));
    }
    const fs::path dev = it->path();
    if (ReadWord(dev / "vendor") != "0x10de") continue;
    if (!absl::StartsWith(ReadWord(dev / "class"), "0x03")) continue;
    std::error_code ignored;
    if (fs::exists(dev / "physfn", ignored)) continue;  // an SR-IOV virtual function
    if (OffTheBus(dev)) continue;
    std::string slot = PciSlot(dev.filename().string());
    if (slot.empty()) continue;
    fs::path driver = fs::read_symlink(dev / "driver", ignored);
    scan[slot] = !ignored && driver.filename() == "nvidia";
  }
  return scan;
}

PciCheck ComparePci(const std::vector<DeviceInfo>& devices, const PciScan& at_start,
                    const PciScan& now) {
  PciCheck c;
  std::set<std::string> listed;
  for (const DeviceInfo& d : devices) {
    std::string slot = PciSlot(d.pci_bus_id);
    listed.insert(slot);
    if (at_start.count(slot) != 0 && now.count(slot) == 0) c.vanished.push_back(d.index);
  }
  for (const auto& [slot, nvidia] : now) {
    if (nvidia && listed.count(slot) == 0) c.unseen.push_back(slot);
  }
  return c;
}

}  // namespace gpuha::gpu
