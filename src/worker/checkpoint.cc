#include "worker/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

// DIR/LOCK held exclusively for the object's life.
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
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      status_ = absl::UnavailableError(absl::StrCat(path, ": cannot lock: ", std::strerror(errno)));
      return;
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
  if (!absl::SimpleAtoi(text, &v)) return absl::DataLossError(absl::StrCat(what, ": out of range"));
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
  std::string sha;
  const std::pair<absl::string_view, uint64_t*> numbers[] = {
      {"epoch=", &c.epoch}, {"step=", &c.step}, {"bytes=", &size}};
  for (size_t i = 0; i < 3; ++i) {
    absl::string_view f = fields[2 + i];
    if (f.substr(0, numbers[i].first.size()) != numbers[i].first) {
      return absl::DataLossError(
          absl::StrCat(name, ": header field ", 3 + i, " is not ", numbers[i].first, "N"));
    }
    auto v =
        ParseDecimal(f.substr(numbers[i].first.size()), absl::StrCat(name, ": ", numbers[i].first));
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
  if (::access(path.c_str(), F_OK) != 0) return uint64_t{0};
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
  return common::WriteFileAtomic(dir_ + "/FENCE", absl::StrCat(epoch, "\n"));
}

absl::Status CheckpointDir::Write(uint64_t epoch, uint64_t step, absl::string_view state) const {
  DirLock lock(dir_);
  if (!lock.status().ok()) return lock.status();
  auto fence = FenceEpochLocked();
  if (!fence.ok()) return fence.status();
  if (*fence != epoch) {
    return absl::PermissionDeniedError(absl::StrCat(
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
  auto files = Files();
  if (!files.ok()) return files.status();
  for (size_t i = 0; i + keep_ < files->size(); ++i) {
    ::unlink(absl::StrCat(dir_, "/", (*files)[i].second).c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> CheckpointDir::Files() const {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir_, ": cannot list: ", std::strerror(errno)));
  }
  std::vector<std::pair<uint64_t, std::string>> out;
  while (dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (name.substr(0, kPrefix.size()) != kPrefix || name.size() != kPrefix.size() + 20) continue;
    uint64_t step = 0;
    if (!absl::SimpleAtoi(name.substr(kPrefix.size()), &step)) continue;
    out.emplace_back(step, std::string(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::optional<Checkpoint>> CheckpointDir::Latest(
    std::vector<std::string>* skipped) const {
  auto files = Files();
  if (!files.ok()) return files.status();
  if (skipped != nullptr) {  // writes a crash left unfinished: never read
    DIR* d = ::opendir(dir_.c_str());
    while (d != nullptr) {
      dirent* e = ::readdir(d);
      if (e == nullptr) break;
      absl::string_view name = e->d_name;
      if (name.substr(0, kPrefix.size()) == kPrefix && name.size() > 4 &&
          name.substr(name.size() - 4) == ".tmp") {
        skipped->push_back(absl::StrCat(name, ": an unfinished write"));
      }
    }
    if (d != nullptr) ::closedir(d);
  }
  for (auto it = files->rbegin(); it != files->rend(); ++it) {
    auto bytes = common::ReadFile(absl::StrCat(dir_, "/", it->second));
    absl::StatusOr<Checkpoint> c = bytes.ok() ? ParseCheckpoint(it->second, *bytes)
                                              : absl::StatusOr<Checkpoint>(bytes.status());
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
