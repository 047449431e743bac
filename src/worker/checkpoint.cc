#include "worker/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/net_util.h"

namespace gpuha::worker {
namespace {

constexpr absl::string_view kPrefix = "ckpt-";
constexpr absl::string_view kMagic = "gpuha-ckpt";

// DIR/LOCK held exclusively for the object's life. A holder that hangs (a
// writer stuck in fsync on a failing SAN, a stopped process) does not block
// the job's new owner for ever: after kLockWait the lock is an error.
constexpr auto kLockWait = std::chrono::seconds(10);
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    const std::string path = dir + "/LOCK";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      status_ = absl::PermissionDeniedError(
          absl::StrCat(path, ": cannot open the lock file: ", std::strerror(errno)));
      return;
    }
    const auto until = std::chrono::steady_clock::now() + kLockWait;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        status_ =
            absl::UnavailableError(absl::StrCat(path, ": cannot lock: ", std::strerror(errno)));
        return;
      }
      if (std::chrono::steady_clock::now() >= until) {
        status_ = absl::UnavailableError(
            absl::StrCat(path, ": held by another writer for ", kLockWait.count(), " s (hung?)"));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int fd_ = -1;
  absl::Status status_;
};

std::string FileName(uint64_t step) { return absl::StrFormat("%s%020u", kPrefix, step); }

// Decimal digits, nothing else ("what" names the source in the error).
absl::StatusOr<uint64_t> ParseDecimal(absl::string_view text, absl::string_view what) {
  if (text.empty()) return absl::DataLossError(absl::StrCat(what, ": empty"));
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') {
      return absl::DataLossError(absl::StrCat(
          what, ": byte ", i, " ('", absl::CHexEscape(text.substr(i, 1)), "') is not a digit"));
    }
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::DataLossError(absl::StrCat(what, ": '", text, "' is out of range"));
  }
  return v;
}

}  // namespace

absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view name, absl::string_view bytes) {
  const size_t eol = bytes.find('\n');
  if (eol == absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(name, ": no header line (torn or not a checkpoint)"));
  }
  std::vector<absl::string_view> fields = absl::StrSplit(bytes.substr(0, eol), ' ');
  if (fields.size() != 6 || fields[0] != kMagic || fields[1] != "1") {
    return absl::DataLossError(
        absl::StrCat(name, ": the header is not 'gpuha-ckpt 1 epoch=E step=S bytes=N sha256=HEX'"));
  }
  Checkpoint c;
  uint64_t size = 0;
  const std::pair<absl::string_view, uint64_t*> numbers[] = {
      {"epoch=", &c.epoch}, {"step=", &c.step}, {"bytes=", &size}};
  for (size_t i = 0; i < 3; ++i) {
    absl::string_view f = fields[2 + i];
    if (f.substr(0, numbers[i].first.size()) != numbers[i].first) {
      return absl::DataLossError(
          absl::StrCat(name, ": header field ", 3 + i, " is not ", numbers[i].first, "N"));
    }
    auto v = ParseDecimal(
        f.substr(numbers[i].first.size()),
        absl::StrCat(name, ": ", numbers[i].first.substr(0, numbers[i].first.size() - 1)));
    if (!v.ok()) return v.status();
    *numbers[i].second = *v;
  }
  if (fields[5].substr(0, 7) != "sha256=") {
    return absl::DataLossError(absl::StrCat(name, ": header field 6 is not sha256=HEX"));
  }
  absl::string_view body = bytes.substr(eol + 1);
  if (body.size() != size) {
    return absl::DataLossError(absl::StrCat(
        name, ": ", body.size(), " byte(s) of state, the header says ", size, " (torn)"));
  }
  if (common::Sha256Hex(body) != fields[5].substr(7)) {
    return absl::DataLossError(
        absl::StrCat(name, ": the state's SHA-256 does not match its header"));
  }
  c.state = std::string(body);
  return c;
}

absl::StatusOr<CheckpointDir> CheckpointDir::Open(std::string dir, size_t keep) {
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint directory: empty path");
  if (keep < 1) return absl::InvalidArgumentError("checkpoint directory: keep must be at least 1");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create the checkpoint directory: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
  }
  return CheckpointDir(std::move(dir), keep);
}

absl::StatusOr<uint64_t> CheckpointDir::FenceEpochLocked() const {
  const std::string path = dir_ + "/FENCE";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // Only a fence never written reads as 0: any other failure (EIO, ESTALE
    // on NFS) would let an older epoch claim the directory back.
    if (errno == ENOENT) return uint64_t{0};
    return absl::UnavailableError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  auto text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  absl::string_view t = *text;
  if (!t.empty() && t.back() == '\n') t.remove_suffix(1);
  return ParseDecimal(t, path);
}

absl::StatusOr<uint64_t> CheckpointDir::FenceEpoch() const {
  DirLock lock(dir_);
  if (!lock.status().ok()) return lock.status();
  return FenceEpochLocked();
}

absl::Status CheckpointDir::Claim(uint64_t epoch) const {
  if (epoch == 0) return absl::InvalidArgumentError("epoch: must be at least 1");
  DirLock lock(dir_);
  if (!lock.status().ok()) return lock.status();
  auto fence = FenceEpochLocked();
  if (!fence.ok()) return fence.status();
  if (*fence > epoch) {
    return absl::FailedPreconditionError(absl::StrCat(dir_, ": claimed by epoch ", *fence,
                                                      ", later than ", epoch,
                                                      ": this placement of the job was replaced"));
  }
  // Every write holds the lock from its first byte to its rename: a .tmp
  // seen here is one a crash left, and no writer will finish it.
  std::vector<std::string> unfinished;
  if (absl::Status s = Files(&unfinished).status(); !s.ok()) return s;
  for (const std::string& name : unfinished) ::unlink(absl::StrCat(dir_, "/", name).c_str());
  return common::WriteFileAtomic(dir_ + "/FENCE", absl::StrCat(epoch, "\n"));
}

absl::Status CheckpointDir::Write(uint64_t epoch, uint64_t step, absl::string_view state) const {
  DirLock lock(dir_);
  if (!lock.status().ok()) return lock.status();
  auto fence = FenceEpochLocked();
  if (!fence.ok()) return fence.status();
  if (*fence != epoch) {
    return absl::AbortedError(absl::StrCat(
        dir_, ": a checkpoint of epoch ", epoch, " is refused: the directory is claimed by ",
        *fence == 0
            ? std::string("no epoch (claim it first)")
            : absl::StrCat("epoch ", *fence,
                           *fence > epoch ? " (the job moved; this writer is fenced)" : "")));
  }
  std::string bytes =
      absl::StrCat(kMagic, " 1 epoch=", epoch, " step=", step, " bytes=", state.size(),
                   " sha256=", common::Sha256Hex(state), "\n", state);
  if (absl::Status s = common::WriteFileAtomic(absl::StrCat(dir_, "/", FileName(step)), bytes);
      !s.ok()) {
    return s;
  }
  // Keeps the newest `keep` whole checkpoints and removes what is older.
  // Files that do not parse are not counted: torn ones at later steps must
  // not make it remove the checkpoint just written.
  auto files = Files();
  if (!files.ok()) return files.status();
  size_t whole = 0;
  for (auto it = files->rbegin(); it != files->rend(); ++it) {
    const std::string path = absl::StrCat(dir_, "/", it->second);
    if (whole >= keep_) {
      ::unlink(path.c_str());
    } else if (auto b = common::ReadFile(path); b.ok() && ParseCheckpoint(it->second, *b).ok()) {
      ++whole;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> CheckpointDir::Files(
    std::vector<std::string>* unfinished) const {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir_, ": cannot list: ", std::strerror(errno)));
  }
  std::vector<std::pair<uint64_t, std::string>> out;
  while (dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (name.substr(0, kPrefix.size()) != kPrefix) continue;
    if (name.size() == kPrefix.size() + 24 && name.substr(name.size() - 4) == ".tmp") {
      if (unfinished != nullptr) unfinished->push_back(std::string(name));
      continue;
    }
    if (name.size() != kPrefix.size() + 20) continue;
    auto step = ParseDecimal(name.substr(kPrefix.size()), name);
    if (!step.ok()) continue;  // not one of ours
    out.emplace_back(*step, std::string(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::optional<Checkpoint>> CheckpointDir::Latest(
    std::vector<std::string>* skipped) const {
  DirLock lock(dir_);  // no writer prunes a file between the listing and its read
  if (!lock.status().ok()) return lock.status();
  std::vector<std::string> unfinished;
  auto files = Files(&unfinished);
  if (!files.ok()) return files.status();
  if (skipped != nullptr) {  // writes a crash left unfinished: never read
    for (const std::string& name : unfinished) {
      skipped->push_back(absl::StrCat(name, ": an unfinished write"));
    }
  }
  for (auto it = files->rbegin(); it != files->rend(); ++it) {
    auto bytes = common::ReadFile(absl::StrCat(dir_, "/", it->second));
    // Storage that cannot be read is an error, not a torn checkpoint: the
    // job must not quietly resume from an older one.
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<Checkpoint> c = ParseCheckpoint(it->second, *bytes);
    if (c.ok() && c->step != it->first) {
      c = absl::DataLossError(absl::StrCat(it->second, ": its header says step ", c->step));
    }
    if (c.ok()) return std::optional<Checkpoint>(std::move(*c));
    if (skipped != nullptr) skipped->push_back(std::string(c.status().message()));
  }
  return std::optional<Checkpoint>();
}

absl::StatusOr<std::vector<Checkpoint>> CheckpointDir::List() const {
  auto files = Files();
  if (!files.ok()) return files.status();
  std::vector<Checkpoint> out;
  for (const auto& [step, name] : *files) {
    auto bytes = common::ReadFile(absl::StrCat(dir_, "/", name));
    if (!bytes.ok()) continue;  // removed meanwhile
    absl::StatusOr<Checkpoint> c = ParseCheckpoint(name, *bytes);
    if (!c.ok()) continue;
    c->state.clear();
    out.push_back(std::move(*c));
  }
  return out;
}

}  // namespace gpuha::worker
