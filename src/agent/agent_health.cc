// The agent's sampling and judging (agent.h): the GPUs sampled on their
// cadence, XID events as they come, and the evaluator's verdict on both.
// Split from agent.cc, which keeps the lifecycle and the controller stream
// (driver_watch.cc has the kernel log and the XIDs' reporting).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/log.h"

namespace gpuha::agent {

using std::chrono::milliseconds;

gpu::HealthState Agent::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_.state;
}

void Agent::Evaluate() {
  gpu::Observation obs;
  std::unique_lock<std::mutex> sample_lock(sample_mu_);
  // GPUs drained for a Drain P2P: NVIDIA's next step is to read the
  // recovery action again; the answer is judged with this sample.
  std::vector<uint32_t> requery;
  {
    std::lock_guard<std::mutex> eval_lock(eval_mu_);
    requery = evaluator_.RecoveryQueriesDue(clock_->Now());
  }
  for (uint32_t gpu : requery) {
    std::optional<int> action = probe_->RecoveryAction(gpu);
    spdlog::info("agent {}: GPU {}: recovery action read again after Drain P2P: {}", config_.node,
                 gpu, action ? absl::StrCat(*action) : "not known (NVML cannot say)");
    if (!action) continue;
    gpu::XidEvent x{gpu, 154, clock_->UnixNanos()};
    x.recovery_value = *action;
    x.recovery_only = true;
    counters_.recovery_actions++;
    obs.new_xids.push_back(std::move(x));
  }
  {
    std::vector<uint32_t> indexes;
    for (const gpu::DeviceInfo& d : devices_) indexes.push_back(d.index);
    // In parallel under one deadline: a driver hung on every GPU costs one.
    std::vector<absl::StatusOr<gpu::GpuSample>> samples = probe_->SampleAll(indexes);
    for (size_t i = 0; i < samples.size(); ++i) {
      if (!samples[i].ok()) {
        counters_.probe_errors++;
        spdlog::warn("agent: sampling GPU {} failed: {}", indexes[i],
                     samples[i].status().message());
        continue;
      }
      obs.gpus.push_back(std::move(*samples[i]));
    }
    counters_.gpu_calls_hung = probe_->hung_calls();
    if (!pci_devices_.empty()) CheckPci(&obs);
    for (const std::string& nic : config_.nics)
      obs.nics.push_back(gpu::ReadNic(config_.sysfs_net, nic));
  }
  counters_.samples++;
  // Judged in the order sampled: the evaluator's lock is taken before the
  // sample's is let go.
  std::lock_guard<std::mutex> eval_lock(eval_mu_);
  sample_lock.unlock();
  JudgeLocked(std::move(obs), /*sampled=*/true);
}

void Agent::EvaluateXids(std::vector<gpu::XidEvent> xids) {
  // An XID is judged at once, with the last sample's reasons: it does not
  // wait for the GPUs to be sampled again (a pass of every NVML call on a
  // real driver takes 45 ms a GPU, and the XID's verdict waited for it).
  gpu::Observation obs;
  obs.new_xids = std::move(xids);
  std::lock_guard<std::mutex> eval_lock(eval_mu_);
  JudgeLocked(std::move(obs), /*sampled=*/false);
}

void Agent::JudgeLocked(gpu::Observation obs, bool sampled) {
  const std::vector<gpu::XidEvent>& xids = obs.new_xids;
  gpu::HealthReport report = evaluator_.Update(obs, clock_->Now(), sampled);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sampled) {
      samples_ = std::move(obs.gpus);
      nics_ = std::move(obs.nics);
      ++sample_seq_;
    }
    for (const gpu::XidEvent& x : xids) {
      if (x.recovery_only) continue;  // not an XID
      last_xid_[x.gpu_index] = x.xid;
      unsent_xids_.push_back(x);
    }
    if (report.changed) {
      health_changed_unix_nanos_ = clock_->UnixNanos();
      std::string why = report.reasons.empty()
                            ? "all readings normal"
                            : report.reasons.front().code + ": " + report.reasons.front().detail;
      spdlog::warn("agent {}: health {} -> {} ({})", config_.node,
                   gpu::HealthStateName(health_.state), gpu::HealthStateName(report.state), why);
    }
    // A node with servers per GPU reports each GPU's (and slice's) state and the node's.
    const bool split_changed = report.node_state != health_.node_state ||
                               report.gpu_states != health_.gpu_states ||
                               report.slice_states != health_.slice_states;
    wake = report.changed || split_changed || !xids.empty();
    urgent_ = urgent_ || wake;
    health_ = std::move(report);
  }
  if (wake) WakeHeartbeat();
}

void Agent::SampleLoop() {
  while (!stopping_) {
    WaitFor(milliseconds(config_.sample_ms));
    if (stopping_) break;
    Evaluate();
  }
}

void Agent::EventLoop() {
  // The probe wakes at once for an XID; the timeout bounds shutdown. A
  // driver whose event wait hangs is the watchdog's error, after the
  // timeout plus its deadline.
  int failing = 0;  // waits in a row that failed; logged at the first and each minute
  while (!stopping_) {
    // Sooner while an XID waits for its kernel log line.
    auto xids = probe_->WaitForXids(milliseconds(xids_held_ ? 25 : 500));
    if (!xids.ok()) {
      counters_.probe_errors++;
      if (failing++ % 60 == 0) {
        spdlog::warn("agent {}: waiting for XID events failed ({} in a row): {}", config_.node,
                     failing, xids.status().message());
      }
      WaitFor(milliseconds(1000));
      continue;
    }
    failing = 0;
    ReportXids(std::move(*xids), gpu::XidSource::kNvml);
  }
}

}  // namespace gpuha::agent
