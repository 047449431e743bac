// GPUs as placement units (issue 16): a node that runs an inference server
// per GPU has each GPU placed alone, so a GPU-level fault moves that GPU's
// streams and the node's other GPUs serve on. Node-level faults still take
// the whole node out (TakeOutLocked fails every unit of its host).

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "controller/controller.h"
#include "controller/quarantine.h"

namespace gpuha::controller {

namespace {

bool Down(const v1::GpuHealth& g) {
  return g.health() == v1::NODE_HEALTH_FAILED || g.health() == v1::NODE_HEALTH_DRAINING;
}

std::string GpuWhy(bool reported, const v1::GpuHealth& g) {
  if (!reported) return "its agent reports nothing of this GPU (not listed by its driver?)";
  if (g.reasons_size() > 0) {
    return absl::StrCat(g.reasons(0).code(), ": ", g.reasons(0).detail());
  }
  if (Down(g)) return absl::StrCat("agent reports ", HealthName(g.health()));
  return "its server is not ready (agent's readiness probe)";
}

}  // namespace

bool Controller::GpuServersUpLocked(NodeState& n) {
  // A GPU whose server never comes up (a crash loop, a GPU the agent does
  // not list) holds the node back only so long: it then joins without it.
  const common::TimePoint now = clock_->Now();
  if (!n.gpu_join_wait_since) n.gpu_join_wait_since = now;
  if (now - *n.gpu_join_wait_since >= kGpuJoinWait) return true;
  for (const GpuServerConfig& g : n.cfg.gpu_servers) {
    auto it = n.gpu_states.find(g.Name());
    if (it == n.gpu_states.end()) return false;  // its agent has not said yet
    if (!it->second.last.server_ready() && !Down(it->second.last)) return false;
  }
  return true;
}

void Controller::GpuVerdictsLocked(NodeState& n) {
  if (n.cfg.gpu_servers.empty() || n.lifecycle != NodeLifecycle::kServing || !acting()) return;
  if (clock_->Now() < grace_until_) return;
  const std::string& id = n.cfg.spec.id;
  for (const GpuServerConfig& g : n.cfg.gpu_servers) {
    // A GPU its agent says nothing of (it did not list it) serves nothing.
    NodeState::GpuState& st = n.gpu_states[g.Name()];
    const bool bad = !st.reported || Down(st.last) || !st.last.server_ready();
    const bool in = placement_.Available(GpuUnitId(id, g));
    if (bad) {
      st.healthy_since.reset();
      if (!in) continue;
      // A GPU whose server still answers is held while the breaker is
      // open; one whose server stopped serves nothing anyway.
      if (st.last.server_ready() && !GpuQuarantineAllowsLocked()) {
        if (!st.quarantine_held) {
          st.quarantine_held = true;
          counters_.quarantines_held++;
          EventLocked(
              "quarantine_held", id,
              absl::StrCat(g.Name(), " not taken out (", GpuWhy(st.reported, st.last),
                           "): more than ", static_cast<int>(config_.quarantine_max_share * 100),
                           "% of the GPUs would be out (fence.quarantine_max_share)"));
        }
        continue;
      }
      st.quarantine_held = false;
      TakeOutGpuLocked(n, g, GpuWhy(st.reported, st.last));
      continue;
    }
    st.quarantine_held = false;
    if (in) continue;
    if (!st.healthy_since) st.healthy_since = clock_->Now();
    if (clock_->Now() - *st.healthy_since >= config_.healthy_for) RestoreGpuLocked(n, g);
  }
}

bool Controller::GpuQuarantineAllowsLocked() const {
  if (config_.quarantine_max_share >= 1) return true;
  // GPUs of serving nodes with servers per GPU: out against all of them.
  int64_t out = 0, all = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.lifecycle != NodeLifecycle::kServing) continue;
    for (const GpuServerConfig& g : n.cfg.gpu_servers) {
      ++all;
      out += !placement_.Available(GpuUnitId(id, g));
    }
  }
  return QuarantineAllows(config_.quarantine_max_share, out, all);
}

void Controller::TakeOutGpuLocked(NodeState& n, const GpuServerConfig& g, const std::string& why) {
  const std::string& id = n.cfg.spec.id;
  const std::string unit = GpuUnitId(id, g);
  const std::string gpu = g.Name();
  counters_.gpu_failovers++;
  EventLocked("gpu_out", id, absl::StrCat(gpu, ": ", why));
  FailoverPlan plan = placement_.FailNode(unit);
  std::vector<StoreWrite> batch;
  for (const Assignment& a : plan.moved) PersistStreamLocked(a.stream, &batch);
  for (const Assignment& a : plan.restandbyed) PersistStreamLocked(a.stream, &batch);
  for (const std::string& s : plan.unplaced) PersistStreamLocked(s, &batch);
  PersistPromotedLocked(plan, &batch);
  EventLocked("streams_moved", id,
              absl::StrCat(gpu, ": ", plan.moved.size(), " stream(s) moved",
                           plan.promoted.empty() ? "" : " to passive " + plan.promoted,
                           "; the node's other GPUs serve on"));
  if (!plan.unplaced.empty()) {
    counters_.unplaced_streams += plan.unplaced.size();
    EventLocked("streams_unplaced", id,
                absl::StrCat(gpu, ": ", plan.unplaced.size(), " stream(s) fit nowhere under N+",
                             config_.redundancy, "; they answer 503 until capacity returns"));
  }
  PushRoutesLocked(absl::StrCat(gpu, " of ", id, " out"));
  CommitLocked(std::move(batch));
}

void Controller::RestoreGpuLocked(NodeState& n, const GpuServerConfig& g) {
  const std::string& id = n.cfg.spec.id;
  const std::string gpu = g.Name();
  // Back in its node's role: nothing moves back to it (sticky), it takes
  // new streams and standbys.
  if (!placement_.RestoreNode(GpuUnitId(id, g), /*as_passive=*/false).ok()) return;
  n.gpu_states[gpu].healthy_since.reset();
  EventLocked("gpu_back", id,
              absl::StrCat(gpu, ": healthy and ready for ", common::ToMillis(config_.healthy_for),
                           " ms; takes work again"));
  std::vector<StoreWrite> batch;
  for (const Assignment& a : placement_.Assignments()) PersistStreamLocked(a.stream, &batch);
  PushRoutesLocked(absl::StrCat(gpu, " of ", id, " back"));
  CommitLocked(std::move(batch));
}

void Controller::PersistPromotedLocked(const FailoverPlan& plan,
                                       std::vector<StoreWrite>* batch) const {
  std::set<std::string> done;
  for (const std::string& unit : plan.promoted_all) {
    const std::string node = NodeOfUnit(unit);
    auto it = nodes_.find(node);
    if (it != nodes_.end() && done.insert(node).second) PersistNodeLocked(it->second, batch);
  }
}

}  // namespace gpuha::controller
