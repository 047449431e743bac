// JobSupervisor: runs the stateful jobs (training) the controller places on
// this node, one process each, and reports their progress: the step each
// last wrote to its progress file and the newest complete checkpoint in its
// checkpoint directory (worker/checkpoint.h).
//
//   JobSupervisor jobs(options, &runner, clock);
//   jobs.Start(start_job);     // a StartJob from the controller
//   jobs.Tick();               // every 100 ms, on the supervisor thread
//   jobs.StopAll();            // a fence: SIGTERM (the job checkpoints), then SIGKILL
//   for (const v1::JobStatus& s : jobs.Status()) ...
//
// A job that exits 0 on its own is done (gpuha worker --train stopped early
// exits 5: not done). One that crashes restarts here, at
// the same placement, with backoff (1, 2, 4 ... 60 s); one that exits 4 was
// fenced by its storage (a later placement claimed the directory) and is not
// restarted. A job stopped by the agent (fence, StopJob) is not restarted;
// a StopJob'd one is forgotten once it has ended.
// Thread-safety: every method locks; Tick() is meant for one thread.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/process.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "gpuha/v1/agent.pb.h"

namespace gpuha::agent {

struct JobOptions {
  // Where each job's progress file is ({progress_file} in its command).
  std::string progress_dir;
  // After a SIGTERM (fence, stop), the time a job has to checkpoint and exit.
  common::Duration stop_grace = std::chrono::seconds(10);
  common::Backoff::Options backoff;
};

// The exit status of a job that found a later placement holding its
// checkpoint directory (gpuha worker's kExitFenced).
inline constexpr int kJobExitFenced = 4;

class JobSupervisor {
 public:
  JobSupervisor(JobOptions options, ProcessRunner* runner, common::Clock* clock);
  ~JobSupervisor();
  // Runs the job at this placement. A job already here at an older
  // placement is stopped first; the same or an older one is ignored.
  void Start(const v1::StartJob& start);
  // SIGTERM, and the job is forgotten once it has ended.
  void Stop(const std::string& job);
  // Every job: SIGTERM at the next tick, SIGKILL after stop_grace; none
  // restarts at this placement.
  void StopAll();
  void Tick();
  std::vector<v1::JobStatus> Status() const;
  // Whether any job's process is still alive.
  bool AnyRunning() const;
  // The agent exits: SIGTERM to every job (it checkpoints), SIGKILL after
  // stop_grace, and at most a second more. Blocks meanwhile.
  void Shutdown();

 private:
  struct Job {
    explicit Job(common::Backoff::Options o) : backoff(o) {}
    v1::StartJob spec;
    v1::JobStatus status;
    std::optional<common::TimePoint> term_sent;
    bool stopping = false;  // the agent stopped it: no restart
    bool forget = false;    // StopJob: erased once it has ended
    common::TimePoint started_at{};
    common::TimePoint next_start{};
    common::Backoff backoff;
    common::TimePoint next_read{};  // progress is read at most this often
  };
  static constexpr common::Duration kProgressEvery = std::chrono::seconds(1);
  std::string ProgressFile(const Job& j) const;
  void SpawnLocked(Job& j, common::TimePoint now);
  // Reads the job's progress file and checkpoint directory.
  void ReadProgressLocked(Job& j);

  const JobOptions options_;
  ProcessRunner* const runner_;
  common::Clock* const clock_;
  mutable std::mutex mu_;
  std::map<std::string, Job> jobs_;  // guarded by mu_
};

}  // namespace gpuha::agent
