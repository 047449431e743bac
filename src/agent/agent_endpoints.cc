// The agent's HTTP endpoints (agent.h): /metrics in dcgm-exporter's names,
// /healthz, and the sim backend's live fault injection. Split from agent.cc,
// which keeps the lifecycle, the evaluation and the controller stream.
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/log.h"
#include "common/prometheus.h"
#include "gpu/fault_script.h"

namespace gpuha::agent {

std::string Agent::MetricsText() const {
  common::PromText p;
  std::lock_guard<std::mutex> lock(mu_);
  auto gpu_labels = [&](uint32_t index) {
    const gpu::DeviceInfo* d = index < devices_.size() ? &devices_[index] : nullptr;
    return common::PromLabels{{"gpu", std::to_string(index)},
                              {"UUID", d ? d->uuid : ""},
                              {"modelName", d ? d->name : ""},
                              {"Hostname", config_.node}};
  };
  // dcgm-exporter's names and units, so existing Grafana dashboards work.
  struct GpuFamily {
    const char* name;
    const char* help;
    double (*value)(const gpu::GpuSample&);
  };
  static const GpuFamily kGpuFamilies[] = {
      {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
       [](const gpu::GpuSample& s) { return s.temperature_c; }},
      {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
       [](const gpu::GpuSample& s) { return s.power_w; }},
      {"DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).",
       [](const gpu::GpuSample& s) { return s.power_limit_w; }},
      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
       [](const gpu::GpuSample& s) { return double(s.memory_used_bytes >> 20); }},
      {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
       [](const gpu::GpuSample& s) {
         return double((s.memory_total_bytes - s.memory_used_bytes) >> 20);
       }},
      {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
       [](const gpu::GpuSample& s) { return double(s.utilization_pct); }},
      {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).",
       [](const gpu::GpuSample& s) { return double(s.throttle_reasons); }},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.",
       [](const gpu::GpuSample& s) { return double(s.ecc_corrected); }},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.",
       [](const gpu::GpuSample& s) { return double(s.ecc_uncorrected); }},
      {"DCGM_FI_DEV_RETIRED_PENDING", "Pages pending retirement or row remapping.",
       [](const gpu::GpuSample& s) { return double(s.pages_pending); }},
  };
  for (const GpuFamily& f : kGpuFamilies) {
    p.Family(f.name, "gauge", f.help);
    for (const gpu::GpuSample& s : samples_) {
      if (!s.lost) p.Sample(f.name, gpu_labels(s.index), f.value(s));
    }
  }
  p.Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.");
  for (const gpu::DeviceInfo& d : devices_) {
    auto it = last_xid_.find(d.index);
    p.Sample("DCGM_FI_DEV_XID_ERRORS", gpu_labels(d.index), it == last_xid_.end() ? 0 : it->second);
  }
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
      if (fault->kind != gpu::FaultKind::kXid) Evaluate({});
    }
  } else {
    out.status = 404;
    out.body = "not found\n";
  }
  return out;
}

}  // namespace gpuha::agent
