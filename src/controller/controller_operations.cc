// The operator's calls that change the cluster (the API's POST and DELETE):
// streams added and removed, nodes drained, undrained, failed, their roles.
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/net_util.h"
#include "controller/controller.h"
#include "controller/state_codec.h"

namespace gpuha::controller {

absl::StatusOr<Assignment> Controller::AddStream(const StreamSpec& s) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  if (absl::Status bad = CheckStreamLocked(s); !bad.ok()) return bad;
  auto a = placement_.Admit(s);
  if (!a.ok()) {
    if (a.status().code() == absl::StatusCode::kFailedPrecondition) counters_.admissions_refused++;
    return a.status();
  }
  specs_[s.id] = s;
  std::vector<StoreWrite> batch;
  PersistStreamLocked(s.id, &batch);
  if (NodeState* n = FindLocked(a->primary)) PersistNodeLocked(*n, &batch);
  EventLocked("stream_added", a->primary,
              absl::StrCat(s.id, " (tenant ", s.tenant, ", standby ",
                           a->standby.empty() ? "none" : a->standby, ")"));
  PushRoutesLocked(absl::StrCat("stream ", s.id, " added"));
  CommitLocked(std::move(batch));
  if (absl::Status stored = StoredLocked(); !stored.ok()) return stored;
  return a;
}

absl::Status Controller::RemoveStream(const std::string& id) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  if (absl::Status s = placement_.Remove(id); !s.ok()) return s;
  specs_.erase(id);
  std::vector<StoreWrite> batch;
  PersistStreamLocked(id, &batch);
  EventLocked("stream_removed", "", id);
  PushRoutesLocked(absl::StrCat("stream ", id, " removed"));
  CommitLocked(std::move(batch));
  return StoredLocked();
}

absl::Status Controller::Drain(const std::string& node, bool force) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  if (n->lifecycle == NodeLifecycle::kPending) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node,
        " has not joined (no agent with a ready server yet): it has no work to drain"));
  }
  if (!force) {
    if (absl::Status s = placement_.CanRemoveNode(node); !s.ok()) return s;
    // A job moves only to a node with its GPUs free; without one it would
    // wait, stopped, until capacity returns.
    for (const auto& [id, j] : jobs_) {
      const bool here =
          j.r.node == node && (j.r.phase == JobPhase::kStarting || j.r.phase == JobPhase::kRunning);
      if (here && JobTargetLocked(j, node).empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", id, " on node ", node, " has no other serving node with ",
                         j.r.spec.gpus, " GPU(s) free to move to (?force=true stops it there)"));
      }
    }
  }
  EventLocked("drain", node, force ? "operator drain (forced)" : "operator drain");
  // One transition, one commit (the drain used to commit the node twice).
  TakeOutLocked(*n, "operator drain", 0, /*make_before_break=*/true, /*count_failure=*/false,
                NodeLifecycle::kDrained);
  return StoredLocked();
}

absl::Status Controller::Undrain(const std::string& node) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  n->failures.clear();
  if (!n->fenced()) return absl::OkStatus();
  RejoinLocked(*n, "operator undrain");
  return StoredLocked();
}

absl::Status Controller::Fail(const std::string& node) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  if (!placement_.Available(node)) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node,
                                                      n->lifecycle == NodeLifecycle::kPending
                                                          ? " has not joined yet"
                                                          : " is already out of service"));
  }
  TakeOutLocked(*n, "operator fail (drill)", clock_->UnixNanos(), /*make_before_break=*/false,
                /*count_failure=*/false, NodeLifecycle::kFenced);
  return StoredLocked();
}

absl::Status Controller::SetRole(const std::string& node, Role role) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  NodeState* n = FindLocked(node);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("node ", node, " not found"));
  if (absl::Status s = placement_.SetRole(node, role); !s.ok()) return s;
  EventLocked("role_changed", node, RoleName(role));
  std::vector<StoreWrite> batch;
  PersistNodeLocked(*n, &batch);
  PushRoutesLocked(absl::StrCat("role of ", node));
  CommitLocked(std::move(batch));
  return StoredLocked();
}

}  // namespace gpuha::controller
