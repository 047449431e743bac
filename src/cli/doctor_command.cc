#include "cli/doctor_command.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu/kernel_log.h"
#include "gpu/nvml_probe.h"
#include "gpu/pci_presence.h"
#include "gpu/xid_catalog.h"

namespace gpuha::cli {

DoctorCommand::DoctorCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "doctor",
      "Check this node's GPUs as the agent sees them: devices, NVML call costs, XID "
      "events, the kernel log and the PCI check");
  app_->add_option("--nvml-lib", nvml_lib_, "Path of libnvidia-ml.so.1 (default: the loader's)");
  app_->add_option("--kernel-log", kernel_log_, "Kernel log read for XIDs (\"off\": skip)");
  app_->add_option("--pci-devices", pci_devices_, "The sysfs PCI tree (\"off\": skip)");
}

int DoctorCommand::Run(std::ostream& out, std::ostream& err) {
  bool ok = true;
  // Without NVML (no driver, no GPU) the checks that need none still run:
  // the kernel log and the PCI tree say what the driver and the bus see.
  std::unique_ptr<gpu::NvmlProbe> probe;
  std::vector<gpu::DeviceInfo> devices;
  if (auto opened = gpu::NvmlProbe::Open(nvml_lib_); !opened.ok()) {
    ok = false;
    err << "gpuha doctor: " << opened.status().message() << "\n";
    out << "NVML: NOT AVAILABLE (" << opened.status().message() << ")\n";
  } else if (auto listed = (*opened)->Devices(); !listed.ok()) {
    ok = false;
    err << "gpuha doctor: " << listed.status().message() << "\n";
    out << "NVML: NOT AVAILABLE (" << listed.status().message() << ")\n";
  } else {
    probe = std::move(*opened);
    devices = std::move(*listed);
    out << absl::StrFormat("NVML %s: %zu GPU(s), driver %s\n", nvml_lib_, devices.size(),
                           devices.empty() || devices.front().driver_version.empty()
                               ? "(not reported)"
                               : devices.front().driver_version);
  }
  for (const gpu::DeviceInfo& d : devices) {
    out << absl::StrFormat(
        "\nGPU %u: %s, %s, PCI %s, %.1f GiB%s\n", d.index, d.name, d.uuid, d.pci_bus_id,
        d.memory_total_bytes / double(1ull << 30),
        d.minor_number ? absl::StrFormat(", /dev/nvidia%u", *d.minor_number) : std::string());
    if (d.slices.empty()) {
      out << "  MIG: off\n";
    } else {
      out << absl::StrFormat("  MIG: %zu instance(s)\n", d.slices.size());
      for (const gpu::SliceInfo& sl : d.slices) {
        out << absl::StrFormat("    slot %u: %s, %s, %.1f GiB\n", sl.index, sl.name, sl.uuid,
                               sl.memory_total_bytes / double(1ull << 30));
      }
    }
    out << "  XID events: "
        << (probe->EventsRegistered(d.index) ? "registered"
                                             : "not supported (the kernel log is the only source)")
        << "\n";
    // XID 154's action and 144-150's without the kernel log (issue 52).
    const std::optional<int> action = probe->RecoveryAction(d.index);
    const std::optional<gpu::RecoveryAction> known =
        action ? gpu::Xid154Action(*action) : std::nullopt;
    out << "  recovery action: "
        << (!action ? std::string("not reported (a driver before R565: XID 154 needs the kernel "
                                  "log's line)")
            : known ? absl::StrCat(*action, " (", known->name, ")")
                    : absl::StrCat(*action, " (not one gpuha knows)"))
        << ", its event "
        << (probe->RecoveryEventsRegistered(d.index) ? "registered" : "not supported") << "\n";
    const auto t0 = std::chrono::steady_clock::now();
    auto s = probe->Sample(d.index);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      ok = false;
      out << "  sample: FAILED: " << s.status().message() << "\n";
    } else if (s->lost) {
      ok = false;
      out << "  sample: the GPU is lost (it does not answer)\n";
    } else {
      out << absl::StrFormat(
          "  sample (%.2f ms, slow readings included): %.0f C, %.1f W of %.1f W, %u%% busy, "
          "memory %.1f of %.1f GiB, throttle 0x%llx, ECC %llu corrected %llu uncorrected\n",
          ms, s->temperature_c, s->power_w, s->power_limit_w, s->utilization_pct,
          s->memory_used_bytes / double(1ull << 30), s->memory_total_bytes / double(1ull << 30),
          static_cast<unsigned long long>(s->throttle_reasons),
          static_cast<unsigned long long>(s->ecc_corrected),
          static_cast<unsigned long long>(s->ecc_uncorrected));
      if (!s->unsupported.empty()) {
        out << "  not supported here:";
        for (const std::string& u : s->unsupported) out << " " << u;
        out << "\n";
      }
    }
    out << absl::StrFormat("  %-46s %10s %10s  %-7s %s\n", "NVML call", "wall ms", "CPU ms",
                           "cadence", "answer");
    double every_wall = 0, every_cpu = 0;
    for (const gpu::NvmlProbe::CallTiming& t : probe->TimeCalls(d.index)) {
      out << absl::StrFormat("  %-46s %10.3f %10.3f  %-7s %s\n", t.call, t.wall_ms, t.cpu_ms,
                             t.slow ? "slow" : "sample", t.result);
      if (!t.slow) {
        every_wall += t.wall_ms;
        every_cpu += t.cpu_ms;
      }
    }
    out << absl::StrFormat("  every sample: %.3f ms wall, %.3f ms CPU\n", every_wall, every_cpu);
  }

  out << "\nkernel log: ";
  if (kernel_log_ == "off") {
    out << "skipped\n";
  } else if (auto log = gpu::KernelLog::Open(kernel_log_); log.ok()) {
    out << kernel_log_ << " opens; XIDs are read from it as the driver writes them\n";
  } else {
    out << "NOT READABLE: " << log.status().message() << "\n";
  }
  out << "PCI check: ";
  if (pci_devices_ == "off") {
    out << "skipped\n";
  } else if (auto scan = gpu::ScanNvidiaGpus(pci_devices_); !scan.ok()) {
    out << "NOT AVAILABLE: " << scan.status().message() << "\n";
  } else {
    int watched = 0;
    for (const gpu::DeviceInfo& d : devices) {
      if (scan->count(gpu::PciSlot(d.pci_bus_id)) != 0) {
        ++watched;
      } else {
        out << absl::StrFormat("GPU %u (%s) is not under %s; ", d.index, d.pci_bus_id,
                               pci_devices_);
      }
    }
    gpu::PciCheck check = gpu::ComparePci(devices, *scan, *scan);
    out << absl::StrFormat("%d of %zu GPU(s) watched under %s", watched, devices.size(),
                           pci_devices_);
    for (const std::string& slot : check.unseen) {
      out << "; NVIDIA GPU at " << slot << " is bound to the driver but NVML does not list it";
    }
    out << "\n";
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace gpuha::cli
