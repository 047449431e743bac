#include "agent/remediation.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
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

namespace {
// "GPU 3", or "the node" for the node's own reboot.
std::string Whose(uint32_t key, uint32_t node_key) {
  return key == node_key ? "the node" : absl::StrCat("GPU ", key);
}
}  // namespace

void Remediator::StartLocked(uint32_t gpu, RemedyStep step, const std::string& pci,
                             std::vector<std::pair<uint32_t, std::string>>* rebinds) {
  GpuRemedy& r = RemedyLocked(gpu);
  r.step = step;
  r.running = true;
  r.waiting = false;
  r.result.clear();
  spdlog::warn("agent {}: {}: remediation step {}", node_, Whose(gpu, kNode), RemedyStepName(step));
  if (step == RemedyStep::kReset && !o_.rebind_driver.empty()) {
    rebinds->emplace_back(gpu, pci);
    return;
  }
  std::vector<std::string> argv = step == RemedyStep::kReset ? o_.gpu_reset : o_.reboot;
  const std::string gpu_text = gpu == kNode ? "" : absl::StrCat(gpu);
  for (std::string& arg : argv) {
    arg = absl::StrReplaceAll(arg, {{"{gpu}", gpu_text}, {"{pci}", pci}, {"{node}", node_}});
  }
  absl::StatusOr<pid_t> pid = runner_->Spawn(argv);
  if (!pid.ok()) {
    FinishLocked(gpu, false, absl::StrCat("did not start: ", pid.status().message()));
    return;
  }
  running_[gpu] = {*pid, clock_->Now() + o_.timeout};
}

void Remediator::FinishLocked(uint32_t gpu, bool ok, const std::string& result) {
  GpuRemedy& r = RemedyLocked(gpu);
  r.running = false;
  r.succeeded = ok;
  r.result = result;
  r.done_at = clock_->Now();
  r.log.push_back(absl::StrCat(RemedyStepName(r.step), ": ", result));
  running_.erase(gpu);
  spdlog::log(ok ? spdlog::level::info : spdlog::level::warn,
              "agent {}: {}: remediation step {}: {}", node_, Whose(gpu, kNode),
              RemedyStepName(r.step), result);
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
    // The node's own reboot first: a GPU's reboot step waits for it.
    NodeTickLocked(in, now, &rebinds);
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
      if (next == RemedyStep::kReboot && !in.reboot_for.empty()) {
        r.step = next;
        r.waiting = true;
        r.result = "waiting for the node's own reboot";
        continue;
      }
      // Reboots are bounded however they are asked for (cool-down, count).
      bool held = false;
      if (next == RemedyStep::kReboot && !RebootAllowedLocked(&r.result, &held)) {
        r.step = held ? RemedyStep::kHeld : next;
        r.waiting = !held;
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

void Remediator::NodeTickLocked(const Input& in, common::TimePoint now,
                                std::vector<std::pair<uint32_t, std::string>>* rebinds) {
  GpuRemedy& r = node_remedy_;
  if (in.reboot_for.empty() || o_.reboot.empty()) {
    r.waiting = false;
    // Up for a whole window since its last reboot (or a human's repair of
    // a held node): a new verdict starts over.
    if (!r.running && r.step != RemedyStep::kNone && now - r.done_at >= o_.window) r = GpuRemedy{};
    return;
  }
  if (r.running || r.step == RemedyStep::kHeld) return;
  if (!r.log.empty() && !r.succeeded) {
    // The hook failed: nothing else to try.
    r.step = RemedyStep::kHeld;
    r.result = absl::StrCat("held out for a human: ", absl::StrJoin(r.log, "; "));
    spdlog::error("agent {}: the node: {}", node_, r.result);
    return;
  }
  if (r.succeeded && now - r.done_at < o_.settle) return;
  r.step = RemedyStep::kReboot;
  if (!in.node_fenced) {
    // Make-before-break: the node drains, its work moves, then the fence.
    r.waiting = true;
    r.result =
        absl::StrCat("waiting for the node's work to move and its fence (", in.reboot_for, ")");
    return;
  }
  bool held = false;
  if (!RebootAllowedLocked(&r.result, &held)) {
    r.step = held ? RemedyStep::kHeld : RemedyStep::kReboot;
    r.waiting = !held;
    if (held) spdlog::error("agent {}: the node: {}", node_, r.result);
    return;
  }
  spdlog::warn("agent {}: the node reboots: {}", node_, in.reboot_for);
  StartLocked(kNode, RemedyStep::kReboot, "", rebinds);
}

bool Remediator::RebootAllowedLocked(std::string* why, bool* held) {
  const int64_t now = clock_->UnixNanos() / 1'000'000'000;
  std::vector<int64_t> runs = reboots_;
  const std::string& path = o_.reboot_history;
  *held = true;
  if (!path.empty()) {
    runs.clear();
    absl::StatusOr<std::string> text = common::ReadFile(path);
    if (!text.ok() && !absl::IsNotFound(text.status())) {
      *why = absl::StrCat("reboot held for a human: cannot read remediation.reboot_history (",
                          text.status().message(), "), so a reboot loop could not be bounded");
      return false;
    }
    int line = 0;
    for (absl::string_view l : absl::StrSplit(text.ok() ? *text : "", '\n', absl::SkipEmpty())) {
      ++line;
      int64_t at = 0;
      if (!absl::SimpleAtoi(l, &at)) {
        *why = absl::StrCat("reboot held for a human: ", path, " line ", line, ": '", l,
                            "' is not a time (Unix seconds)");
        return false;
      }
      runs.push_back(at);
    }
  }
  const int64_t window = common::ToMillis(o_.reboot_window) / 1000;
  std::erase_if(runs, [&](int64_t at) { return now - at >= window; });
  std::sort(runs.begin(), runs.end());
  const int64_t cooldown = common::ToMillis(o_.reboot_cooldown) / 1000;
  if (static_cast<int>(runs.size()) >= o_.max_reboots) {
    *why = absl::StrCat("reboot held for a human: the hook ran ", runs.size(), " times within ",
                        window / 3600, " h (remediation.max_reboots is ", o_.max_reboots, ")");
    return false;
  }
  *held = false;
  if (!runs.empty() && now - runs.back() < cooldown) {
    *why = absl::StrCat("reboot waits for its cool-down: the hook ran ", now - runs.back(),
                        " s ago (remediation.reboot_cooldown_ms is ", cooldown * 1000, ")");
    return false;
  }
  runs.push_back(now);
  if (path.empty()) {
    reboots_ = runs;
    return true;
  }
  // Written before the hook runs: the reboot it causes must find it.
  if (absl::Status s = common::WriteFileAtomic(path, absl::StrCat(absl::StrJoin(runs, "\n"), "\n"));
      !s.ok()) {
    *held = true;
    *why = absl::StrCat("reboot held for a human: cannot write remediation.reboot_history (",
                        s.message(), "), so a reboot loop could not be bounded");
    return false;
  }
  return true;
}

bool Remediator::RebootWanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto wants = [](const GpuRemedy& r) {
    return r.step == RemedyStep::kReboot && (r.waiting || r.running);
  };
  if (wants(node_remedy_)) return true;
  for (const auto& [gpu, r] : gpus_) {
    if (wants(r)) return true;
  }
  return false;
}

void Remediator::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(gpus_, [](const auto& kv) { return !kv.second.running; });
  if (!node_remedy_.running) node_remedy_ = GpuRemedy{};
}

std::map<uint32_t, GpuRemedy> Remediator::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gpus_;
}

GpuRemedy Remediator::NodeState() const {
  std::lock_guard<std::mutex> lock(mu_);
  return node_remedy_;
}

}  // namespace gpuha::agent
