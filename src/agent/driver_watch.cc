// The agent's sources of truth beside the GPU probe (agent.h): the kernel
// log as a second XID source, the sysfs PCI check for a GPU that vanished,
// and the reporting of XIDs from either source once. Split from agent.cc,
// which keeps the lifecycle and the controller stream (agent_endpoints.cc
// has the HTTP endpoints).
#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/process.h"
#include "common/log.h"
#include "gpu/xid_catalog.h"
#include "gpu/xid_nvlink5.h"

namespace gpuha::agent {

using std::chrono::milliseconds;

absl::Status Agent::OpenDriverWatch() {
  // An explicit path that does not work is a config error; the nvml
  // backend's defaults (/dev/kmsg needs root or CAP_SYSLOG) only warn.
  pci_devices_ = PciDevicesPath(config_);
  if (!pci_devices_.empty()) {
    auto scan = gpu::ScanNvidiaGpus(pci_devices_);
    if (!scan.ok()) {
      if (!config_.pci_devices.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("gpu.pci_devices: ", scan.status().message()));
      }
      spdlog::warn("agent {}: {}; the PCI presence check is off", config_.node,
                   scan.status().message());
      pci_devices_.clear();
    } else {
      pci_at_start_ = std::move(*scan);
      for (const gpu::DeviceInfo& d : devices_) {
        if (pci_at_start_.count(gpu::PciSlot(d.pci_bus_id)) == 0) {
          spdlog::warn("agent {}: GPU {} ({}) is not under {}; the PCI check cannot watch it",
                       config_.node, d.index, d.pci_bus_id, pci_devices_);
        }
      }
    }
  }
  if (std::string path = KernelLogPath(config_); !path.empty()) {
    auto log = gpu::KernelLog::Open(path);
    if (log.ok()) {
      kernel_log_ = std::move(*log);
    } else if (!config_.kernel_log.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("gpu.kernel_log: ", log.status().message()));
    } else {
      spdlog::warn("agent {}: {}; XIDs come from NVML alone", config_.node, log.status().message());
    }
  }
  return absl::OkStatus();
}

void Agent::CheckPci(gpu::Observation* obs) {
  auto scan = gpu::ScanNvidiaGpus(pci_devices_);
  if (!scan.ok()) {  // the tree was there at Start(); say so, but not every sample
    if (counters_.pci_check_errors++ % 100 == 0) {
      spdlog::warn("agent {}: {}", config_.node, scan.status().message());
    }
    return;
  }
  gpu::PciCheck check = gpu::ComparePci(devices_, pci_at_start_, *scan);
  for (uint32_t index : check.vanished) {
    auto it = std::find_if(obs->gpus.begin(), obs->gpus.end(),
                           [&](const gpu::GpuSample& g) { return g.index == index; });
    if (it == obs->gpus.end()) {  // its sample failed: report it lost all the same
      it = obs->gpus.insert(obs->gpus.end(), gpu::GpuSample{});
      it->index = index;
    }
    it->lost = true;
    it->lost_detail = absl::StrCat("gone from the PCI bus (", devices_[index].pci_bus_id,
                                   " is no longer under ", pci_devices_, ")");
    counters_.gpus_vanished++;
  }
  obs->unseen_pci = std::move(check.unseen);
}

// On a thread of its own: the kernel log matters most when NVML hangs.
// /dev/kmsg is waited on (a record wakes it at once; the wait is cut short
// every 200 ms to see Stop()); a file is read every 50 ms.
void Agent::KernelLogLoop() {
  while (!stopping_) {
    if (!kernel_log_->Wait(milliseconds(200))) WaitFor(milliseconds(50));
    if (stopping_) break;
    auto lines = kernel_log_->ReadNew();
    if (!lines.ok()) {
      if (counters_.probe_errors++ % 100 == 0) {
        spdlog::warn("agent {}: {}", config_.node, lines.status().message());
      }
      WaitFor(milliseconds(200));  // a log that keeps failing is not read in a busy loop
      continue;
    }
    std::vector<gpu::XidEvent> xids;
    for (const std::string& line : *lines) {
      std::optional<gpu::KernelXid> k = gpu::ParseKernelXid(line);
      if (!k) continue;
      counters_.kernel_log_xids++;
      auto d = std::find_if(devices_.begin(), devices_.end(), [&](const gpu::DeviceInfo& d) {
        return gpu::PciSlot(d.pci_bus_id) == k->pci_slot;
      });
      if (d == devices_.end()) {
        spdlog::warn("agent {}: kernel log: XID {} on PCI {}, not a GPU the driver listed",
                     config_.node, k->event.xid, k->pci_slot);
        continue;
      }
      gpu::XidEvent x = std::move(k->event);
      x.gpu_index = d->index;
      x.unix_nanos = clock_->UnixNanos();
      x.driver_major = gpu::DriverMajor(d->driver_version);
      xids.push_back(std::move(x));
    }
    ReportXids(std::move(xids), gpu::XidSource::kKernelLog);
  }
}

void Agent::ReportXids(std::vector<gpu::XidEvent> seen, gpu::XidSource source) {
  std::vector<gpu::XidEvent> judge;
  const common::TimePoint now = clock_->Now();
  {
    std::lock_guard<std::mutex> lock(xid_mu_);
    // Held XIDs whose line did not come: judged first, before the new
    // ones, which may follow them (an XID 45 after the XID it cleans up).
    size_t occurrences = 0;
    // One occurrence judged: counted once, in all and by its GPU and XID.
    auto occurred = [&](const gpu::XidEvent& x) {
      occurrences++;
      xids_by_code_[{x.gpu_index, x.xid}]++;
    };
    for (auto it = held_xids_.begin(); it != held_xids_.end();) {
      if (it->until > now) {
        ++it;
        continue;
      }
      occurred(it->x);
      judge.push_back(std::move(it->x));  // judged as the catalog has it
      it = held_xids_.erase(it);
    }
    for (gpu::XidEvent& x : seen) {
      if (x.recovery_only) {  // NVML's recovery action, not an XID: judged, not counted
        counters_.recovery_actions++;
        judge.push_back(std::move(x));
        continue;
      }
      if (!xid_dedup_.Fresh(source, x.gpu_index, x.xid, now)) {
        counters_.xid_duplicates++;
        if (source != gpu::XidSource::kKernelLog) continue;
        // The kernel log's copy of an occurrence NVML told first and that
        // waits for it: judged now, as the line says.
        auto held = std::find_if(held_xids_.begin(), held_xids_.end(), [&](const HeldXid& h) {
          return h.x.gpu_index == x.gpu_index && h.x.xid == x.xid;
        });
        if (held != held_xids_.end()) {
          held_xids_.erase(held);
          occurred(x);
          judge.push_back(std::move(x));
        } else if (LineDecides(x)) {
          // Later than the wait (a log file behind rsyslog): NVML's copy
          // was judged as the catalog has it; the line's action is judged
          // too (a latched verdict keeps the worse of the two).
          judge.push_back(std::move(x));
        }
        continue;
      }
      // An XID whose verdict the kernel log's line decides (an
      // application's, whose process it names; 154's action; 144-150's
      // registers; 45's cause), from NVML, whose event carries none of it:
      // the line comes a few milliseconds later, and the XID waits for it
      // (at most kAttributionWait; then it is judged as the catalog has it).
      // (Not an XID 154 whose action NVML's field gave.)
      if (source == gpu::XidSource::kNvml && kernel_log_ && gpu::XidNeedsKernelLine(x.xid) &&
          !(x.xid == 154 && x.recovery_value >= 0)) {
        held_xids_.push_back({std::move(x), now + kAttributionWait});
        continue;
      }
      occurred(x);
      judge.push_back(std::move(x));
    }
    xids_held_ = !held_xids_.empty();
    counters_.xid_events += occurrences;
  }
  if (judge.empty()) return;
  for (gpu::XidEvent& x : judge) {
    if (x.recovery_only) {
      spdlog::warn("agent {}: GPU {}: NVML says its recovery action is now {}", config_.node,
                   x.gpu_index, x.recovery_value);
      continue;
    }
    AttributeXid(&x);
    spdlog::warn("agent {}: XID {} on GPU {}{}", config_.node, x.xid, x.gpu_index,
                 x.pid > 0 ? absl::StrCat(", process ", x.process, " (pid ", x.pid, ")") : "");
  }
  EvaluateXids(std::move(judge));
}

bool Agent::LineDecides(const gpu::XidEvent& x) {
  return (x.xid == 154 && (x.recovery_value >= 0 || !x.recovery_action.empty())) ||
         (x.xid >= 144 && x.xid <= 150 && x.intr_info.has_value()) ||
         (x.xid == 74 && !x.nvlink_regs.empty());
}

void Agent::AttributeXid(gpu::XidEvent* x) {
  // XID 159 (CHECK_UVM): a reset where UVM or vGPU is in use, else
  // nothing. The modules say which; without /sys/module, not known.
  if (x->xid == 159) {
    const std::filesystem::path modules(config_.sysfs_module);
    if (std::filesystem::is_directory(modules)) {
      x->uvm = std::filesystem::exists(modules / "nvidia_uvm") ||
               std::filesystem::exists(modules / "nvidia_vgpu_vfio");
    }
  }
  // XID 45 with no cause named: the catalog asks for a Fabric Manager
  // restart where one runs (the evaluator decides whether it is alone).
  // One process's exit logs an XID 45 per channel: /proc is looked at
  // once every 10 s at most.
  if (x->xid == 45 && x->caused_by == 0) {
    std::lock_guard<std::mutex> lock(xid_mu_);
    const common::TimePoint now = clock_->Now();
    if (!fabric_manager_seen_at_ || now - *fabric_manager_seen_at_ > std::chrono::seconds(10)) {
      fabric_manager_ = ProcessRuns("nv-fabricmanager");
      fabric_manager_seen_at_ = now;
    }
    x->fabric_manager = fabric_manager_;
  }
  if (x->pid <= 0) return;
  // A process gone since (an application often dies of its XID) cannot be
  // placed: whose it was stays unknown. The pid is the host's: an agent in
  // a container needs the host's PID namespace (hostPID) to place it.
  if (!std::filesystem::exists(absl::StrCat("/proc/", x->pid))) return;
  // A server the agent only watches has no pid here: whose the process is
  // cannot be told then.
  bool all_known = true;
  for (Supervisor* s : Servers()) {
    const ServerState st = s->state();
    if (st.watched) all_known = false;
    if (!st.supervised || !st.running || !InProcessTree(st.pid, static_cast<pid_t>(x->pid))) {
      continue;
    }
    x->owner = gpu::XidEvent::Owner::kServer;
    // NVIDIA's action for an application's XID: restart the application.
    if (gpu::IsApplicationXid(x->xid) &&
        s->Restart(absl::StrCat("XID ", x->xid, " on GPU ", x->gpu_index, " from its process ",
                                x->process, " (pid ", x->pid, "): NVIDIA's RESTART_APP"))) {
      counters_.xid_server_restarts++;
    }
    return;
  }
  if (all_known) x->owner = gpu::XidEvent::Owner::kForeign;
}

}  // namespace gpuha::agent
