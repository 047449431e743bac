// NIC health from Linux sysfs: the network half of seed 000. A node whose
// data-path NIC has no carrier cannot serve, however healthy its GPUs are.
#pragma once

#include <cstdint>
#include <string>

namespace gpuha::gpu {

struct NicSample {
  std::string name;
  bool present = false;   // /sys/class/net/<name> exists
  bool carrier = false;   // carrier == 1
  std::string operstate;  // "up", "down", "unknown", ...
  uint64_t rx_errors = 0;
  uint64_t tx_errors = 0;
  uint64_t rx_dropped = 0;
  uint64_t tx_dropped = 0;
};

// Reads <sysfs_root>/<name>/{carrier,operstate,statistics/*}. `sysfs_root` is
// /sys/class/net in production and a test directory in tests.
NicSample ReadNic(const std::string& sysfs_root, const std::string& name);

// Up means: present, carrier, and operstate "up" (or "unknown", which
// loopback and some virtual NICs report while passing traffic).
bool NicUp(const NicSample& nic);

}  // namespace gpuha::gpu
