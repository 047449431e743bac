// Remediation in steps for a failed GPU (issue 16), with guard rails: first
// a GPU reset (a configured command, or on a passthrough host a rebind of
// the GPU's PCI function through sysfs), then the node reboot hook, then the
// GPU is held out for a human. Each step is a command with a timeout
// ({gpu}, {pci} and {node} filled). A step that exits 0 lets the GPU be
// judged again: the agent forgets what its XIDs latched and restarts that
// GPU's server, and the controller takes the GPU back only once its server
// answers ready and its reports stay healthy for recovery.healthy_for. A GPU
// that fails again within `window` of a step goes to the next one; one
// that stays healthy for `window` starts again at the first.
//
// A node whose own verdict asks for a reboot (an XID whose catalog action
// is RESTART_BM or RESTART_VM, XID 154's reboot actions) goes to the reboot
// hook directly, as NVSentinel's remediation does.
//
// Guard rails: a reset waits until the GPU's own server has stopped (the
// agent stops a failed GPU's server); the reboot hook waits until the node
// is fenced, after the agent reported it draining so that the controller
// moved its work first (make-before-break), and so waits while the
// controller's quarantine breaker holds the node's verdict; a rebind never
// holds the lock State() takes, so heartbeats go on while sysfs blocks.
// Reboots are bounded across the reboots themselves: each run of the hook
// is written to `reboot_history` first; none runs within `reboot_cooldown`
// of the last, and after `max_reboots` within `reboot_window` the node is
// held for a human (NVSentinel's breaker: 5 remediations in 7 days go to
// support). A history that cannot be read or written holds the reboot: a
// loop it could not bound is worse than a node left out.
//
//   Remediator r(options, &runner, clock, node);
//   for (uint32_t gpu : r.Tick({failed, pci, busy, fenced})) it is judged again;
//
// Thread-safety: Tick and State lock; Tick belongs to one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process.h"
#include "common/clock.h"

namespace gpuha::agent {

struct RemediationOptions {
  std::vector<std::string> gpu_reset;  // e.g. [nvidia-smi, --gpu-reset, -i, "{gpu}"]; empty: none
  // Instead of gpu_reset: rebind the GPU's PCI function to this driver
  // ("nvidia", or "vfio-pci" to hand it to a guest) under sysfs_pci.
  std::string rebind_driver;
  std::string sysfs_pci = "/sys/bus/pci";
  std::vector<std::string> reboot;  // the node reboot hook; empty: none
  common::Duration timeout = std::chrono::seconds(60);
  common::Duration window = std::chrono::minutes(10);
  // After a step that worked, failures this soon still carry the verdict
  // from before it and do not escalate (the agent sets 3 samples, 3 s at
  // least).
  common::Duration settle = std::chrono::seconds(3);
  // When the reboot hook ran (Unix seconds, one a line); "" keeps them in
  // memory only (tests).
  std::string reboot_history = "/var/lib/gpuha-agent/reboots";
  common::Duration reboot_cooldown = std::chrono::hours(1);
  int max_reboots = 5;
  common::Duration reboot_window = std::chrono::hours(24 * 7);
  bool enabled() const { return !gpu_reset.empty() || !rebind_driver.empty() || !reboot.empty(); }
};

enum class RemedyStep { kNone, kReset, kReboot, kHeld };
const char* RemedyStepName(RemedyStep s);  // "none", "reset", "reboot", "held"

// One GPU's remediation so far.
struct GpuRemedy {
  RemedyStep step = RemedyStep::kNone;  // the step running or done last
  bool running = false;
  bool waiting = false;         // the step waits for its guard (server stopped, node fenced)
  bool succeeded = false;       // the last step ended well
  std::string result;           // the last step's: "exit 0", "timed out after 60000 ms"
  common::TimePoint done_at{};  // when the last step ended
  // Each step's outcome since the GPU last stayed healthy ("reset: exit 1").
  std::vector<std::string> log;
};

class Remediator {
 public:
  Remediator(RemediationOptions options, ProcessRunner* runner, common::Clock* clock,
             std::string node);
  ~Remediator();
  struct Input {
    std::set<uint32_t> failed;            // GPUs whose own verdict is failed now
    std::map<uint32_t, std::string> pci;  // each GPU's PCI address
    std::set<uint32_t> busy;              // GPUs whose own server still runs
    bool node_fenced = false;             // the node's work moved and it is fenced
    // Why the node's own verdict asks for a reboot ("" when it does not).
    std::string reboot_for{};
  };
  // Starts, polls and times out steps; returns the GPUs whose reset (or
  // rebind) just worked, to be judged again.
  std::vector<uint32_t> Tick(const Input& in);
  // Whether a GPU waits for the node to be drained and fenced before the
  // reboot hook runs: the agent then reports the node draining.
  bool RebootWanted() const;
  std::map<uint32_t, GpuRemedy> State() const;
  // The node's own reboot (reboot_for), as a GPU's steps are told.
  GpuRemedy NodeState() const;
  // Forgets every GPU's steps but a running one's (the node rejoined, after
  // a reboot or a human's repair): held GPUs start over.
  void Reset();
  // Kills a step still running (agent shutdown).
  void Shutdown();

 private:
  // Starts a command step; a rebind is left in `rebinds` for Tick to run
  // without the lock.
  void StartLocked(uint32_t gpu, RemedyStep step, const std::string& pci,
                   std::vector<std::pair<uint32_t, std::string>>* rebinds);
  void FinishLocked(uint32_t gpu, bool ok, const std::string& result);
  RemedyStep NextLocked(const GpuRemedy& r) const;
  GpuRemedy& RemedyLocked(uint32_t key) { return key == kNode ? node_remedy_ : gpus_[key]; }
  // Whether the reboot hook may run now; if not, why (`*held`: for good,
  // else until the cool-down ends). Records the run when it may.
  bool RebootAllowedLocked(std::string* why, bool* held);
  // The node's own reboot, for Input::reboot_for.
  void NodeTickLocked(const Input& in, common::TimePoint now,
                      std::vector<std::pair<uint32_t, std::string>>* rebinds);
  // The node's reboot in running_ and succeeded_'s stead of a GPU's.
  static constexpr uint32_t kNode = UINT32_MAX;

  const RemediationOptions o_;
  ProcessRunner* const runner_;
  common::Clock* const clock_;
  const std::string node_;

  mutable std::mutex mu_;
  std::map<uint32_t, GpuRemedy> gpus_;  // guarded by mu_
  GpuRemedy node_remedy_;               // guarded by mu_
  // When the reboot hook ran (Unix seconds), without reboot_history.
  std::vector<int64_t> reboots_;  // guarded by mu_
  struct Running {
    pid_t pid = 0;
    common::TimePoint deadline{};
  };
  std::map<uint32_t, Running> running_;  // guarded by mu_
  std::vector<uint32_t> succeeded_;      // guarded by mu_; returned by the next Tick
};

}  // namespace gpuha::agent
