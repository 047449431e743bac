#include "agent/job_supervisor.h"

#include <signal.h>
#include <time.h>

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/log.h"
#include "worker/checkpoint.h"

namespace gpuha::agent {

JobSupervisor::JobSupervisor(JobOptions options, ProcessRunner* runner, common::Clock* clock)
    : options_(std::move(options)), runner_(runner), clock_(clock) {}

JobSupervisor::~JobSupervisor() { Shutdown(); }

std::string JobSupervisor::ProgressFile(const Job& j) const {
  return absl::StrCat(options_.progress_dir, "/", j.spec.job(), ".", j.spec.job_epoch(),
                      ".progress");
}

void JobSupervisor::Start(const v1::StartJob& start) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(start.job());
  if (it != jobs_.end()) {
    Job& old = it->second;
    if (old.spec.job_epoch() >= start.job_epoch()) return;  // a repeat, or older
    if (old.status.running()) {
      // The older placement must end before this one runs: it is stopped,
      // and the new one starts on a later tick.
      spdlog::warn("jobs: {} placement {} replaced by {}; stopping the old one", start.job(),
                   old.spec.job_epoch(), start.job_epoch());
      if (!old.term_sent) {
        runner_->Signal(old.status.pid(), SIGTERM);
        old.term_sent = clock_->Now();
      }
      old.stopping = true;
      old.forget = true;
      // Kept under a name no job has until it ends (job names never hold
      // '~'); reported while it runs, and the new one waits for it.
      auto node = jobs_.extract(it);
      node.key() = absl::StrCat(start.job(), "~", old.spec.job_epoch());
      jobs_.insert(std::move(node));
    } else {
      jobs_.erase(it);
    }
  }
  Job j(options_.backoff);
  j.spec = start;
  j.status.set_job(start.job());
  j.status.set_job_epoch(start.job_epoch());
  j.next_start = clock_->Now();
  jobs_.emplace(start.job(), std::move(j));
}

void JobSupervisor::Stop(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  it->second.stopping = true;
  it->second.forget = true;
}

void JobSupervisor::StopAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, j] : jobs_) j.stopping = true;
}

void JobSupervisor::SpawnLocked(Job& j, common::TimePoint now) {
  std::vector<std::string> argv;
  const std::string progress = ProgressFile(j);
  for (const std::string& a : j.spec.argv()) {
    argv.push_back(absl::StrReplaceAll(a, {{"{progress_file}", progress}}));
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.progress_dir, ec);
  if (ec) spdlog::error("jobs: {}: {}: {}", j.spec.job(), options_.progress_dir, ec.message());
  // Where it resumes: the newest complete checkpoint now.
  j.next_read = {};
  ReadProgressLocked(j);
  j.status.set_resumed_from(j.status.checkpoint_step());
  auto pid = runner_->Spawn(argv);
  j.started_at = now;
  if (!pid.ok()) {
    j.status.set_last_exit(absl::StrCat("spawn failed: ", pid.status().message()));
    j.next_start = now + j.backoff.Next();
    spdlog::error("jobs: {}: {}", j.spec.job(), pid.status().message());
    return;
  }
  j.status.set_running(true);
  j.status.set_pid(*pid);
  j.status.set_last_exit("");
  spdlog::info("jobs: {} started at placement {} (pid {})", j.spec.job(), j.spec.job_epoch(), *pid);
}

void JobSupervisor::ReadProgressLocked(Job& j) {
  // A listing reads every checkpoint whole: at most once a second.
  const common::TimePoint now = clock_->Now();
  if (now < j.next_read) return;
  j.next_read = now + kProgressEvery;
  if (auto text = common::ReadFile(ProgressFile(j)); text.ok()) {
    uint64_t step = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &step) && step > j.status.step()) {
      j.status.set_step(step);
    }
  }
  if (j.spec.checkpoint_dir().empty()) return;
  auto dir = worker::CheckpointDir::Open(j.spec.checkpoint_dir());
  if (!dir.ok()) return;
  auto list = dir->List();
  if (!list.ok() || list->empty()) return;
  j.status.set_checkpoint_step(list->back().step);
  j.status.set_checkpoint_epoch(list->back().epoch);
}

void JobSupervisor::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const common::TimePoint now = clock_->Now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& j = it->second;
    if (j.status.running()) {
      if (std::optional<std::string> exit = runner_->Poll(j.status.pid())) {
        j.status.set_running(false);
        j.status.set_last_exit(*exit);
        j.term_sent.reset();
        j.next_read = {};  // its last checkpoint, reported
        ReadProgressLocked(j);
        if (j.stopping) {
          j.status.set_stopped(true);
        } else if (*exit == "exit 0") {
          j.status.set_done(true);
        } else if (*exit != absl::StrCat("exit ", kJobExitFenced)) {
          j.status.set_restarts(j.status.restarts() + 1);
          j.backoff.MaybeReset(j.started_at, now);
          j.next_start = now + j.backoff.Next();
          spdlog::warn("jobs: {} pid {} ended ({}); restart {} in {} ms", j.spec.job(),
                       j.status.pid(), *exit, j.status.restarts(),
                       common::ToMillis(j.next_start - now));
        } else {
          spdlog::warn("jobs: {}: a later placement holds its checkpoint directory; not restarted",
                       j.spec.job());
        }
        spdlog::info("jobs: {} pid {} ended ({})", j.spec.job(), j.status.pid(), *exit);
      } else if (j.stopping) {
        if (!j.term_sent) {
          runner_->Signal(j.status.pid(), SIGTERM);
          j.term_sent = now;
        } else if (now - *j.term_sent >= options_.stop_grace) {
          runner_->Signal(j.status.pid(), SIGKILL);
        }
      }
    }
    const bool ended = j.status.done() || j.status.stopped() || j.stopping ||
                       j.status.last_exit() == absl::StrCat("exit ", kJobExitFenced);
    // An older placement of the same job, still on its way out, ends first.
    bool older_runs = false;
    for (const auto& [other, o] : jobs_) {
      older_runs = older_runs || (&o != &j && o.spec.job() == j.spec.job() && o.status.running());
    }
    if (!j.status.running() && !ended && !older_runs && now >= j.next_start) SpawnLocked(j, now);
    if (j.status.running()) ReadProgressLocked(j);
    if (j.forget && !j.status.running()) {
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<v1::JobStatus> JobSupervisor::Status() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::JobStatus> out;
  for (const auto& [name, j] : jobs_) {
    // A stopped job being forgotten still counts while its process lives:
    // its node's fence is not confirmed before it ends.
    if (!j.forget || j.status.running()) out.push_back(j.status);
  }
  return out;
}

bool JobSupervisor::AnyRunning() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, j] : jobs_) {
    if (j.status.running()) return true;
  }
  return false;
}

void JobSupervisor::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  // SIGTERM first: a job checkpoints the step it reached on its way out.
  for (auto& [name, j] : jobs_) {
    if (j.status.running() && !j.term_sent) runner_->Signal(j.status.pid(), SIGTERM);
  }
  // Real time, 10 ms a poll: stop_grace, then SIGKILL and at most 1 s more
  // (a process stuck in the kernel may never end; the agent exits anyway).
  const int64_t grace_polls = common::ToMillis(options_.stop_grace) / 10;
  for (auto& [name, j] : jobs_) {
    for (int64_t i = 0; j.status.running() && i < grace_polls + 100; ++i) {
      if (runner_->Poll(j.status.pid())) {
        j.status.set_running(false);
        break;
      }
      if (i >= grace_polls) runner_->Signal(j.status.pid(), SIGKILL);
      struct timespec ts = {0, 10'000'000};
      ::nanosleep(&ts, nullptr);
    }
    if (j.status.running()) spdlog::error("jobs: {} pid {} did not end", name, j.status.pid());
  }
}

}  // namespace gpuha::agent
