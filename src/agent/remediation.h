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
// Guard rails: a reset waits until the GPU's own server has stopped (the
// agent stops a failed GPU's server); the reboot hook waits until the node
// is fenced, after the agent reported it draining so that the controller
// moved its work first (make-before-break); a rebind never holds the lock
// State() takes, so heartbeats go on while sysfs blocks.
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
  };
  // Starts, polls and times out steps; returns the GPUs whose reset (or
  // rebind) just worked, to be judged again.
  std::vector<uint32_t> Tick(const Input& in);
  // Whether a GPU waits for the node to be drained and fenced before the
  // reboot hook runs: the agent then reports the node draining.
  bool RebootWanted() const;
  std::map<uint32_t, GpuRemedy> State() const;
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

  const RemediationOptions o_;
  ProcessRunner* const runner_;
  common::Clock* const clock_;
  const std::string node_;

  mutable std::mutex mu_;
  std::map<uint32_t, GpuRemedy> gpus_;  // guarded by mu_
  struct Running {
    pid_t pid = 0;
    common::TimePoint deadline{};
  };
  std::map<uint32_t, Running> running_;  // guarded by mu_
  std::vector<uint32_t> succeeded_;      // guarded by mu_; returned by the next Tick
};

}  // namespace gpuha::agent
