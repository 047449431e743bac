// The controller's stateful jobs (job.h): placement, the wait for a
// confirmed fence before a job starts elsewhere, and what agents report.
#include <algorithm>
#include <filesystem>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "controller/controller.h"

namespace gpuha::controller {
namespace {

using json = nlohmann::json;

// A StartJob the agent has not acknowledged (its job missing from the
// agent's reports) is sent again after this.
constexpr common::Duration kStartResend = std::chrono::seconds(2);
// A pending job looks for a node this often.
constexpr common::Duration kPlaceRetry = std::chrono::seconds(1);

bool OnNode(JobPhase p) { return p == JobPhase::kStarting || p == JobPhase::kRunning; }

}  // namespace

void Controller::PersistJobLocked(const JobState& j, std::vector<StoreWrite>* batch) const {
  batch->push_back({"job", j.r.spec.id, EncodeJob(j.r)});
}

std::string Controller::JobTargetLocked(const JobState& j, const std::string& exclude) const {
  std::vector<JobCandidate> candidates;
  for (const auto& [id, n] : nodes_) {
    if (id == exclude || n.lifecycle != NodeLifecycle::kServing || !n.sink) continue;
    // Not a node its agent calls failing (held by the quarantine breaker).
    if (n.quarantine_held || n.health == v1::NODE_HEALTH_FAILED ||
        n.health == v1::NODE_HEALTH_DRAINING) {
      continue;
    }
    int64_t used = 0;
    for (const auto& [other, o] : jobs_) {
      if (other != j.r.spec.id && o.r.node == id && OnNode(o.r.phase)) used += o.r.spec.gpus;
    }
    candidates.push_back({id, n.gpus - used, placement_.RoleOf(id).value_or(n.cfg.spec.role)});
  }
  return PickJobNode(candidates, j.r.spec.gpus, /*move=*/j.r.job_epoch > 0, j.prefer);
}

void Controller::SendStartJobLocked(NodeState& n, const JobState& j) {
  if (!acting() || !n.sink) return;
  v1::ControllerMessage m;
  v1::StartJob* s = m.mutable_start_job();
  s->set_epoch(epoch_);
  s->set_job(j.r.spec.id);
  s->set_job_epoch(j.r.job_epoch);
  for (std::string& a : JobArgv(j.r.spec, j.r.job_epoch)) s->add_argv(std::move(a));
  s->set_checkpoint_dir(j.r.spec.checkpoint_dir);
  n.sink->Send(m);
}

void Controller::PlaceJobLocked(JobState& j, const std::string& exclude,
                                std::vector<StoreWrite>* batch) {
  const common::TimePoint now = clock_->Now();
  const std::string& id = j.r.spec.id;
  const std::string to = JobTargetLocked(j, exclude);
  if (to.empty()) {
    const std::string why =
        absl::StrCat("no serving node has ", j.r.spec.gpus, " GPU(s) free; it starts when one has");
    j.retry_at = now + kPlaceRetry;
    if (j.r.phase == JobPhase::kPending && j.r.why == why) return;  // nothing new to store
    EventLocked("job_pending", "", absl::StrCat(id, ": ", why));
    j.r.phase = JobPhase::kPending;
    j.r.node.clear();
    j.r.why = why;
    PersistJobLocked(j, batch);
    return;
  }
  // Each placement writes under an epoch above every earlier one's (of any
  // job), so the checkpoint directory refuses any writer left behind.
  job_epoch_ = std::max({job_epoch_ + 1, j.r.job_epoch + 1, epoch_});
  j.r.job_epoch = job_epoch_;
  j.r.phase = JobPhase::kStarting;
  j.r.node = to;
  j.r.why.clear();
  j.retry_at = now + kStartResend;
  if (j.r.last && j.r.last->started_ms == 0) {
    j.r.last->to = to;
    j.r.last->started_ms = static_cast<double>(clock_->UnixNanos()) / 1e6;
    j.r.takeovers++;
    counters_.job_takeovers++;
  }
  SendStartJobLocked(nodes_.at(to), j);
  EventLocked("job_started", to,
              absl::StrCat(id, ": placement ", j.r.job_epoch, ", from its latest checkpoint (step ",
                           j.r.checkpoint_step, " when last reported)"));
  PersistJobLocked(j, batch);
}

bool Controller::JobsFencingLocked(const std::string& node) const {
  for (const auto& [id, j] : jobs_) {
    if (j.r.node == node && j.r.phase == JobPhase::kFencing) return true;
  }
  return false;
}

void Controller::JobsOffNodeLocked(const NodeState& n, int64_t fault_unix_ns, bool planned) {
  const std::string& node = n.cfg.spec.id;
  for (auto& [id, j] : jobs_) {
    if (j.r.node != node || !OnNode(j.r.phase)) continue;
    j.r.phase = JobPhase::kFencing;
    j.fence_since = clock_->Now();
    j.escalated = false;
    j.prefer.clear();
    JobTakeover t;
    t.from = node;
    t.planned = planned;
    t.fault_ms = static_cast<double>(fault_unix_ns > 0 ? fault_unix_ns : clock_->UnixNanos()) / 1e6;
    t.last_step = j.r.step;
    j.r.last = t;
    j.r.why = absl::StrCat("waits for node ", node, "'s fence before it starts elsewhere");
    EventLocked("job_fencing", node, absl::StrCat(id, ": ", j.r.why));
  }
}

void Controller::ConfirmJobFenceLocked(JobState& j, const std::string& how,
                                       std::vector<StoreWrite>* batch) {
  if (j.r.phase != JobPhase::kFencing && j.r.phase != JobPhase::kBlocked) return;
  if (j.r.last) j.r.last->fenced_ms = static_cast<double>(clock_->UnixNanos()) / 1e6;
  const std::string from = j.r.node;
  EventLocked("job_fence_confirmed", from, absl::StrCat(j.r.spec.id, ": ", how));
  PlaceJobLocked(j, from, batch);
}

void Controller::NodeFenceConfirmedLocked(const std::string& node, const std::string& how) {
  std::vector<StoreWrite> batch;
  for (auto& [id, j] : jobs_) {
    if (j.r.node == node) ConfirmJobFenceLocked(j, how, &batch);
  }
  if (!batch.empty()) CommitLocked(std::move(batch));
}

void Controller::NodeFenceFailedLocked(const std::string& node, const std::string& why) {
  std::vector<StoreWrite> batch;
  for (auto& [id, j] : jobs_) {
    if (j.r.node != node || j.r.phase != JobPhase::kFencing) continue;
    j.r.phase = JobPhase::kBlocked;
    j.escalated = true;
    j.r.why = absl::StrCat("not restarted: ", why,
                           ". Two writers would corrupt its checkpoints; once node ", node,
                           " is off, `gpuha ctl job confirm-fenced ", id, "`");
    counters_.jobs_blocked++;
    EventLocked("job_blocked", node, absl::StrCat(id, ": ", j.r.why));
    PersistJobLocked(j, &batch);
  }
  if (!batch.empty()) CommitLocked(std::move(batch));
}

// A starting or running job's report from its node's agent.
void Controller::StartedJobReportLocked(NodeState& n, JobState& j, const v1::JobStatus* mine,
                                        bool fenced, common::TimePoint now,
                                        std::vector<StoreWrite>* batch) {
  const std::string& node = n.cfg.spec.id;
  const std::string& id = j.r.spec.id;
  if (mine == nullptr) {
    // Its agent does not know it (restarted since): told again.
    if (!fenced && now >= j.retry_at) {
      SendStartJobLocked(n, j);
      j.retry_at = now + kStartResend;
    }
  } else if (mine->done()) {
    j.r.phase = JobPhase::kDone;
    EventLocked("job_done", node, absl::StrCat(id, ": finished at step ", mine->step()));
    PersistJobLocked(j, batch);
  } else if (!mine->running() && mine->last_exit() == "exit 4") {
    // Its storage refused it: a later placement holds the directory
    // (another controller's, or a job removed and added again).
    j.r.phase = JobPhase::kBlocked;
    j.r.why =
        absl::StrCat("its checkpoint directory is held by a later placement than ", j.r.job_epoch,
                     "; remove the job, or the other writer, and add it again");
    counters_.jobs_blocked++;
    EventLocked("job_blocked", node, absl::StrCat(id, ": ", j.r.why));
    PersistJobLocked(j, batch);
  } else if (mine->running() && j.r.phase == JobPhase::kStarting) {
    j.r.phase = JobPhase::kRunning;
    if (j.r.last && j.r.last->running_ms == 0) {
      j.r.last->running_ms = static_cast<double>(clock_->UnixNanos()) / 1e6;
      j.r.last->resumed_from = mine->resumed_from();
    }
    EventLocked("job_running", node,
                absl::StrCat(id, ": placement ", j.r.job_epoch, ", pid ", mine->pid()));
    PersistJobLocked(j, batch);
  }
}

// A job this node runs that the controller does not place here (removed
// while the node was cut off, or moved since): stopped.
void Controller::StopUnplacedJobsLocked(
    NodeState& n, const google::protobuf::RepeatedPtrField<v1::JobStatus>& jobs) {
  const std::string& node = n.cfg.spec.id;
  for (const v1::JobStatus& s : jobs) {
    auto it = jobs_.find(s.job());
    const bool placed =
        it != jobs_.end() && it->second.r.node == node && it->second.r.job_epoch == s.job_epoch();
    if (!s.running() || placed) continue;
    v1::ControllerMessage m;
    m.mutable_stop_job()->set_epoch(epoch_);
    m.mutable_stop_job()->set_job(s.job());
    n.sink->Send(m);
  }
}

void Controller::JobReportLocked(NodeState& n,
                                 const google::protobuf::RepeatedPtrField<v1::JobStatus>& jobs,
                                 bool fenced) {
  const std::string& node = n.cfg.spec.id;
  const common::TimePoint now = clock_->Now();
  std::vector<StoreWrite> batch;
  for (auto& [id, j] : jobs_) {
    if (j.r.node != node) continue;
    const v1::JobStatus* mine = nullptr;
    bool any_running = false;
    for (const v1::JobStatus& s : jobs) {
      if (s.job() != id) continue;
      any_running = any_running || s.running();
      if (s.job_epoch() == j.r.job_epoch) mine = &s;
    }
    if (mine != nullptr) {
      j.r.step = std::max(j.r.step, mine->step());
      j.r.checkpoint_step = mine->checkpoint_step();
      j.r.last_exit = mine->last_exit();
      j.r.restarts = mine->restarts();
    }
    switch (j.r.phase) {
      case JobPhase::kFencing:
      case JobPhase::kBlocked:
        // The old placement's last word counts for the steps a move loses.
        if (mine != nullptr && j.r.last) {
          j.r.last->last_step = std::max(j.r.last->last_step, mine->step());
        }
        // The agent obeyed the fence: its job ended (on a drain, after it
        // checkpointed the step it reached).
        if (fenced && !any_running) {
          ConfirmJobFenceLocked(j, "its agent stopped it and holds the node fenced", &batch);
        } else if (mine != nullptr && mine->stopped() && !any_running) {
          // Stopped by its agent on the fence: it never runs again at this
          // placement, even if the node has rejoined since.
          ConfirmJobFenceLocked(j, "its agent stopped it", &batch);
        }
        break;
      case JobPhase::kStarting:
      case JobPhase::kRunning:
        StartedJobReportLocked(n, j, mine, fenced, now, &batch);
        break;
      default:
        break;
    }
  }
  if (!fenced && n.sink) StopUnplacedJobsLocked(n, jobs);
  if (!batch.empty()) CommitLocked(std::move(batch));
}

void Controller::JobsTickLocked() {
  const common::TimePoint now = clock_->Now();
  std::vector<StoreWrite> batch;
  for (auto& [id, j] : jobs_) {
    const NodeState* n = j.r.phase == JobPhase::kFencing ? FindLocked(j.r.node) : nullptr;
    // An agent that beats "fenced" is stopping its jobs (each has its stop
    // grace to checkpoint): the hook is for agents that do not answer.
    const bool obeying = n != nullptr && n->sink && now - n->fenced_beat_at < config_.fence_timeout;
    if (j.r.phase == JobPhase::kFencing && !j.escalated && !obeying &&
        now - j.fence_since >= config_.fence_timeout) {
      // The agent did not confirm in time (hung, or cut off while its
      // stream stays open): the hook fences the node, or nothing can.
      j.escalated = true;
      if (config_.fence_hook.empty()) {
        NodeFenceFailedLocked(j.r.node, absl::StrCat("its agent did not confirm the fence within ",
                                                     common::ToMillis(config_.fence_timeout),
                                                     " ms and no fence hook is configured"));
      } else {
        RunFenceHookLocked(j.r.node);
      }
    } else if (j.r.phase == JobPhase::kPending && now >= j.retry_at) {
      PlaceJobLocked(j, "", &batch);
    }
  }
  if (!batch.empty()) CommitLocked(std::move(batch));
}

absl::StatusOr<json> Controller::AddJob(const JobSpec& spec) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  if (absl::Status s = CheckJobSpec(spec); !s.ok()) return s;
  if (jobs_.count(spec.id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("job ", spec.id, " already exists"));
  }
  // Two jobs' folders apart: neither inside the other (one job's
  // checkpoints would be read as the other's, or overwrite them).
  auto within = [](const std::string& inner, const std::string& outer) {
    const std::filesystem::path i = std::filesystem::path(inner).lexically_normal();
    const std::filesystem::path o = std::filesystem::path(outer).lexically_normal();
    auto [end, _] = std::mismatch(o.begin(), o.end(), i.begin(), i.end());
    return end == o.end() || (std::next(end) == o.end() && end->empty());  // "/a/" is "/a"
  };
  for (const auto& [id, j] : jobs_) {
    if (j.r.phase == JobPhase::kDone) continue;
    const std::string& other = j.r.spec.checkpoint_dir;
    if (within(spec.checkpoint_dir, other) || within(other, spec.checkpoint_dir)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "checkpoint_dir: job ", id, " already writes to ", other, ", which ", spec.checkpoint_dir,
          within(spec.checkpoint_dir, other) ? " lies within" : " holds"));
    }
  }

  JobState& j = jobs_[spec.id];
  j.r.spec = spec;
  EventLocked("job_added", "",
              absl::StrCat(spec.id, ": ", spec.gpus, " GPU(s), checkpoints in ",
                           spec.checkpoint_dir, " every ", spec.checkpoint_every, " steps"));
  std::vector<StoreWrite> batch;
  PlaceJobLocked(j, "", &batch);
  CommitLocked(std::move(batch));
  if (absl::Status stored = StoredLocked(); !stored.ok()) return stored;
  return gpuha::controller::JobJson(j.r);
}

absl::Status Controller::RemoveJob(const std::string& id) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  JobState& j = it->second;
  if (j.r.phase == JobPhase::kFencing || j.r.phase == JobPhase::kBlocked) {
    // Removed now, it could be added again and start while the old node
    // may still write.
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " waits for node ", j.r.node,
        "'s fence; once the node is off, `gpuha ctl confirm-fenced ", id, "`, then remove it"));
  }
  if (NodeState* n = OnNode(j.r.phase) ? FindLocked(j.r.node) : nullptr; n && n->sink) {
    v1::ControllerMessage m;
    m.mutable_stop_job()->set_epoch(epoch_);
    m.mutable_stop_job()->set_job(id);
    n->sink->Send(m);
  }
  EventLocked("job_removed", j.r.node, absl::StrCat(id, " (was ", JobPhaseName(j.r.phase), ")"));
  jobs_.erase(it);
  CommitLocked({{"job", id, std::nullopt}});
  return StoredLocked();
}

absl::StatusOr<json> Controller::ConfirmJobFence(const std::string& id) {
  Step step(this);
  if (absl::Status s = CheckActing(); !s.ok()) return s;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  JobState& j = it->second;
  if (j.r.phase != JobPhase::kBlocked && j.r.phase != JobPhase::kFencing) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobPhaseName(j.r.phase),
                                                      ": it waits for no fence to be confirmed"));
  }
  std::vector<StoreWrite> batch;
  ConfirmJobFenceLocked(j, absl::StrCat("an operator confirmed that node ", j.r.node, " is off"),
                        &batch);
  CommitLocked(std::move(batch));
  if (absl::Status stored = StoredLocked(); !stored.ok()) return stored;
  return gpuha::controller::JobJson(j.r);
}

json Controller::JobsJson() const {
  absl::MutexLock lock(&mu_);
  json out = json::array();
  for (const auto& [id, j] : jobs_) out.push_back(gpuha::controller::JobJson(j.r));
  return out;
}

absl::StatusOr<json> Controller::JobJson(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return gpuha::controller::JobJson(it->second.r);
}

}  // namespace gpuha::controller
