#include "agent/remediation.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/log.h"
#include "gpu/pci_rebind.h"

namespace gpuha::agent {
namespace {

// After a step that succeeded, the GPU's next samples may still carry the
// verdict from before it: failures this soon do not escalate.
constexpr common::Duration kSettle = std::chrono::seconds(3);

}  // namespace

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

void Remediator::StartLocked(uint32_t gpu, RemedyStep step, const std::string& pci) {
  GpuRemedy& r = gpus_[gpu];
  r.step = step;
  r.running = true;
  r.result.clear();
  spdlog::warn("agent {}: GPU {}: remediation step {}", node_, gpu, RemedyStepName(step));
  if (step == RemedyStep::kReset && !o_.rebind_driver.empty()) {
    absl::Status s = pci.empty() ? absl::NotFoundError("its PCI address is unknown")
                                 : gpu::RebindPci(o_.sysfs_pci, pci, o_.rebind_driver);
    FinishLocked(gpu, s.ok(),
                 s.ok() ? absl::StrCat("rebound ", pci, " to ", o_.rebind_driver)
                        : absl::StrCat("rebind failed: ", s.message()));
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

std::vector<uint32_t> Remediator::Tick(const std::set<uint32_t>& failed,
                                       const std::map<uint32_t, std::string>& pci) {
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
    // Healthy for a whole window since its last step: a new fault starts over.
    if (!failed.count(gpu) && !r.running && r.step != RemedyStep::kNone &&
        r.step != RemedyStep::kHeld && now - r.done_at >= o_.window) {
      r = GpuRemedy{};
    }
  }
  for (uint32_t gpu : failed) {
    GpuRemedy& r = gpus_[gpu];
    if (r.running || r.step == RemedyStep::kHeld) continue;
    // A step that failed escalates at once; one that worked gets to settle.
    if (r.succeeded && now - r.done_at < kSettle) continue;
    RemedyStep next = NextLocked(r);
    if (next == RemedyStep::kHeld) {
      r.step = RemedyStep::kHeld;
      r.result = absl::StrCat("held out for a human after ", r.log.size(), " step(s)",
                              r.log.empty() ? "" : ": " + absl::StrJoin(r.log, "; "));
      spdlog::error("agent {}: GPU {}: {}", node_, gpu, r.result);
      continue;
    }
    auto it = pci.find(gpu);
    StartLocked(gpu, next, it == pci.end() ? "" : it->second);
  }
  return std::exchange(succeeded_, {});
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
