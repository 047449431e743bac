// The agent's HTTP endpoints (agent.h): /metrics in dcgm-exporter's names,
// /healthz, and the sim backend's live fault injection. Split from agent.cc,
// which keeps the lifecycle, the evaluation and the controller stream.
#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "gpu/fault_script.h"

namespace gpuha::agent {

namespace {

// dcgm-exporter's default counters (its default-counters.csv): names, types
// and units as it writes them, so its Grafana dashboards and alerts work on
// gpuha's page. A reading the device does not report is left out.
struct DcgmFamily {
  const char* name;
  const char* type;
  const char* help;
  std::optional<double> (*value)(const gpu::GpuSample&);
};
template <typename T>
std::optional<double> Opt(const std::optional<T>& v) {
  return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
}
const DcgmFamily kDcgmFamilies[] = {
    {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
     [](const gpu::GpuSample& s) { return Opt(s.sm_clock_mhz); }},
    {"DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
     [](const gpu::GpuSample& s) { return Opt(s.memory_clock_mhz); }},
    {"DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
     [](const gpu::GpuSample& s) { return s.memory_temperature_c; }},
    {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
     [](const gpu::GpuSample& s) { return std::optional(s.temperature_c); }},
    {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
     [](const gpu::GpuSample& s) { return std::optional(s.power_w); }},
    {"DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).",
     [](const gpu::GpuSample& s) { return std::optional(s.power_limit_w); }},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).",
     [](const gpu::GpuSample& s) { return Opt(s.energy_mj); }},
    // DCGM's PCIe figures are rates, as NVML's throughput is.
    {"DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe transmit throughput (in B/s), via NVML.",
     [](const gpu::GpuSample& s) { return s.pcie_tx_bytes_per_s; }},
    {"DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe receive throughput (in B/s), via NVML.",
     [](const gpu::GpuSample& s) { return s.pcie_rx_bytes_per_s; }},
    {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
     [](const gpu::GpuSample& s) { return Opt(s.pcie_replays); }},
    {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total NVLink data sent and received over all links (in KiB).",
     [](const gpu::GpuSample& s) { return Opt(s.nvlink_kib_total); }},
    {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
     [](const gpu::GpuSample& s) { return std::optional<double>(s.utilization_pct); }},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
     [](const gpu::GpuSample& s) { return Opt(s.memory_copy_util_pct); }},
    {"DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
     [](const gpu::GpuSample& s) { return Opt(s.encoder_util_pct); }},
    {"DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
     [](const gpu::GpuSample& s) { return Opt(s.decoder_util_pct); }},
    {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     [](const gpu::GpuSample& s) { return std::optional<double>(s.memory_used_bytes >> 20); }},
    {"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     [](const gpu::GpuSample& s) {
       return std::optional<double>((s.memory_total_bytes - s.memory_used_bytes) >> 20);
     }},
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask).",
     [](const gpu::GpuSample& s) { return std::optional<double>(s.throttle_reasons); }},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
     [](const gpu::GpuSample& s) { return std::optional<double>(s.ecc_corrected); }},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
     [](const gpu::GpuSample& s) { return std::optional<double>(s.ecc_uncorrected); }},
    {"DCGM_FI_DEV_RETIRED_SBE", "counter",
     "Total number of retired pages due to single-bit errors.",
     [](const gpu::GpuSample& s) { return Opt(s.retired_pages_sbe); }},
    {"DCGM_FI_DEV_RETIRED_DBE", "counter",
     "Total number of retired pages due to double-bit errors.",
     [](const gpu::GpuSample& s) { return Opt(s.retired_pages_dbe); }},
    // dcgm-exporter declares this one a counter; it is a 0/1 state that
    // clears at a GPU reset, so it is a gauge here. Absent where the GPU
    // remaps rows instead (it answers Not Supported): ROW_REMAP_PENDING.
    {"DCGM_FI_DEV_RETIRED_PENDING", "gauge", "Whether pages are pending retirement.",
     [](const gpu::GpuSample& s) { return Opt(s.retired_pages_pending); }},
    {"DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending.",
     [](const gpu::GpuSample& s) { return Opt(s.row_remap_pending); }},
    {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors.",
     [](const gpu::GpuSample& s) { return Opt(s.remapped_rows_correctable); }},
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors.",
     [](const gpu::GpuSample& s) { return Opt(s.remapped_rows_uncorrectable); }},
    {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed.",
     [](const gpu::GpuSample& s) { return Opt(s.row_remap_failed); }},
    // A guest's own vGPU (NVML's licensable features); DCGM reads it per vGPU
    // instance on the hypervisor. Absent on bare metal.
    {"DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status (1: licensed).",
     [](const gpu::GpuSample& s) { return Opt(s.vgpu_licensed); }},
};

std::string OsHostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

void Agent::AppendDcgmFamilies(common::PromText* p) const {
  // dcgm-exporter's labels; Hostname is the OS host name, as there.
  static const std::string hostname = OsHostname();
  auto labels = [&](uint32_t index) {
    const gpu::DeviceInfo* d = index < devices_.size() ? &devices_[index] : nullptr;
    return common::PromLabels{
        {"gpu", std::to_string(index)},
        {"UUID", d ? d->uuid : ""},
        {"pci_bus_id", d ? d->pci_bus_id : ""},
        {"device", absl::StrCat("nvidia", d && d->minor_number ? *d->minor_number : index)},
        {"modelName", d ? d->name : ""},
        {"Hostname", hostname},
        {"DCGM_FI_DRIVER_VERSION", d ? d->driver_version : ""}};
  };
  // Under Kubernetes, a GPU's series carries the pod, namespace and container
  // holding it, once per holder where time-slicing shares the GPU, as
  // dcgm-exporter writes them; a GPU no pod holds has none.
  auto sample = [&](const char* name, uint32_t index, double v) {
    auto it = gpu_owners_.find(index);
    if (it == gpu_owners_.end() || it->second.empty()) {
      p->Sample(name, labels(index), v);
      return;
    }
    for (const PodRef& owner : it->second) {
      common::PromLabels l = labels(index);
      l.insert(l.end(),
               {{"pod", owner.pod}, {"namespace", owner.ns}, {"container", owner.container}});
      p->Sample(name, l, v);
    }
  };
  for (const DcgmFamily& f : kDcgmFamilies) {
    p->Family(f.name, f.type, f.help);
    for (const gpu::GpuSample& s : samples_) {
      if (s.lost) continue;
      if (std::optional<double> v = f.value(s)) sample(f.name, s.index, *v);
    }
  }
  p->Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.");
  for (const gpu::DeviceInfo& d : devices_) {
    auto it = last_xid_.find(d.index);
    sample("DCGM_FI_DEV_XID_ERRORS", d.index, it == last_xid_.end() ? 0 : it->second);
  }
}

std::string Agent::MetricsText() const {
  common::PromText p;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> xids;  // copied first: xid_mu_ is not
  {                                                        // taken under mu_
    std::lock_guard<std::mutex> lock(xid_mu_);
    xids = xids_by_code_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (config_.dcgm_names) AppendDcgmFamilies(&p);
  // gpuha's own series take Prometheus' snake_case label names; the DCGM
  // ones above keep dcgm-exporter's (UUID, modelName, Hostname).
  p.Family("gpuha_agent_gpu_lost", "gauge", "1 when the GPU stopped answering.");
  for (const gpu::GpuSample& s : samples_) {
    const gpu::DeviceInfo* d = s.index < devices_.size() ? &devices_[s.index] : nullptr;
    p.Sample("gpuha_agent_gpu_lost",
             {{"node", config_.node}, {"gpu", std::to_string(s.index)}, {"uuid", d ? d->uuid : ""}},
             s.lost);
  }
  const common::PromLabels node{{"node", config_.node}};
  p.Family("gpuha_agent_health_state", "gauge", "1 for the node's current health state.");
  for (auto st : {gpu::HealthState::kHealthy, gpu::HealthState::kDegraded,
                  gpu::HealthState::kDraining, gpu::HealthState::kFailed}) {
    p.Sample("gpuha_agent_health_state",
             {{"node", config_.node}, {"state", gpu::HealthStateName(st)}}, health_.state == st);
  }
#define GPUHA_SAMPLE(name, help)                            \
  p.Family("gpuha_agent_" #name "_total", "counter", help); \
  p.Sample("gpuha_agent_" #name "_total", node, double(counters_.name.load()));
  GPUHA_AGENT_COUNTERS(GPUHA_SAMPLE)
#undef GPUHA_SAMPLE
  p.Family("gpuha_agent_xids_total", "counter",
           "XID occurrences by GPU and XID (each once, NVML and kernel log together).");
  for (const auto& [at, n] : xids) {
    p.Sample("gpuha_agent_xids_total",
             {{"node", config_.node},
              {"gpu", std::to_string(at.first)},
              {"xid", std::to_string(at.second)}},
             double(n));
  }
  ServerState server = supervisor_.state();
  p.Family("gpuha_agent_controller_connected", "gauge", "1 while a controller stream is open.");
  p.Sample("gpuha_agent_controller_connected", node, connected_.load());
  p.Family("gpuha_agent_fenced", "gauge", "1 while the node is fenced.");
  p.Sample("gpuha_agent_fenced", node, fenced_.load());
  p.Family("gpuha_agent_epoch", "gauge", "Highest cluster epoch seen.");
  p.Sample("gpuha_agent_epoch", node, double(epoch_.load()));
  p.Family("gpuha_agent_server_ready", "gauge", "1 while the inference server is ready.");
  p.Sample("gpuha_agent_server_ready", node, server.ready);
  p.Family("gpuha_agent_server_restarts_total", "counter", "Inference server restarts.");
  p.Sample("gpuha_agent_server_restarts_total", node, server.restarts);
  common::AppendProcessFamilies("agent", &p);
  return p.str();
}

common::HttpResponse Agent::HandleHttp(const common::HttpRequest& r) {
  common::HttpResponse out;
  if (r.method == "GET" && r.path == "/metrics") {
    out.content_type = common::PromText::kContentType;
    out.body = MetricsText();
  } else if (r.method == "GET" && r.path == "/healthz") {
    out.content_type = "application/json";
    out.body = absl::StrCat("{\"node\":\"", config_.node, "\",\"health\":\"",
                            gpu::HealthStateName(health()),
                            "\",\"connected\":", connected_ ? "true" : "false",
                            ",\"fenced\":", fenced_ ? "true" : "false", "}\n");
  } else if (r.method == "POST" && r.path == "/v1/sim/faults") {
    // Live fault injection for drills and the demo; only the sim backend has it.
    if (sim_ == nullptr) {
      out.status = 404;
      out.body = "fault injection needs --gpu sim\n";
      return out;
    }
    auto fault = gpu::ParseFaultSpec(r.body);
    absl::Status s = fault.ok() ? sim_->Inject(*fault) : fault.status();
    out.status = s.ok() ? 202 : 400;
    out.body = s.ok() ? "injected\n" : absl::StrCat(s.message(), "\n");
    if (s.ok()) {
      spdlog::warn("agent {}: injected fault {} on GPU {}", config_.node,
                   gpu::FaultKindName(fault->kind), fault->gpu);
      // An XID travels the real path (the event thread); other faults show at once.
      if (fault->kind != gpu::FaultKind::kXid) Evaluate();
    }
  } else {
    out.status = 404;
    out.body = "not found\n";
  }
  return out;
}

}  // namespace gpuha::agent
