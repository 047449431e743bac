// The agent's GPUs one by one (issue 16): a server per GPU, each GPU's
// verdict in the heartbeat, the remediation steps of a failed GPU, and
// which pod holds which GPU (the kubelet's pod resources).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/log.h"
#include "gpu/pci_rebind.h"

namespace gpuha::agent {

SupervisorOptions NodeServer(const AgentConfig& c) {
  return c.per_gpu.port_base == 0 ? c.server : SupervisorOptions{};
}

RemediationOptions RemediationWithSettle(const AgentConfig& c) {
  RemediationOptions o = c.remediation;
  o.settle = std::max<common::Duration>(std::chrono::seconds(3),
                                        3 * std::chrono::milliseconds(c.sample_ms));
  return o;
}

std::vector<Supervisor*> Agent::Servers() {
  std::vector<Supervisor*> out = {&supervisor_};
  for (GpuServer& g : gpu_servers_) out.push_back(g.supervisor.get());
  return out;
}

bool Agent::ServersSupervised() {
  for (Supervisor* s : Servers()) {
    if (s->state().supervised) return true;
  }
  return false;
}

common::TimePoint Agent::FetchGpuServersReady() {
  // The GPU servers due a probe are asked at once: one wait for the round,
  // not one per server (56 on a node of 8 GPUs in 7 MIG instances).
  const common::TimePoint round = clock_->Now();
  std::vector<size_t> due;
  for (const GpuServer& g : gpu_servers_) {
    if (g.ready_slot && g.supervisor->ProbeDue()) due.push_back(*g.ready_slot);
  }
  ready_batch_.Fetch(due, config_.server.probe_timeout);
  return round;
}

void Agent::RemediateGpus() {
  Remediator::Input in;
  in.node_fenced = fenced_.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [gpu, state] : health_.gpu_states) {
      if (state == gpu::HealthState::kFailed) in.failed.insert(gpu);
    }
    for (const gpu::HealthReason& r : health_.reasons) {
      if (r.reboot && in.reboot_for.empty()) in.reboot_for = r.code + ": " + r.detail;
    }
  }
  for (const gpu::DeviceInfo& d : devices_) {
    if (std::string a = gpu::SysfsPciAddress(d.pci_bus_id); !a.empty()) in.pci[d.index] = a;
  }
  // A failed GPU's own server stops before its reset (the controller has
  // taken the GPU out), and starts again once the GPU is no longer failed.
  // Without servers per GPU, the node's server holds every GPU: the reset
  // waits for the node's fence, which stops it.
  const ServerState node_server = supervisor_.state();
  for (const gpu::DeviceInfo& d : devices_) {
    if (node_server.supervised && node_server.running) in.busy.insert(d.index);
  }
  for (GpuServer& g : gpu_servers_) {
    const bool failed = in.failed.count(g.slot.gpu) != 0;
    if (failed && !g.stopped_for_remedy) {
      g.supervisor->Fence();
      g.stopped_for_remedy = true;
    } else if (!failed && g.stopped_for_remedy) {
      if (!fenced_) g.supervisor->Unfence();
      g.stopped_for_remedy = false;
    }
    const ServerState st = g.supervisor->state();
    if (st.supervised && st.running) in.busy.insert(g.slot.gpu);
  }
  for (uint32_t gpu : remediator_.Tick(in)) {
    std::lock_guard<std::mutex> eval_lock(eval_mu_);
    evaluator_.ResetGpu(gpu);
  }
}

void Agent::AddGpuHealthLocked(v1::Heartbeat* hb) {
  const bool per_gpu = !gpu_servers_.empty();
  if (per_gpu) {
    // The node's verdict from node-level reasons only; each GPU's rides in
    // gpu_health. The node serves while any GPU's server does.
    hb->set_health(ToProto(health_.node_state));
    hb->clear_reasons();
    for (const gpu::HealthReason& r : health_.reasons) {
      if (r.gpu < 0) AddReason(r, hb->add_reasons());
    }
    bool running = false, ready = false;
    for (const GpuServer& g : gpu_servers_) {
      const ServerState st = g.supervisor->state();
      running = running || st.running || !st.supervised;
      ready = ready || st.ready;
    }
    hb->mutable_server()->set_running(running);
    hb->mutable_server()->set_ready(ready);
  }
  // A GPU whose remediation reached the reboot hook: the node drains first,
  // so the controller moves its work before the reboot (make-before-break).
  const bool reboot_wanted = remediator_.RebootWanted();
  if (reboot_wanted && hb->health() < v1::NODE_HEALTH_DRAINING) {
    hb->set_health(v1::NODE_HEALTH_DRAINING);
  }
  // Remediation under way or spent: the operator sees the step and its log.
  if (const GpuRemedy node = remediator_.NodeState(); node.step != RemedyStep::kNone) {
    v1::HealthReason* pr = hb->add_reasons();
    pr->set_code("node.remediation");
    pr->set_detail(absl::StrCat(RemedyStepName(node.step), node.running ? " running" : "",
                                node.result.empty() ? "" : ": " + node.result));
    pr->set_severity(node.step == RemedyStep::kHeld ? v1::NODE_HEALTH_FAILED
                                                    : v1::NODE_HEALTH_DRAINING);
  }
  std::map<uint32_t, v1::HealthReason> remedies;
  for (const auto& [gpu, r] : remediator_.State()) {
    if (r.step == RemedyStep::kNone) continue;
    v1::HealthReason& pr = remedies[gpu];
    pr.set_code(absl::StrCat("gpu", gpu, ".remediation"));
    pr.set_detail(absl::StrCat(RemedyStepName(r.step), r.running ? " running" : "",
                               r.result.empty() ? "" : ": " + r.result));
    pr.set_severity(r.step == RemedyStep::kHeld     ? v1::NODE_HEALTH_FAILED
                    : r.step == RemedyStep::kReboot ? v1::NODE_HEALTH_DRAINING
                                                    : v1::NODE_HEALTH_DEGRADED);
    // The node's own reasons name it without servers per GPU, and a reboot always.
    if (!per_gpu || r.step == RemedyStep::kReboot) *hb->add_reasons() = pr;
  }
  for (const GpuServer& g : gpu_servers_) {
    v1::GpuHealth* gh = hb->add_gpu_health();
    const uint32_t gpu = g.slot.gpu;
    gh->set_index(gpu);
    // A MIG instance's verdict: its GPU's, or worse where the slice is lost.
    auto st = health_.gpu_states.find(gpu);
    gpu::HealthState state =
        st == health_.gpu_states.end() ? gpu::HealthState::kHealthy : st->second;
    if (g.slot.slice) {
      gh->set_slice(*g.slot.slice);
      auto sl = health_.slice_states.find({gpu, *g.slot.slice});
      if (sl != health_.slice_states.end()) state = std::max(state, sl->second);
    }
    gh->set_health(ToProto(state));
    gh->set_server_ready(g.supervisor->state().ready);
    for (const gpu::HealthReason& r : health_.reasons) {
      if (r.gpu != static_cast<int>(gpu)) continue;
      if (r.slice >= 0 && (!g.slot.slice || static_cast<uint32_t>(r.slice) != *g.slot.slice)) {
        continue;  // another slice's
      }
      AddReason(r, gh->add_reasons());
    }
    if (auto it = remedies.find(gpu); it != remedies.end()) *gh->add_reasons() = it->second;
  }
}

void Agent::PodResourcesLoop(const std::string& socket) {
  spdlog::info("agent {}: reading pod labels from the kubelet at {}", config_.node, socket);
  PodResourcesClient kubelet(socket);
  bool failing = false;
  while (!stopping_.load()) {
    auto list = kubelet.List(std::chrono::seconds(2));
    if (list.ok()) {
      GpuOwners owners = GpuOwnersFromList(*list, devices_);
      std::lock_guard<std::mutex> lock(mu_);
      gpu_owners_ = std::move(owners);
    } else {
      // The last answer stays: pods keep their GPUs while the kubelet restarts.
      counters_.pod_resources_errors++;
      if (!failing) spdlog::warn("agent {}: {}", config_.node, list.status().message());
    }
    if (failing && list.ok()) spdlog::info("agent {}: the kubelet answers again", config_.node);
    failing = !list.ok();
    WaitFor(config_.pod_resources_interval);
  }
}

}  // namespace gpuha::agent
