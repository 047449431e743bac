// Store: the controller's durable state, behind an interface so a second
// backend (etcd) can follow. Rows are JSON documents in named tables; a batch
// of writes is atomic, and an acknowledged write survives kill -9.
//
//   auto store = SqliteStore::Open("/var/lib/gpuha/controller.db");
//   RETURN_IF_ERROR((*store)->Apply({{"stream", "cam-17", json_text}}));
//
// Backends: SqliteStore (WAL, synchronous=NORMAL: kill -9 safe) and MemoryStore (tests; can
// be told to fail writes, like a disk that lost power).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct sqlite3;

namespace gpuha::controller {

struct StoreWrite {
  std::string table;
  std::string key;
  std::optional<std::string> value;  // nullopt deletes the row
};

class Store {
 public:
  virtual ~Store() = default;
  // "memory" or "sqlite": the API and `gpuha ctl status` name the backend.
  virtual const char* Kind() const = 0;
  [[nodiscard]] virtual absl::Status Apply(const std::vector<StoreWrite>& batch) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& table) = 0;
  // Events are appended and read back in order; ids start at 1.
  [[nodiscard]] virtual absl::StatusOr<int64_t> AppendEvent(const std::string& json) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(
      int64_t after_id, size_t limit) = 0;
};

class MemoryStore : public Store {
 public:
  const char* Kind() const override { return "memory"; }
  [[nodiscard]] absl::Status Apply(const std::vector<StoreWrite>& batch) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& table) override;
  [[nodiscard]] absl::StatusOr<int64_t> AppendEvent(const std::string& json) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(
      int64_t after_id, size_t limit) override;
  // Fault injection: every write fails until cleared, and nothing is applied.
  void FailWrites(bool fail);

 private:
  absl::Mutex mu_;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::map<std::string, std::string>> tables_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// Opening a SqliteStore:
// - takes an exclusive lock on the file for the store's life: a second
//   controller on the same file is refused at start (two once split the
//   cluster and each failed the other's nodes);
// - runs SQLite's quick_check: a damaged file is a clear error, not a crash;
// - refuses a file that exists but holds no gpuha state (0 bytes, or its
//   tables dropped) unless `init`: starting there would begin again at epoch
//   1 while agents hold a higher one and ignore its fences. A path that does
//   not exist yet is a first start: the file is built aside and linked into
//   place, so a file at the path always holds state.
struct SqliteStoreOptions {
  bool init = false;  // `gpuha controller --init`
};

class SqliteStore : public Store {
 public:
  const char* Kind() const override { return "sqlite"; }
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(
      const std::string& path, SqliteStoreOptions options = {});
  ~SqliteStore() override;
  [[nodiscard]] absl::Status Apply(const std::vector<StoreWrite>& batch) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& table) override;
  [[nodiscard]] absl::StatusOr<int64_t> AppendEvent(const std::string& json) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(
      int64_t after_id, size_t limit) override;

 private:
  SqliteStore(sqlite3* db, int lock_fd) : db_(db), lock_fd_(lock_fd) {}
  [[nodiscard]] absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds an initialised file at PATH.init.PID and links it to `path`
  // (unless another process got there first).
  [[nodiscard]] static absl::Status CreateFresh(const std::string& path);
  // The first column of the first row of `sql`, as text ("" when none).
  [[nodiscard]] absl::StatusOr<std::string> QueryText(const char* sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  int lock_fd_;  // holds the flock; closed after the database
};

}  // namespace gpuha::controller
