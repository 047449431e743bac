// Job: a stateful, long-running GPU process (training) that the controller
// places on one node at a time. Unlike a stream it cannot be re-sent: on a
// node failure it restarts elsewhere from its last complete checkpoint on
// shared storage, and only once the old node's fence is confirmed
// (Pacemaker's rule), so that two writers never share the directory.
//
//   auto spec = ParseJobSpec(body);          // POST /api/v1/jobs
//   JobRecord r{.spec = *spec};
//   batch.push_back({"job", r.spec.id, EncodeJob(r)});
//   absl::StatusOr<JobRecord> back = DecodeJob(id, text);
//
// Each placement gets a job epoch, higher than any before it; the job
// claims its checkpoint directory with it (worker/checkpoint.h), and a
// writer of an older placement is refused there.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/placement.h"

namespace gpuha::controller {

struct JobSpec {
  std::string id;
  // argv; {job}, {epoch}, {checkpoint_dir} and {checkpoint_every} are filled
  // in by the controller, {progress_file} by the agent.
  std::vector<std::string> command;
  int64_t gpus = 1;
  std::string checkpoint_dir;  // absolute, on storage every node mounts
  int64_t checkpoint_every = 50;
};

// pending: no node fits yet. starting: its agent was told to run it.
// running: its agent reports it running. fencing: its node is out, and the
// job waits for that node's fence to be confirmed. blocked: the fence could
// not be confirmed; an operator must (ctl job confirm-fenced). done.
enum class JobPhase { kPending, kStarting, kRunning, kFencing, kBlocked, kDone };
inline constexpr JobPhase kJobPhases[] = {JobPhase::kPending, JobPhase::kStarting,
                                          JobPhase::kRunning, JobPhase::kFencing,
                                          JobPhase::kBlocked, JobPhase::kDone};
const char* JobPhaseName(JobPhase p);

// The last move of a job: its timeline in Unix ms (0: not reached).
struct JobTakeover {
  std::string from, to;
  bool planned = false;       // a drain or planned stop: it checkpointed first
  double fault_ms = 0;        // the fault seen (or the drain asked)
  double fenced_ms = 0;       // the old node's fence confirmed
  double started_ms = 0;      // its new agent told to start it
  double running_ms = 0;      // its new agent reports it running
  uint64_t last_step = 0;     // the last step the old placement reported
  uint64_t resumed_from = 0;  // the checkpoint the new placement starts at
};

struct JobRecord {
  JobSpec spec;
  JobPhase phase = JobPhase::kPending;
  std::string node;        // where it runs, or the node being fenced
  uint64_t job_epoch = 0;  // its placement (0: never placed)
  uint64_t step = 0;       // the last step its agent reported
  uint64_t checkpoint_step = 0;
  uint32_t takeovers = 0;
  std::string last_exit;  // how its current placement last ended ("exit 1"), if it did
  uint32_t restarts = 0;  // its agent's restarts of it at this placement
  std::string why;        // why it is blocked or pending
  std::optional<JobTakeover> last;
};

// The API's body: {"id", "command": [...], "gpus", "checkpoint_dir",
// "checkpoint_every"}; the directory comes back normalised ("/a/./b/" is
// "/a/b"), so two spellings of one directory are one. Errors name the field.
[[nodiscard]] absl::StatusOr<JobSpec> ParseJobSpec(const nlohmann::json& body);
// The same checks for a spec from anywhere (a store row).
[[nodiscard]] absl::Status CheckJobSpec(const JobSpec& s);
// The command with {job}, {epoch}, {checkpoint_dir} and {checkpoint_every}
// replaced by this job's values ({progress_file} is left for the agent).
std::vector<std::string> JobArgv(const JobSpec& s, uint64_t job_epoch);

// A node a job may go to: serving, its agent connected and not calling it
// failing; its GPUs free (less the jobs already on it) and its role now.
struct JobCandidate {
  std::string node;
  int64_t free_gpus = 0;
  placement::Role role = placement::Role::kActive;
};
// Where a job needing `gpus` goes ("" if no candidate has them free): a
// move (`move`: placed before) to `prefer` (the node that took its node's
// place), then passive, buffer and active nodes; a first placement to
// active nodes first, then passive, then buffer. Ties: the first listed.
std::string PickJobNode(const std::vector<JobCandidate>& candidates, int64_t gpus, bool move,
                        const std::string& prefer);

std::string EncodeJob(const JobRecord& r);
[[nodiscard]] absl::StatusOr<JobRecord> DecodeJob(const std::string& id, std::string_view text);
nlohmann::json JobJson(const JobRecord& r);

}  // namespace gpuha::controller
