#include "gpu/nic.h"

#include <filesystem>
#include <fstream>

namespace gpuha::gpu {
namespace {

bool ReadLine(const std::filesystem::path& p, std::string* out) {
  std::ifstream in(p);
  if (!in) return false;
  std::getline(in, *out);
  return true;
}

uint64_t ReadCounter(const std::filesystem::path& p) {
  std::string line;
  if (!ReadLine(p, &line)) return 0;
  try {
    return std::stoull(line);
  } catch (...) {  // std::stoull's only way to report junk; a junk counter reads as 0
    return 0;
  }
}

}  // namespace

NicSample ReadNic(const std::string& sysfs_root, const std::string& name) {
  NicSample s;
  s.name = name;
  std::filesystem::path dir = std::filesystem::path(sysfs_root) / name;
  std::error_code ec;
  if (name.empty() || name.find('/') != std::string::npos ||
      !std::filesystem::is_directory(dir, ec)) {
    return s;
  }
  s.present = true;
  std::string carrier;
  // Reading carrier fails with EINVAL while the interface is administratively down.
  s.carrier = ReadLine(dir / "carrier", &carrier) && carrier == "1";
  ReadLine(dir / "operstate", &s.operstate);
  s.rx_errors = ReadCounter(dir / "statistics" / "rx_errors");
  s.tx_errors = ReadCounter(dir / "statistics" / "tx_errors");
  s.rx_dropped = ReadCounter(dir / "statistics" / "rx_dropped");
  s.tx_dropped = ReadCounter(dir / "statistics" / "tx_dropped");
  return s;
}

bool NicUp(const NicSample& nic) {
  return nic.present && nic.carrier && (nic.operstate == "up" || nic.operstate == "unknown");
}

}  // namespace gpuha::gpu
