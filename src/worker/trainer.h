// Trainer: `gpuha worker --train`, a small deterministic training job that
// makes a job's takeover checkable. Its state after step n is a function of
// the step and the state before it (state_0 = SHA-256("gpuha-train"),
// state_n = SHA-256(state_{n-1} || n)), so a run resumed from any complete
// checkpoint ends in exactly the state of a run never interrupted.
//
// It claims the checkpoint directory with its epoch, resumes from the
// latest complete checkpoint, checkpoints every `checkpoint_every` steps and
// at the end, and on a stop request (a planned move) checkpoints the step it
// reached before it returns, so a drain loses no step. Once a later epoch
// claims the directory its writes are refused and it stops (Aborted):
// a partitioned node that still runs cannot corrupt the new owner's state.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace gpuha::worker {

struct TrainOptions {
  std::string checkpoint_dir;
  uint64_t epoch = 1;              // this placement's; the controller gives each a new one
  uint64_t steps = 1000;           // the job is done after this many
  uint64_t checkpoint_every = 50;  // steps
  common::Duration step_time = std::chrono::milliseconds(10);  // modelled GPU time per step
};

struct TrainResult {
  uint64_t resumed_from = 0;  // the step of the checkpoint it started from (0: none)
  uint64_t step = 0;          // the step it reached (== steps when done)
  std::string state;          // the state after `step`, as hex
  uint64_t checkpoints = 0;   // written by this run
  bool done = false;          // reached `steps` (false: stopped on request)
};

// The model: the initial state and one step.
std::string InitialTrainState();
std::string TrainStep(const std::string& state, uint64_t step);
// The state after `steps` steps of a run that never failed (raw bytes):
// what any resumed run must reach.
std::string TrainStateAfter(uint64_t steps);

// Runs the job until it is done or `*stop` turns true. `on_step` is called
// after each step, with whether a checkpoint of it was written. Errors:
// InvalidArgument for bad options; Aborted when a later epoch took
// the directory while it ran (fenced); FailedPrecondition when a later epoch
// held it before this one started; InvalidArgument also when its latest
// checkpoint is past `steps` (another job's directory); DataLoss or others
// for storage that fails.
absl::StatusOr<TrainResult> Train(
    const TrainOptions& o, const std::atomic<bool>* stop,
    const std::function<void(uint64_t step, bool checkpointed)>& on_step = {});

}  // namespace gpuha::worker
