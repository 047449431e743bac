// Health rules: turn GPU and NIC telemetry into one node health state.
//
//   healthy   all readings inside their warn levels
//   degraded  a reading past its warn level: raise an alert, keep serving
//   draining  a reading past its critical level, an XID whose action is a
//             reset, or a GPU on the PCI bus that the driver does not list:
//             move work off while the node still serves
//   failed    a GPU lost, a NIC down, or an XID that makes the GPU
//             untrustworthy: fail over at once
//
// Hysteresis (Envoy's healthy/unhealthy thresholds): a worse state needs
// `unhealthy_threshold` consecutive samples (failed needs one), a better state
// needs `healthy_threshold`. XIDs that drain or fail latch until Reset(), since
// only a GPU reset clears them.
//
//   HealthEvaluator eval(thresholds);
//   HealthReport r = eval.Update(observation, clock.Now());
//
// Thread-safety: none; one evaluator belongs to the agent's sampling thread.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/yaml_reader.h"
#include "gpu/gpu_probe.h"
#include "gpu/nic.h"
#include "gpu/xid_catalog.h"

namespace gpuha::gpu {

enum class HealthState { kHealthy = 0, kDegraded = 1, kDraining = 2, kFailed = 3 };
const char* HealthStateName(HealthState s);  // "healthy" | "degraded" | "draining" | "failed"

// Warn and critical levels for one reading; either may be absent.
struct Threshold {
  std::optional<double> warn;
  std::optional<double> critical;
};

struct HealthThresholds {
  Threshold temperature_c{83, 90};
  Threshold memory_used_pct{95, std::nullopt};
  Threshold power_pct_of_limit{105, 120};
  // New ECC errors since the agent started (volatile counters).
  Threshold ecc_corrected{1000, std::nullopt};
  Threshold ecc_uncorrected{std::nullopt, 1};
  Threshold pages_pending{1, std::nullopt};
  // New NIC errors + drops per sample.
  Threshold nic_errors_per_sample{100, std::nullopt};
  // Hardware slowdown (thermal, power brake) counts as degraded.
  bool severe_throttle_degrades = true;
  int unhealthy_threshold = 2;
  int healthy_threshold = 6;
  // How long an XID whose consequence is "alert" keeps the node degraded.
  common::Duration xid_alert_hold = std::chrono::seconds(60);
  // An application's XID (RESTART_APP) repeated on one GPU drains it:
  // NVIDIA's XID 13 and 31 workflows read a repeat on the same GPU as its
  // hardware, and repeats on different GPUs (or one alone) as the
  // application. Occurrences less than xid_burst after the one before are
  // one burst (one fault logs XID 13 once per SM; a crashing job, a storm),
  // counted once; xid_repeat_count bursts of XID 13 or 31 within
  // xid_repeat_window drain the GPU, xid_repeat_count_other bursts of
  // another application XID. Not when the same XID hit another GPU of the
  // node within the window (the application's: an alert), nor when the
  // kernel log pins every burst on one and the same process that is not
  // the node's server (which is restarted each time, and so differs): an
  // alert naming it. 0: never. The numbers are NVSentinel's defaults (its
  // health-events analyzer: bursts split by 180 s, a 24 h look-back,
  // RepeatedXID31OnSameGPU at 2 bursts, RepeatedXIDErrorOnSameGPU at 5);
  // NVIDIA's catalog gives none.
  int xid_repeat_count = 2;
  int xid_repeat_count_other = 5;
  common::Duration xid_repeat_window = std::chrono::hours(24);
  common::Duration xid_burst = std::chrono::seconds(180);
  // XID 154 "Drain and Reset": the GPU drains at once and fails (to be
  // reset) this long after, once its work has moved.
  common::Duration xid_drain_reset = std::chrono::seconds(30);
};

// Reads `thresholds:` from an agent config; a warn above its critical, a
// negative level or an unknown reading name is an error naming the field.
void ReadHealthThresholds(common::YamlMap map, HealthThresholds* out);

struct HealthReason {
  std::string code;    // "gpu0.temperature", "nic.eth0", "gpu1.xid79"
  std::string detail;  // "91.2 C >= critical 90"
  HealthState state;
  // The GPU this fault is confined to (issue 16): heat, power, memory, ECC,
  // pending pages, throttling, and XIDs whose catalog action stops short of
  // a node reboot. -1: the node's (a NIC, a GPU off the bus or missing from
  // the driver, an XID that needs a reboot).
  int gpu = -1;
  // The MIG instance (slot) of `gpu` this fault is confined to: the slice
  // is lost while the GPU's other slices serve. -1: the whole GPU's.
  int slice = -1;
  // From an event (an XID), not a reading: no rumour to confirm, so it
  // takes effect at once, without unhealthy_threshold samples.
  bool event = false;
  // The node needs a reboot (the catalog's RESTART_BM and RESTART_VM, XID
  // 154's reboot actions): the remediator's reboot hook, once its work moved.
  bool reboot = false;
};

struct Observation {
  std::vector<GpuSample> gpus;
  std::vector<NicSample> nics;
  std::vector<XidEvent> new_xids;
  // PCI slots of NVIDIA GPUs on the bus that the driver does not list
  // (pci_presence.h): capacity the node lost, so it drains.
  std::vector<std::string> unseen_pci;
};

struct HealthReport {
  HealthState state = HealthState::kHealthy;
  // Reasons behind the state as of this sample (possibly empty when healthy).
  std::vector<HealthReason> reasons;
  bool changed = false;  // the state differs from the previous report
  // For a node that runs a server per GPU: its state from node-level
  // reasons only, and each GPU's from its own (same hysteresis). Every GPU
  // the sample saw has an entry.
  HealthState node_state = HealthState::kHealthy;
  std::map<uint32_t, HealthState> gpu_states;
  // Each MIG instance (GPU, slot) that was ever lost: its own verdict, on
  // top of its GPU's. A slice without an entry is as its GPU.
  std::map<std::pair<uint32_t, uint32_t>, HealthState> slice_states;
};

class HealthEvaluator {
 public:
  explicit HealthEvaluator(HealthThresholds thresholds);
  // `sampled`: `obs` holds fresh readings. Without (new XIDs judged on the
  // last sample's readings), only XID verdicts take effect; the readings'
  // hysteresis waits for the next sample.
  HealthReport Update(const Observation& obs, common::TimePoint now, bool sampled = true);
  // Forgets latched XIDs and counter baselines (after a GPU reset / rejoin).
  void Reset();
  // The same for one GPU, after its reset: its XIDs, baselines and verdict.
  void ResetGpu(uint32_t gpu);
  HealthState state() const { return all_.state; }
  // GPUs whose XID 154 said Drain P2P xid_drain_reset ago (or were asked
  // that long ago and did not answer): NVIDIA's step after quiescing P2P
  // is to read the recovery action again. The agent reads NVML's field and
  // gives the answer back as a recovery_only XidEvent.
  std::vector<uint32_t> RecoveryQueriesDue(common::TimePoint now);

 private:
  void CheckLevel(const std::string& code, double value, const Threshold& t, const char* unit,
                  std::vector<HealthReason>* reasons) const;
  std::vector<HealthReason> Instant(const Observation& obs, common::TimePoint now, bool sampled);

  // Envoy-style thresholds on one verdict: a worse state needs
  // unhealthy_threshold samples in a row (failed one), a better one
  // healthy_threshold. Returns whether the state changed.
  struct Hysteresis {
    HealthState state = HealthState::kHealthy;
    HealthState pending = HealthState::kHealthy;
    int count = 0;
  };
  // `event`: the worst state an event (XID) reason asks for; it takes
  // effect at once. `sampled`: a reading-driven change waits for a real
  // sample.
  bool Step(Hysteresis& h, HealthState target, HealthState event, bool sampled) const;

  const HealthThresholds t_;
  Hysteresis all_;   // every reason: the node's state without servers per GPU
  Hysteresis node_;  // node-level reasons only
  std::map<uint32_t, Hysteresis> gpus_;
  // GPUs whose last sample was stuck (GpuSample::stuck): stuck again at the
  // next sample, they are lost; the first stuck sample is no evidence yet.
  std::set<uint32_t> stuck_;
  // Of this sample's GPUs, those stuck for the first time: no reading.
  std::set<uint32_t> stuck_first_;
  std::map<std::pair<uint32_t, uint32_t>, Hysteresis> slices_;
  // Baselines for counters, per GPU index / NIC name, taken on first sight.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> ecc_base_;
  std::map<std::string, uint64_t> nic_last_errors_;
  // Latched XID reasons; alerts expire at `until`; one takes effect at
  // `from` (XID 154's reset after its drain).
  struct Latched {
    HealthReason reason;
    std::optional<common::TimePoint> until;
    std::optional<common::TimePoint> from{};
  };
  std::vector<Latched> latched_;
  // Latches `r`, or refreshes the latched reason with its code.
  void Latch(HealthReason r, std::optional<common::TimePoint> until,
             std::optional<common::TimePoint> from = std::nullopt);
  // An XID's consequence: the catalog's, or what its line or NVML says
  // (XID 154's action, 144-150's registers or the recovery action, 45's
  // cause, 159's UVM).
  struct Verdict {
    XidConsequence c;
    bool node = false;         // the node's (a reboot), not one GPU's
    std::string said{};        // what decided it, for the reason
    bool reset_after = false;  // XID 154's Drain and Reset
    int action = -1;           // XID 154's recovery action, when known
  };
  Verdict Judge(const XidEvent& x, common::TimePoint now) const;
  // A recovery action (XID 154's line or NVML's field; `code` the reason
  // it latched): a Drain P2P is asked again after xid_drain_reset; a None
  // ends the Drain P2P's drains and a pending reset.
  void RecoveryActionSaid(uint32_t gpu, int value, const std::string& code, common::TimePoint now);
  // GPUs drained for a Drain P2P (the reasons' codes), and when to read
  // their action again.
  std::map<uint32_t, std::set<std::string>> p2p_drains_;
  std::map<uint32_t, common::TimePoint> p2p_requery_;
  // The repeat rule for an application's XID (see HealthThresholds).
  void CountRepeat(const XidEvent& x, common::TimePoint now);
  // The last sample's reasons from readings (not XIDs): what an XID judged
  // without a sample sees of them.
  std::vector<HealthReason> last_readings_;
  // When each (GPU, application XID) last occurred: a burst's measure,
  // and the other GPUs' share of the repeat rule.
  std::map<std::pair<uint32_t, uint32_t>, common::TimePoint> xid_last_at_;
  // When each (GPU, alert XID) was seen within xid_repeat_window, and the
  // process the kernel log named (0: none).
  struct Seen {
    common::TimePoint at;
    int64_t pid;
    std::string process;
  };
  std::map<std::pair<uint32_t, uint32_t>, std::deque<Seen>> alert_xids_;
  // XID 13 by where it was (GPU, GPC, TPC): its last occurrence, and its
  // bursts within the window.
  struct Place {
    common::TimePoint last{};
    std::deque<common::TimePoint> bursts;
  };
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, Place> xid13_places_;
  // XID 13 in one place again: NVIDIA's and NVSentinel's same-GPC/TPC rule.
  void CountXid13Place(const XidEvent& x, common::TimePoint now);
  // XID 74 by NVSentinel's register rules (health.cc): each (GPU, rule,
  // link or -1) and its occurrences within the window; a rule met is an
  // alert to contact NVIDIA support, beside the catalog's drain.
  std::map<std::tuple<uint32_t, size_t, int64_t>, std::deque<common::TimePoint>> xid74_seen_;
  void CountXid74(const XidEvent& x, common::TimePoint now);
  // When each GPU last had an XID other than 45: an XID 45 follows it.
  std::map<uint32_t, common::TimePoint> gpu_last_xid_;
};

}  // namespace gpuha::gpu
