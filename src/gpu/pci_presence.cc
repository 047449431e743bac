#include "gpu/pci_presence.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpu/kernel_log.h"

namespace gpuha::gpu {
namespace {

std::string ReadWord(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string word;
  in >> word;
  return absl::AsciiStrToLower(word);
}

}  // namespace

absl::StatusOr<std::set<std::string>> ListNvidiaGpus(const std::string& devices_dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(devices_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("PCI devices '", devices_dir, "': ", ec.message()));
  }
  std::set<std::string> slots;
  for (const std::filesystem::directory_entry& e : it) {
    if (ReadWord(e.path() / "vendor") != "0x10de") continue;
    if (!absl::StartsWith(ReadWord(e.path() / "class"), "0x03")) continue;
    std::string slot = PciSlot(e.path().filename().string());
    if (!slot.empty()) slots.insert(slot);
  }
  return slots;
}

PciCheck ComparePci(const std::vector<DeviceInfo>& devices, const std::set<std::string>& slots) {
  PciCheck c;
  std::set<std::string> listed;
  for (const DeviceInfo& d : devices) {
    std::string slot = PciSlot(d.pci_bus_id);
    listed.insert(slot);
    if (!slot.empty() && slots.count(slot) == 0) c.vanished.push_back(d.index);
  }
  for (const std::string& s : slots) {
    if (listed.count(s) == 0) c.unseen.push_back(s);
  }
  return c;
}

}  // namespace gpuha::gpu
