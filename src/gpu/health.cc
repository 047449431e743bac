#include "gpu/health.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config_fields.h"
#include "gpu/xid_catalog.h"
#include "gpu/xid_nvlink5.h"

namespace gpuha::gpu {

const char* HealthStateName(HealthState s) {
  switch (s) {
    case HealthState::kHealthy:
      return "healthy";
    case HealthState::kDegraded:
      return "degraded";
    case HealthState::kDraining:
      return "draining";
    case HealthState::kFailed:
      return "failed";
  }
  return "failed";
}

void ReadHealthThresholds(common::YamlMap map, HealthThresholds* out) {
  auto level = [&](const char* key, Threshold* t) {
    if (!map.Has(key)) {
      map.Allow(key);
      return;
    }
    common::YamlMap m = map.Map(key);
    if (m.Has("warn")) t->warn = m.Number("warn");
    if (m.Has("critical")) t->critical = m.Number("critical");
    if ((t->warn && *t->warn < 0) || (t->critical && *t->critical < 0)) {
      m.Fail(t->warn && *t->warn < 0 ? "warn" : "critical", "must not be negative");
    } else if (t->warn && t->critical && *t->warn > *t->critical) {
      m.Fail("warn", absl::StrCat("warn (", *t->warn, ") is above critical (", *t->critical, ")"));
    }
  };
  level("temperature_c", &out->temperature_c);
  level("memory_used_pct", &out->memory_used_pct);
  level("power_pct_of_limit", &out->power_pct_of_limit);
  level("ecc_corrected", &out->ecc_corrected);
  level("ecc_uncorrected", &out->ecc_uncorrected);
  level("pages_pending", &out->pages_pending);
  level("nic_errors_per_sample", &out->nic_errors_per_sample);
  if (std::optional<bool> b = map.Bool("severe_throttle_degrades"))
    out->severe_throttle_degrades = *b;
  for (auto [key, field] : {std::pair{"unhealthy_threshold", &out->unhealthy_threshold},
                            std::pair{"healthy_threshold", &out->healthy_threshold}}) {
    if (std::optional<int64_t> v = map.Int(key)) {
      if (*v < 1 || *v > 1000) map.Fail(key, "must be between 1 and 1000");
      *field = static_cast<int>(*v);
    }
  }
  if (std::optional<int64_t> ms = map.Int("xid_alert_hold_ms")) {
    if (*ms < 0) map.Fail("xid_alert_hold_ms", "must not be negative");
    out->xid_alert_hold = std::chrono::milliseconds(*ms);
  }
  common::ReadIntIn(map, "xid_repeat_count", 0, 1000, &out->xid_repeat_count);
  common::ReadIntIn(map, "xid_repeat_count_other", 0, 1000, &out->xid_repeat_count_other);
  common::ReadMillis(map, "xid_repeat_window_ms", &out->xid_repeat_window,
                     {.min = 1, .max = 7LL * 24 * 3600 * 1000});
  common::ReadMillis(map, "xid_burst_ms", &out->xid_burst, {.min = 0, .max = 24LL * 3600 * 1000});
  common::ReadMillis(map, "xid_drain_reset_ms", &out->xid_drain_reset,
                     {.min = 0, .max = 3600LL * 1000});
  if (out->xid_burst >= out->xid_repeat_window && map.Has("xid_burst_ms")) {
    map.Fail("xid_burst_ms", "must be below xid_repeat_window_ms (bursts must fit the window)");
  }
}

HealthEvaluator::HealthEvaluator(HealthThresholds thresholds) : t_(std::move(thresholds)) {}

void HealthEvaluator::Reset() {
  last_readings_.clear();
  xid_last_at_.clear();
  ecc_base_.clear();
  nic_last_errors_.clear();
  latched_.clear();
  alert_xids_.clear();
  xid13_places_.clear();
  gpu_last_xid_.clear();
  xid74_seen_.clear();
  p2p_requery_.clear();
  p2p_drains_.clear();
  all_ = node_ = Hysteresis{};
  gpus_.clear();
  slices_.clear();
}

void HealthEvaluator::CheckLevel(const std::string& code, double value, const Threshold& t,
                                 const char* unit, std::vector<HealthReason>* reasons) const {
  if (t.critical && value >= *t.critical) {
    reasons->push_back({code, absl::StrFormat("%.1f%s >= critical %g", value, unit, *t.critical),
                        HealthState::kDraining});
  } else if (t.warn && value >= *t.warn) {
    reasons->push_back(
        {code, absl::StrFormat("%.1f%s >= warn %g", value, unit, *t.warn), HealthState::kDegraded});
  }
}

std::vector<HealthReason> HealthEvaluator::Instant(const Observation& obs, common::TimePoint now,
                                                   bool sampled) {
  std::vector<HealthReason> reasons;
  for (const XidEvent& x : obs.new_xids) {
    Verdict v = Judge(x, now);
    const XidInfo* info = FindXid(x.xid);
    if (x.xid != 45 && !x.recovery_only) gpu_last_xid_[x.gpu_index] = now;
    if (v.action >= 0) {
      RecoveryActionSaid(x.gpu_index, v.action, absl::StrCat("gpu", x.gpu_index, ".xid", x.xid),
                         now);
    }
    if (v.c == XidConsequence::kIgnore) continue;
    // The process the kernel log names for it, and whose it is.
    std::string who;
    if (x.pid > 0) {
      who =
          absl::StrCat(", process ", x.process.empty() ? "?" : x.process, " (pid ", x.pid, ")",
                       x.owner == XidEvent::Owner::kServer    ? ", this node's inference server"
                       : x.owner == XidEvent::Owner::kForeign ? ", not this node's inference server"
                                                              : "");
    }
    const std::string what =
        x.recovery_only
            ? std::string("NVML: the GPU's recovery action")
            : absl::StrCat("XID ", x.xid, ": ", info ? info->meaning : "not in the catalog");
    HealthReason r{absl::StrCat("gpu", x.gpu_index, ".xid", x.xid),
                   absl::StrCat(what, v.said.empty() ? "" : ": " + v.said, " (",
                                XidConsequenceName(v.c), ")", who),
                   v.c == XidConsequence::kFailAndFence ? HealthState::kFailed
                   : v.c == XidConsequence::kDrain      ? HealthState::kDraining
                                                        : HealthState::kDegraded,
                   v.node ? -1 : static_cast<int>(x.gpu_index)};
    r.event = true;
    // The catalog's RESTART_BM and RESTART_VM, XID 154's reboots: the
    // remediator's reboot hook (after the node's work moved).
    r.reboot = v.node && v.c == XidConsequence::kFailAndFence;
    std::optional<common::TimePoint> until;
    if (v.c == XidConsequence::kAlert) until = now + t_.xid_alert_hold;
    if (v.reset_after) {
      // "Drain and Reset": the work moves first, then the GPU fails, to be
      // reset (the remediator's, or an operator's).
      HealthReason reset{absl::StrCat("gpu", x.gpu_index, ".xid154.reset"),
                         absl::StrCat("XID 154: Drain and Reset: drained for ",
                                      common::ToMillis(t_.xid_drain_reset),
                                      " ms (thresholds.xid_drain_reset_ms); reset required"),
                         HealthState::kFailed, static_cast<int>(x.gpu_index)};
      reset.event = true;
      Latch(std::move(reset), std::nullopt, now + t_.xid_drain_reset);
    }
    Latch(std::move(r), until);
    if (v.c == XidConsequence::kAlert && IsApplicationXid(x.xid)) CountRepeat(x, now);
    if (x.xid == 74 && !x.nvlink_regs.empty()) CountXid74(x, now);
  }
  std::erase_if(latched_, [&](const Latched& l) { return l.until && *l.until <= now; });
  for (const Latched& l : latched_) {
    if (!l.from || *l.from <= now) reasons.push_back(l.reason);
  }
  // Without a fresh sample the readings' reasons are the last sample's: no
  // counter baseline moves on readings already seen.
  if (!sampled) {
    reasons.insert(reasons.end(), last_readings_.begin(), last_readings_.end());
    return reasons;
  }
  const size_t readings_from = reasons.size();

  stuck_first_.clear();
  for (const GpuSample& g : obs.gpus) {
    std::string gpu = absl::StrCat("gpu", g.index);
    const size_t first = reasons.size();
    // A call that missed the watchdog's deadline once may be this host's
    // load, not the driver (a new agent's first call on a busy CPU): lost
    // only if still stuck at the next sample, as a health checker wants
    // two failed checks. Meanwhile the GPU keeps its verdict.
    if (!g.stuck) {
      stuck_.erase(g.index);
    } else if (stuck_.insert(g.index).second) {
      stuck_first_.insert(g.index);
      continue;
    }
    // Lost stays the node's: NVML that stops answering for one GPU is
    // often the driver's trouble.
    if (g.lost) {
      reasons.push_back({gpu + ".lost",
                         g.lost_detail.empty() ? "GPU stopped answering (lost)" : g.lost_detail,
                         HealthState::kFailed});
      continue;
    }
    CheckLevel(gpu + ".temperature", g.temperature_c, t_.temperature_c, " C", &reasons);
    if (g.memory_total_bytes > 0) {
      CheckLevel(gpu + ".memory", 100.0 * g.memory_used_bytes / g.memory_total_bytes,
                 t_.memory_used_pct, "%", &reasons);
    }
    if (g.power_limit_w > 0) {
      CheckLevel(gpu + ".power", 100.0 * g.power_w / g.power_limit_w, t_.power_pct_of_limit,
                 "% of limit", &reasons);
    }
    auto [base_it, inserted] = ecc_base_.try_emplace(g.index, g.ecc_corrected, g.ecc_uncorrected);
    // A counter that went backwards means the GPU was reset; rebase on it.
    if (g.ecc_corrected < base_it->second.first || g.ecc_uncorrected < base_it->second.second) {
      base_it->second = {g.ecc_corrected, g.ecc_uncorrected};
    }
    CheckLevel(gpu + ".ecc_corrected", double(g.ecc_corrected - base_it->second.first),
               t_.ecc_corrected, " new", &reasons);
    CheckLevel(gpu + ".ecc_uncorrected", double(g.ecc_uncorrected - base_it->second.second),
               t_.ecc_uncorrected, " new", &reasons);
    CheckLevel(gpu + ".pages_pending", g.pages_pending, t_.pages_pending, "", &reasons);
    if (t_.severe_throttle_degrades && (g.throttle_reasons & throttle::kSevere) != 0) {
      reasons.push_back({gpu + ".throttle",
                         absl::StrFormat("hardware slowdown (reasons 0x%llx)",
                                         static_cast<unsigned long long>(g.throttle_reasons)),
                         HealthState::kDegraded});
    }
    // A MIG instance gone is its slice's fault: the GPU's other slices serve.
    for (uint32_t slot : g.slices_lost) {
      HealthReason r{
          absl::StrCat(gpu, ".mig", slot, ".lost"),
          absl::StrCat("MIG instance ", slot, " is gone (the driver no longer lists it)"),
          HealthState::kFailed};
      r.slice = static_cast<int>(slot);
      reasons.push_back(std::move(r));
    }
    for (size_t i = first; i < reasons.size(); ++i) reasons[i].gpu = static_cast<int>(g.index);
  }
  for (const std::string& slot : obs.unseen_pci) {
    reasons.push_back(
        {absl::StrCat("pci.", slot),
         absl::StrCat("NVIDIA GPU at PCI ", slot, " is on the bus but the driver does not list it"),
         HealthState::kDraining});
  }
  for (const NicSample& n : obs.nics) {
    std::string code = absl::StrCat("nic.", n.name);
    if (!NicUp(n)) {
      reasons.push_back({code,
                         !n.present ? "interface missing"
                                    : absl::StrCat("link down (carrier ", n.carrier ? 1 : 0,
                                                   ", operstate ", n.operstate, ")"),
                         HealthState::kFailed});
      continue;
    }
    uint64_t errors = n.rx_errors + n.tx_errors + n.rx_dropped + n.tx_dropped;
    auto [it, first] = nic_last_errors_.try_emplace(n.name, errors);
    uint64_t delta = errors >= it->second ? errors - it->second : 0;
    it->second = errors;
    if (!first) CheckLevel(code + ".errors", double(delta), t_.nic_errors_per_sample, "", &reasons);
  }
  last_readings_.assign(reasons.begin() + static_cast<std::ptrdiff_t>(readings_from),
                        reasons.end());
  return reasons;
}

HealthEvaluator::Verdict HealthEvaluator::Judge(const XidEvent& x, common::TimePoint now) const {
  Verdict v{ConsequenceOf(x.xid), IsNodeXid(x.xid)};
  // A recovery action, as XID 154's line or NVML's field names it.
  auto action = [&](int value, absl::string_view words) {
    std::optional<RecoveryAction> a = Xid154Action(value);
    if (!a) return false;
    v.c = a->consequence;
    v.node = a->node;
    v.reset_after = a->reset_after;
    v.action = value;
    v.said = words.empty() ? std::string(a->name) : std::string(words);
    return true;
  };
  if (x.xid == 154) {
    // Its action, by the value the driver prints (its words differ by
    // branch) or NVML's field gives; without either, the catalog's drain.
    const int value =
        x.recovery_value >= 0 ? x.recovery_value : Xid154ActionValue(x.recovery_action);
    if (!action(value, x.recovery_action) && (value >= 0 || !x.recovery_action.empty())) {
      v.said = absl::StrCat(
          "recovery action", value >= 0 ? absl::StrCat(" 0x", absl::Hex(value)) : "",
          x.recovery_action.empty() ? "" : " " + x.recovery_action, " (not one gpuha knows)");
    }
    return v;
  }
  if (x.xid >= 144 && x.xid <= 150) {
    if (!x.intr_info || !x.error_status) {
      // No registers (no kernel log line): the driver's recovery action,
      // which NVML's field gives, is what the decode sheet's rows come to;
      // without it, the catalog's drain.
      if (action(x.recovery_value, "")) {
        v.reset_after = false;  // the XID 154 beside it owes the reset
        v.said = absl::StrCat("no kernel log line; NVML's recovery action: ", v.said);
      }
      return v;
    }
    std::optional<Nvlink5Decode> d =
        DecodeNvlink5(x.xid, *x.intr_info, *x.error_status, x.driver_major);
    if (!d) {
      v.said = absl::StrFormat("IntrInfo 0x%08x, Error Status 0x%08x: not in the catalog's decode",
                               *x.intr_info, *x.error_status);
      return v;
    }
    // XID_154_EVAL: the XID 154 beside it says what to do (it is judged on
    // its own); none: RESTART_APP, an alert.
    v.c = d->action == "RESET_GPU" ? XidConsequence::kFailAndFence
          : d->action == "IGNORE"  ? XidConsequence::kIgnore
                                   : XidConsequence::kAlert;
    v.said = absl::StrCat(d->subcode, ", ", d->action);
    return v;
  }
  if (x.xid == 159 && x.uvm) {
    // CHECK_UVM: "RESET_GPU if UVM or vGPU is in use, else IGNORE".
    v.c = *x.uvm ? XidConsequence::kFailAndFence : XidConsequence::kIgnore;
    v.said = *x.uvm ? "UVM or vGPU in use (nvidia_uvm or nvidia_vgpu_vfio loaded): CHECK_UVM's "
                      "RESET_GPU"
                    : "neither UVM nor vGPU in use: CHECK_UVM's IGNORE";
    return v;
  }
  if (x.xid == 45) {
    // Cleanup after an earlier error: the verdict is that XID's. Alone,
    // where Fabric Manager runs, the catalog asks for its restart;
    // elsewhere it is a process's channels torn down (Ctrl-C, SIGKILL).
    auto last = gpu_last_xid_.find(x.gpu_index);
    const bool beside = x.caused_by != 0 || (last != gpu_last_xid_.end() &&
                                             now - last->second <= std::chrono::seconds(10));
    if (!beside && x.fabric_manager) {
      v.c = XidConsequence::kAlert;
      v.said = "alone: restart NVIDIA Fabric Manager (WORKFLOW_XID_45)";
    }
  }
  return v;
}

void HealthEvaluator::RecoveryActionSaid(uint32_t gpu, int value, const std::string& code,
                                         common::TimePoint now) {
  const int kDrainP2p = Xid154ActionValue("Drain P2P");
  if (value == 0) {
    // "None": the driver needs nothing more. A reset a "Drain and Reset"
    // left pending is not owed, and a Drain P2P's drains end: NVIDIA asks
    // for the action again once P2P is quiet, and this is the answer (a
    // verdict worse than a drain under the same code stays).
    const std::string reset = absl::StrCat("gpu", gpu, ".xid154.reset");
    const std::set<std::string> drained = p2p_drains_[gpu];
    std::erase_if(latched_, [&](const Latched& l) {
      return (l.reason.code == reset && l.from && *l.from > now) ||
             (drained.count(l.reason.code) != 0 && l.reason.state <= HealthState::kDraining &&
              !l.reason.reboot);
    });
  }
  if (value == kDrainP2p) {
    // Quiesce P2P (the drain does: the GPU's work moves), then ask again.
    p2p_drains_[gpu].insert(code);
    p2p_requery_[gpu] = now + t_.xid_drain_reset;
    return;
  }
  p2p_drains_.erase(gpu);
  p2p_requery_.erase(gpu);
}

std::vector<uint32_t> HealthEvaluator::RecoveryQueriesDue(common::TimePoint now) {
  std::vector<uint32_t> due;
  for (auto& [gpu, at] : p2p_requery_) {
    if (at > now) continue;
    due.push_back(gpu);
    at = now + t_.xid_drain_reset;  // until an answer other than Drain P2P
  }
  return due;
}

namespace {

// NVSentinel's XID 74 rules (its health-events analyzer): bits of one of
// the line's registers, at once or on a repeat within the window, on one
// GPU or one link of it. Each sends the GPU to NVIDIA support.
struct Xid74Rule {
  const char* name;
  size_t reg;  // REG0-REG6
  uint32_t bits;
  int count;  // occurrences within xid_repeat_window
  bool per_link;
  const char* what;
};
constexpr uint32_t Bit(int b) { return 1u << b; }
constexpr Xid74Rule kXid74Rules[] = {
    {"XID74Reg0SoloNVLinkError", 0, Bit(1) | Bit(20), 1, false, "an NVLink error"},
    {"XID74Reg0SignalIntegrityError", 0, Bit(21) | Bit(22), 1, false,
     "a signal integrity error (check the link's mechanical connections)"},
    {"XID74Reg0ECCParityError", 0, Bit(4) | Bit(5), 2, true, "ECC or parity errors on one link"},
    {"RepeatedXID74Reg0HardwareIssue", 0,
     Bit(8) | Bit(9) | Bit(12) | Bit(16) | Bit(17) | Bit(24) | Bit(28), 2, false,
     "a hardware issue, again"},
    {"XID74Reg0Bit27Or29Set", 0, Bit(27) | Bit(29), 2, false, "REG0 bit 27 or 29, again"},
    {"RepeatedXID74Reg2HardwareIssue", 2, Bit(0) | Bit(1) | Bit(2) | Bit(6), 2, true,
     "a hardware issue on one link, again"},
    {"XID74Reg2Bit13Set", 2, Bit(13), 1, false, "REG2 bit 13"},
    {"RepeatedXID74Reg2Bit16Or19Set", 2, Bit(16) | Bit(19), 2, false, "REG2 bit 16 or 19, again"},
    {"RepeatedXID74Reg2Bit17Or18Set", 2, Bit(17) | Bit(18), 2, false, "REG2 bit 17 or 18, again"},
    {"XID74Reg3Bit18Set", 3, Bit(18), 1, false, "REG3 bit 18"},
};

}  // namespace

void HealthEvaluator::CountXid74(const XidEvent& x, common::TimePoint now) {
  for (size_t i = 0; i < std::size(kXid74Rules); ++i) {
    const Xid74Rule& rule = kXid74Rules[i];
    if (rule.reg >= x.nvlink_regs.size() || (x.nvlink_regs[rule.reg] & rule.bits) == 0) continue;
    const int64_t link = rule.per_link && x.link ? static_cast<int64_t>(*x.link) : -1;
    std::deque<common::TimePoint>& seen = xid74_seen_[{x.gpu_index, i, link}];
    seen.push_back(now);
    while (now - seen.front() > t_.xid_repeat_window) seen.pop_front();
    if (static_cast<int>(seen.size()) < rule.count) continue;
    HealthReason a{
        absl::StrCat("gpu", x.gpu_index, ".xid74.support"),
        absl::StrCat("XID 74 on link ", x.link ? absl::StrCat(*x.link) : "?", ": ", rule.what,
                     " (REG", rule.reg, " 0x", absl::Hex(x.nvlink_regs[rule.reg]),
                     rule.count > 1
                         ? absl::StrCat(", ", seen.size(), " times within ",
                                        common::ToMillis(t_.xid_repeat_window) / 1000, " s")
                         : "",
                     "; NVSentinel's ", rule.name, "): contact NVIDIA support (alert)"),
        HealthState::kDegraded, static_cast<int>(x.gpu_index)};
    a.event = true;
    Latch(std::move(a), now + t_.xid_alert_hold);
  }
}

void HealthEvaluator::CountXid13Place(const XidEvent& x, common::TimePoint now) {
  if (!x.gpc || !x.tpc || t_.xid_repeat_count == 0) return;
  Place& p = xid13_places_[{x.gpu_index, *x.gpc, *x.tpc}];
  const bool same_burst = !p.bursts.empty() && now - p.last < t_.xid_burst;
  p.last = now;
  if (same_burst) return;
  p.bursts.push_back(now);
  while (!p.bursts.empty() && now - p.bursts.front() > t_.xid_repeat_window) p.bursts.pop_front();
  if (static_cast<int>(p.bursts.size()) < t_.xid_repeat_count) return;
  HealthReason d{
      absl::StrCat("gpu", x.gpu_index, ".xid13.repeated"),
      absl::StrCat("XID 13 on GPC ", *x.gpc, ", TPC ", *x.tpc, " in ", p.bursts.size(),
                   " bursts within ", common::ToMillis(t_.xid_repeat_window) / 1000,
                   " s: the same place again is its hardware (NVIDIA's XID 13 workflow: run "
                   "diagnostics); drain"),
      HealthState::kDraining, static_cast<int>(x.gpu_index)};
  d.event = true;
  p.bursts.clear();
  Latch(std::move(d), std::nullopt);
}

void HealthEvaluator::CountRepeat(const XidEvent& x, common::TimePoint now) {
  // XID 13 anywhere on the GPU counts as any other application XID does
  // (to support after xid_repeat_count_other bursts); in one place
  // (GPC and TPC), as XID 31 does (CountXid13Place).
  if (x.xid == 13) CountXid13Place(x, now);
  const int count = x.xid == 31 ? t_.xid_repeat_count : t_.xid_repeat_count_other;
  if (count == 0) return;
  // One burst: less than xid_burst after the occurrence before (counted or not).
  auto [last, first] = xid_last_at_.try_emplace({x.gpu_index, x.xid}, now);
  const bool same_burst = !first && now - last->second < t_.xid_burst;
  last->second = now;
  if (same_burst) return;
  std::deque<Seen>& seen = alert_xids_[{x.gpu_index, x.xid}];
  // A process named and not the node's server (one that exited since
  // cannot be placed, but its pid still names it).
  seen.push_back({now, x.owner != XidEvent::Owner::kServer ? x.pid : 0, x.process});
  while (!seen.empty() && now - seen.front().at > t_.xid_repeat_window) seen.pop_front();
  if (static_cast<int>(seen.size()) < count) return;
  const int64_t pid = seen.front().pid;
  const bool one_process =
      pid > 0 && std::all_of(seen.begin(), seen.end(), [&](const Seen& s) { return s.pid == pid; });
  const std::string times =
      absl::StrCat("XID ", x.xid, " in ", seen.size(), " bursts within ",
                   common::ToMillis(t_.xid_repeat_window) / 1000, " s on this GPU");
  std::vector<std::string> others;
  // The same XID on another GPU within the window (its last occurrence).
  for (const auto& [key, at] : xid_last_at_) {
    const auto& [gpu, xid] = key;
    if (xid == x.xid && gpu != x.gpu_index && now - at <= t_.xid_repeat_window) {
      others.push_back(absl::StrCat(gpu));
    }
  }
  seen.clear();
  // The rules fire apart, as NVSentinel's same-GPU and other-GPU rules do:
  // one application's fault on another GPU must not hide this GPU's repeats
  // for a day (it once turned this drain into an alert).
  if (!others.empty()) {
    // NVIDIA: "Repeat MMU faults to diff GPU: CHECK_APP". An alert.
    HealthReason a{absl::StrCat("gpu", x.gpu_index, ".xid", x.xid, ".other_gpus"),
                   absl::StrCat(times, ", and on GPU ", absl::StrJoin(others, ", "),
                                " too: check the application (alert)"),
                   HealthState::kDegraded, static_cast<int>(x.gpu_index)};
    a.event = true;
    Latch(std::move(a), now + t_.xid_alert_hold);
  }
  if (one_process) {
    // gpuha's own rule (docs/xid-policy.md): every burst from one process
    // that is not the node's server is that application's bug. An alert.
    HealthReason a{absl::StrCat("gpu", x.gpu_index, ".xid", x.xid, ".one_process"),
                   absl::StrCat(times, ", every time from process ",
                                x.process.empty() ? "?" : x.process, " (pid ", pid,
                                "), not this node's inference server: that application's "
                                "fault (alert)"),
                   HealthState::kDegraded, static_cast<int>(x.gpu_index)};
    a.event = true;
    Latch(std::move(a), now + t_.xid_alert_hold);
    return;
  }
  if (x.xid != 31) {
    // XID 13 anywhere on the GPU (not in one place), or another
    // RESTART_APP XID: NVIDIA's catalog has no repeat rule for it,
    // and NVSentinel's RepeatedXIDErrorOnSameGPU sends it to support
    // without a drain. An alert that says so.
    HealthReason a{absl::StrCat("gpu", x.gpu_index, ".xid", x.xid, ".repeated"),
                   absl::StrCat(times,
                                " (thresholds.xid_repeat_count_other): contact NVIDIA "
                                "support with this GPU's serial (alert, no drain)"),
                   HealthState::kDegraded, static_cast<int>(x.gpu_index)};
    a.event = true;
    Latch(std::move(a), now + t_.xid_alert_hold);
    return;
  }
  // XID 31 repeated on one GPU by different processes (or ones not known):
  // NVIDIA's workflow reads it as the GPU's hardware ("Repeat MMU faults to
  // same GPU": run diagnostics). Latched like any drain XID,
  // until the node rejoins.
  HealthReason d{absl::StrCat("gpu", x.gpu_index, ".xid", x.xid, ".repeated"),
                 absl::StrCat(times, " (thresholds.xid_repeat_count): its hardware; drain"),
                 HealthState::kDraining, static_cast<int>(x.gpu_index)};
  d.event = true;
  Latch(std::move(d), std::nullopt);
}

void HealthEvaluator::Latch(HealthReason r, std::optional<common::TimePoint> until,
                            std::optional<common::TimePoint> from) {
  // Once per code: a burst of one XID (per SM), or a flood of a drain XID,
  // refreshes its reason instead of piling up copies in every heartbeat.
  auto it = std::find_if(latched_.begin(), latched_.end(),
                         [&](const Latched& l) { return l.reason.code == r.code; });
  if (it == latched_.end()) {
    latched_.push_back({std::move(r), until, from});
    return;
  }
  if (r.state >= it->reason.state) {
    // A node's verdict stays the node's (XID 154 "Node Reboot Required"
    // then "GPU Reset Required": one code, the reboot still owed).
    const bool node = it->reason.gpu == -1 || r.gpu == -1;
    const bool reboot = it->reason.reboot || r.reboot;
    it->reason = std::move(r);
    if (node) it->reason.gpu = -1;
    it->reason.reboot = reboot;
  }
  if (!until || !it->until) {
    it->until.reset();  // a latch for good stays one
  } else {
    it->until = std::max(*it->until, *until);
  }
}

bool HealthEvaluator::Step(Hysteresis& h, HealthState target, HealthState event,
                           bool sampled) const {
  bool changed = false;
  // A worse state an XID asks for is not a rumour: at once, whatever the
  // readings' hysteresis is doing.
  if (event > h.state) {
    h.state = event;
    if (h.pending <= event) {  // readings on their way to worse keep their count
      h.pending = event;
      h.count = 0;
    }
    changed = true;
  }
  if (!sampled) return changed;  // readings wait for a real sample
  if (target == h.state) {
    h.count = 0;
    return changed;
  }
  if (target != h.pending) {
    h.pending = target;
    h.count = 0;
  }
  ++h.count;
  int needed = target > h.state ? t_.unhealthy_threshold : t_.healthy_threshold;
  if (target == HealthState::kFailed) needed = 1;  // a lost GPU is not a rumour
  if (h.count < needed) return changed;
  h.state = target;
  h.count = 0;
  return true;
}

void HealthEvaluator::ResetGpu(uint32_t gpu) {
  std::erase_if(latched_, [&](const Latched& l) { return l.reason.gpu == static_cast<int>(gpu); });
  std::erase_if(alert_xids_, [&](const auto& kv) { return kv.first.first == gpu; });
  std::erase_if(xid13_places_, [&](const auto& kv) { return std::get<0>(kv.first) == gpu; });
  std::erase_if(xid_last_at_, [&](const auto& kv) { return kv.first.first == gpu; });
  gpu_last_xid_.erase(gpu);
  std::erase_if(xid74_seen_, [&](const auto& kv) { return std::get<0>(kv.first) == gpu; });
  p2p_requery_.erase(gpu);
  p2p_drains_.erase(gpu);
  std::erase_if(last_readings_,
                [&](const HealthReason& r) { return r.gpu == static_cast<int>(gpu); });
  ecc_base_.erase(gpu);
  gpus_.erase(gpu);
  std::erase_if(slices_, [&](const auto& kv) { return kv.first.first == gpu; });
}

HealthReport HealthEvaluator::Update(const Observation& obs, common::TimePoint now, bool sampled) {
  HealthReport report;
  report.reasons = Instant(obs, now, sampled);
  constexpr HealthState kNone = HealthState::kHealthy;
  HealthState target = kNone, event = kNone;
  HealthState node_target = kNone, node_event = kNone;
  std::map<uint32_t, HealthState> gpu_targets, gpu_events;
  for (const GpuSample& g : obs.gpus) {
    if (!stuck_first_.count(g.index)) gpu_targets[g.index] = kNone;
  }
  std::map<std::pair<uint32_t, uint32_t>, HealthState> slice_targets;
  for (const auto& [slice, h] : slices_) slice_targets[slice] = kNone;
  auto raise = [](HealthState& t, HealthState& e, HealthState s, bool is_event) {
    t = std::max(t, s);
    if (is_event) e = std::max(e, s);
  };
  for (const HealthReason& r : report.reasons) {
    if (r.slice >= 0) {
      // A lost slice is capacity the node lost: its one server, if it has
      // no server per slice, drains; the GPU itself serves on.
      raise(target, event, std::min(r.state, HealthState::kDraining), r.event);
      HealthState& t =
          slice_targets[{static_cast<uint32_t>(r.gpu), static_cast<uint32_t>(r.slice)}];
      t = std::max(t, r.state);
      continue;
    }
    raise(target, event, r.state, r.event);
    if (r.gpu < 0) {
      raise(node_target, node_event, r.state, r.event);
    } else {
      const uint32_t g = static_cast<uint32_t>(r.gpu);
      raise(gpu_targets[g], gpu_events[g], r.state, r.event);
    }
  }
  report.changed = Step(all_, target, event, sampled);
  report.state = all_.state;
  Step(node_, node_target, node_event, sampled);
  report.node_state = node_.state;
  for (const auto& [gpu, t] : gpu_targets) {
    Hysteresis& h = gpus_[gpu];
    Step(h, t, gpu_events[gpu], sampled);
    report.gpu_states[gpu] = h.state;
  }
  // A GPU whose sample failed this time keeps its verdict: no reading is
  // no evidence that it healed.
  for (const auto& [gpu, h] : gpus_) report.gpu_states.emplace(gpu, h.state);
  for (const auto& [slice, t] : slice_targets) {
    // A slice of a GPU whose sample failed keeps its verdict too.
    Hysteresis& h = slices_[slice];
    if (t != HealthState::kHealthy || gpu_targets.count(slice.first) != 0) {
      Step(h, t, HealthState::kHealthy, sampled);
    }
    report.slice_states[slice] = h.state;
  }
  return report;
}

}  // namespace gpuha::gpu
