// CheckpointDir: a training job's checkpoints on shared storage (a SAN or
// NFS mount in production, a directory in tests), fenced by epoch: the
// software form of SCSI-3 persistent reservations. The controller gives each
// placement of a job a new epoch; the job's new owner claims the directory
// with it before reading the latest checkpoint, and from then on a writer
// of an older epoch (a partitioned node that still runs) is refused.
//
//   DIR/FENCE        the epoch that may write (decimal, one line)
//   DIR/LOCK         flock'd around every claim and write, so no claim
//                    lands between a writer's fence check and its rename
//   DIR/ckpt-STEP    a complete checkpoint (STEP zero-padded to 20 digits):
//                    written to ckpt-STEP.tmp, synced, renamed into place
//
// A checkpoint holds a header line, "gpuha-ckpt 1 epoch=E step=S bytes=N
// sha256=HEX", then the N bytes of state. One that does not parse or whose
// checksum fails (storage that tore it) is skipped, and the one before it
// used. The newest `keep` checkpoints are kept; older ones are removed.
//
//   auto dir = CheckpointDir::Open("/mnt/san/job-1");
//   RETURN_IF_ERROR(dir->Claim(epoch));
//   auto latest = dir->Latest();             // resume from here
//   RETURN_IF_ERROR(dir->Write(epoch, step, state));
//
// Thread-safety: calls on one object from several threads are serialised by
// the lock file, as calls from several processes are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::worker {

struct Checkpoint {
  uint64_t epoch = 0;
  uint64_t step = 0;
  std::string state;
};

class CheckpointDir {
 public:
  // Creates the directory if it is absent. `keep`: complete checkpoints kept.
  static absl::StatusOr<CheckpointDir> Open(std::string dir, size_t keep = 3);

  // The epoch that may write now (0: never claimed).
  [[nodiscard]] absl::StatusOr<uint64_t> FenceEpoch() const;
  // Makes `epoch` the one that may write, and removes the unfinished writes
  // (.tmp) a crashed writer left. FailedPrecondition if the directory is
  // already claimed by a later epoch (this owner was replaced).
  [[nodiscard]] absl::Status Claim(uint64_t epoch) const;
  // Writes a complete checkpoint of `state` at `step` for `epoch`.
  // Aborted (and only for this), naming both epochs, unless `epoch` holds
  // the fence: the job's owner was replaced, or never claimed.
  [[nodiscard]] absl::Status Write(uint64_t epoch, uint64_t step, absl::string_view state) const;
  // The complete checkpoint with the highest step; nullopt if there is none.
  // Files that are not whole checkpoints are named in `*skipped`, each with why.
  [[nodiscard]] absl::StatusOr<std::optional<Checkpoint>> Latest(
      std::vector<std::string>* skipped = nullptr) const;
  // Every complete checkpoint's epoch and step, oldest first (no state).
  [[nodiscard]] absl::StatusOr<std::vector<Checkpoint>> List() const;

  const std::string& path() const { return dir_; }

 private:
  CheckpointDir(std::string dir, size_t keep) : dir_(std::move(dir)), keep_(keep) {}
  absl::StatusOr<uint64_t> FenceEpochLocked() const;
  // Checkpoint files by step, newest last; `unfinished`: the names of
  // writes a crash left (.tmp), if wanted.
  absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> Files(
      std::vector<std::string>* unfinished = nullptr) const;

  std::string dir_;
  size_t keep_;
};

// Parses one checkpoint file's bytes (`name` for errors).
absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view name, absl::string_view bytes);

}  // namespace gpuha::worker
