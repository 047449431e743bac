// `gpuha doctor`: a user's first command on a new GPU node. It opens NVML as
// the agent would and prints what the agent sees of each GPU (name, UUID,
// PCI bus ID, memory, driver, MIG layout, one sample), what each NVML call
// the agent makes costs on this driver (wall and CPU, and whether it is read
// every sample or on the slow cadence), and whether the agent's other
// witnesses work: XID events, the kernel log, the sysfs PCI check. As
// `nvidia-smi -q` and `dcgmi diag` do for theirs. Exit 0 when NVML opened
// and every GPU sampled; 1 otherwise; 2 for bad flags.
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

#include "cli/exit_codes.h"

namespace gpuha::cli {

class DoctorCommand {
 public:
  explicit DoctorCommand(CLI::App& app);
  int Run(std::ostream& out, std::ostream& err);
  CLI::App* app() const { return app_; }

 private:
  CLI::App* app_;
  std::string nvml_lib_ = "libnvidia-ml.so.1";
  std::string kernel_log_ = "/dev/kmsg";
  std::string pci_devices_ = "/sys/bus/pci/devices";
};

}  // namespace gpuha::cli
