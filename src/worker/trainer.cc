#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/net_util.h"
#include "worker/checkpoint.h"

namespace gpuha::worker {
using common::Sha256;

std::string InitialTrainState() { return Sha256("gpuha-train"); }

std::string TrainStep(const std::string& state, uint64_t step) {
  std::string in = state;
  for (int i = 0; i < 8; ++i) in.push_back(static_cast<char>((step >> (8 * i)) & 0xff));
  return Sha256(in);
}

std::string TrainStateAfter(uint64_t steps) {
  std::string state = InitialTrainState();
  for (uint64_t s = 1; s <= steps; ++s) state = TrainStep(state, s);
  return state;
}

absl::StatusOr<TrainResult> Train(const TrainOptions& o, const std::atomic<bool>* stop,
                                  const std::function<void(uint64_t, bool)>& on_step) {
  if (o.epoch == 0) return absl::InvalidArgumentError("--epoch: must be at least 1");
  if (o.steps == 0) return absl::InvalidArgumentError("--steps: must be at least 1");
  if (o.checkpoint_every == 0) {
    return absl::InvalidArgumentError("--checkpoint-every: must be at least 1");
  }
  auto dir = CheckpointDir::Open(o.checkpoint_dir);
  if (!dir.ok()) return dir.status();
  // Claim first: from here no older placement can write, so the checkpoint
  // read next is the last one there will be before this run's.
  if (absl::Status s = dir->Claim(o.epoch); !s.ok()) return s;
  std::vector<std::string> skipped;
  auto latest = dir->Latest(&skipped);
  if (!latest.ok()) return latest.status();
  for (const std::string& why : skipped) spdlog::warn("trainer: skipped {}", why);
  TrainResult r;
  std::string state = InitialTrainState();
  if (*latest) {
    if ((*latest)->state.size() != state.size()) {
      return absl::DataLossError(absl::StrCat(o.checkpoint_dir, ": checkpoint at step ",
                                              (*latest)->step, " holds ", (*latest)->state.size(),
                                              " byte(s) of state, not ", state.size()));
    }
    if ((*latest)->step > o.steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint-dir: ", o.checkpoint_dir, ": its latest checkpoint is at step ",
          (*latest)->step, ", past this job's ", o.steps, " steps (another job's directory?)"));
    }
    state = (*latest)->state;
    r.resumed_from = r.step = (*latest)->step;
  }
  spdlog::info("trainer: epoch {} starts at step {} of {}", o.epoch, r.step, o.steps);
  auto stopping = [&] { return stop != nullptr && stop->load(); };
  auto checkpoint = [&]() -> absl::Status {
    if (absl::Status s = dir->Write(o.epoch, r.step, state); !s.ok()) return s;
    ++r.checkpoints;
    return absl::OkStatus();
  };
  while (r.step < o.steps) {
    // The step's GPU time, cut short by a stop: the step is then not taken.
    const auto until = std::chrono::steady_clock::now() + o.step_time;
    while (!stopping() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::min<common::Duration>(
          std::chrono::milliseconds(20),
          std::chrono::duration_cast<common::Duration>(until - std::chrono::steady_clock::now())));
    }
    if (stopping()) {
      // A planned move: keep every step taken.
      if (r.checkpoints == 0 || r.step % o.checkpoint_every != 0) {
        if (absl::Status s = checkpoint(); !s.ok()) return s;
      }
      r.state = absl::BytesToHexString(state);
      return r;
    }
    state = TrainStep(state, r.step + 1);
    ++r.step;
    const bool due = r.step % o.checkpoint_every == 0 || r.step == o.steps;
    if (due) {
      if (absl::Status s = checkpoint(); !s.ok()) return s;
    }
    if (on_step) on_step(r.step, due);
  }
  r.done = true;
  r.state = absl::BytesToHexString(state);
  return r;
}

}  // namespace gpuha::worker
