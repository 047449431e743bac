#include "agent/remediation.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/log.h"
#include "gpu/pci_rebind.h"

namespace gpuha::agent {

const char* RemedyStepName(RemedyStep s) {
  switch (s) {
    case RemedyStep::kNone:
      return "none";
    case RemedyStep::kReset:
      return "reset";
    case RemedyStep::kReboot:
      return "reboot";
    case RemedyStep::kHeld:
      return "held";
  }
  return "none";
}

Remediator::Remediator(RemediationOptions options, ProcessRunner* runner, common::Clock* clock,
                       std::string node)
    : o_(std::move(options)), runner_(runner), clock_(clock), node_(std::move(node)) {}

Remediator::~Remediator() { Shutdown(); }

void Remediator::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [gpu, r] : running_) runner_->Signal(r.pid, SIGKILL);
  running_.clear();
}

RemedyStep Remediator::NextLocked(const GpuRemedy& r) const {
  const bool reset = !o_.gpu_reset.empty() || !o_.rebind_driver.empty();
  if (r.step == RemedyStep::kNone && reset) return RemedyStep::kReset;
  if ((r.step == RemedyStep::kNone || r.step == RemedyStep::kReset) && !o_.reboot.empty()) {
    return RemedyStep::kReboot;
  }
  return RemedyStep::kHeld;
}

void Remediator::StartLocked(uint32_t gpu, RemedyStep step, const std::string& pci,
                             std::vector<std::pair<uint32_t, std::string>>* rebinds) {
  GpuRemedy& r = gpus_[gpu];
  r.step = step;
  r.running = true;
  r.waiting = false;
  r.result.clear();
  spdlog::warn("agent {}: GPU {}: remediation step {}", node_, gpu, RemedyStepName(step));
  if (step == RemedyStep::kReset && !o_.rebind_driver.empty()) {
    rebinds->emplace_back(gpu, pci);
    return;
  }
  std::vector<std::string> argv = step == RemedyStep::kReset ? o_.gpu_reset : o_.reboot;
  for (std::string& arg : argv) {
    arg =
        absl::StrReplaceAll(arg, {{"{gpu}", absl::StrCat(gpu)}, {"{pci}", pci}, {"{node}", node_}});
  }
  absl::StatusOr<pid_t> pid = runner_->Spawn(argv);
  if (!pid.ok()) {
    FinishLocked(gpu, false, absl::StrCat("did not start: ", pid.status().message()));
    return;
  }
  running_[gpu] = {*pid, clock_->Now() + o_.timeout};
}

void Remediator::FinishLocked(uint32_t gpu, bool ok, const std::string& result) {
  GpuRemedy& r = gpus_[gpu];
  r.running = false;
  r.succeeded = ok;
  r.result = result;
  r.done_at = clock_->Now();
  r.log.push_back(absl::StrCat(RemedyStepName(r.step), ": ", result));
  running_.erase(gpu);
  spdlog::log(ok ? spdlog::level::info : spdlog::level::warn,
              "agent {}: GPU {}: remediation step {}: {}", node_, gpu, RemedyStepName(r.step),
              result);
  if (ok && r.step == RemedyStep::kReset) succeeded_.push_back(gpu);
}

std::vector<uint32_t> Remediator::Tick(const Input& in) {
  std::vector<std::pair<uint32_t, std::string>> rebinds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const common::TimePoint now = clock_->Now();
    for (const auto& [gpu, run] : std::map<uint32_t, Running>(running_)) {
      if (std::optional<std::string> exit = runner_->Poll(run.pid)) {
        FinishLocked(gpu, *exit == "exit 0", *exit);
      } else if (now >= run.deadline) {
        runner_->Signal(run.pid, SIGKILL);
        FinishLocked(gpu, false,
                     absl::StrCat("timed out after ", common::ToMillis(o_.timeout), " ms"));
      }
    }
    for (auto& [gpu, r] : gpus_) {
      // Healthy for a whole window since its last step (a human's repair
      // of a held GPU too): a new fault starts over.
      if (!in.failed.count(gpu) && !r.running && r.step != RemedyStep::kNone &&
          now - r.done_at >= o_.window) {
        r = GpuRemedy{};
      }
      // A GPU no longer failed stops waiting for a guard.
      if (!in.failed.count(gpu)) r.waiting = false;
    }
    for (uint32_t gpu : in.failed) {
      GpuRemedy& r = gpus_[gpu];
      if (r.running || r.step == RemedyStep::kHeld) continue;
      // A step that failed escalates at once; one that worked gets to settle.
      if (r.succeeded && !r.waiting && now - r.done_at < o_.settle) continue;
      RemedyStep next = r.waiting ? r.step : NextLocked(r);
      if (next == RemedyStep::kHeld) {
        r.step = RemedyStep::kHeld;
        r.result = absl::StrCat("held out for a human after ", r.log.size(), " step(s)",
                                r.log.empty() ? "" : ": " + absl::StrJoin(r.log, "; "));
        spdlog::error("agent {}: GPU {}: {}", node_, gpu, r.result);
        continue;
      }
      // Guard rails: a reset waits for the GPU's own server to stop, the
      // reboot for the node's work to move and the fence.
      const bool blocked = next == RemedyStep::kReset ? in.busy.count(gpu) != 0 : !in.node_fenced;
      if (blocked) {
        r.step = next;
        r.waiting = true;
        r.result = next == RemedyStep::kReset ? "waiting for the GPU's server to stop"
                                              : "waiting for the node's work to move and its fence";
        continue;
      }
      auto it = in.pci.find(gpu);
      StartLocked(gpu, next, it == in.pci.end() ? "" : it->second, &rebinds);
    }
  }
  // sysfs may block in the kernel (a wedged GPU's unbind): not under the
  // lock that State() takes, so heartbeats go on meanwhile.
  for (const auto& [gpu, pci] : rebinds) {
    absl::Status s = pci.empty() ? absl::NotFoundError("its PCI address is unknown")
                                 : gpu::RebindPci(o_.sysfs_pci, pci, o_.rebind_driver);
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(gpu, s.ok(),
                 s.ok() ? absl::StrCat("rebound ", pci, " to ", o_.rebind_driver)
                        : absl::StrCat("rebind failed: ", s.message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(succeeded_, {});
}

bool Remediator::RebootWanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [gpu, r] : gpus_) {
    if (r.step == RemedyStep::kReboot && (r.waiting || r.running)) return true;
  }
  return false;
}

void Remediator::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(gpus_, [](const auto& kv) { return !kv.second.running; });
}

std::map<uint32_t, GpuRemedy> Remediator::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gpus_;
}

}  // namespace gpuha::agent
