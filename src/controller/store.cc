#include "controller/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

namespace {

// Tables, and the row that marks a file as holding gpuha state.
constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS rows (tbl TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, PRIMARY KEY (tbl, key));"
    "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "value TEXT NOT NULL);"
    "INSERT OR IGNORE INTO rows (tbl, key, value) VALUES ('meta', 'format', '1');";

// Text goes in and out with its length, never as a C string: a key holding
// a NUL byte was once cut there, and a stream changed tenant on restart.
void BindText(sqlite3_stmt* st, int index, const std::string& text) {
  sqlite3_bind_text(st, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

// A column as text; "" for NULL (a damaged row), never a null pointer.
std::string ColumnText(sqlite3_stmt* st, int column) {
  const unsigned char* text = sqlite3_column_text(st, column);
  if (text == nullptr) return std::string();
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(st, column)));
}

}  // namespace

absl::Status MemoryStore::Apply(const std::vector<StoreWrite>& batch) {
  absl::MutexLock lock(&mu_);
  if (fail_) return absl::UnavailableError("store: injected write failure");
  for (const StoreWrite& w : batch) {
    if (w.value) {
      tables_[w.table][w.key] = *w.value;
    } else {
      tables_[w.table].erase(w.key);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> MemoryStore::Load(const std::string& table) {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(table);
  return it == tables_.end() ? std::map<std::string, std::string>{} : it->second;
}

absl::StatusOr<int64_t> MemoryStore::AppendEvent(const std::string& json) {
  absl::MutexLock lock(&mu_);
  if (fail_) return absl::UnavailableError("store: injected write failure");
  events_.push_back(json);
  return static_cast<int64_t>(events_.size());
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> MemoryStore::LoadEvents(
    int64_t after_id, size_t limit) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, std::string>> out;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(after_id, 0));
       i < events_.size() && out.size() < limit; ++i) {
    out.emplace_back(static_cast<int64_t>(i + 1), events_[i]);
  }
  return out;
}

void MemoryStore::FailWrites(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_ = fail;
}

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                               SqliteStoreOptions options) {
  struct stat st;
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("store ", path, ": is a directory"));
  }
  // A first start builds the file aside and renames it into place, so that
  // a file at `path` always holds state: one killed mid-creation leaves only
  // PATH.init, and the next start builds it again.
  if (!existed) {
    if (absl::Status s = CreateFresh(path); !s.ok()) return s;
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("store ", path, ": ", why));
  }
  // flock, not SQLite's fcntl locks (which a process drops when it closes
  // any descriptor of the file): held for the store's life, released by the
  // kernel when the process dies, so kill -9 leaves nothing to clean up.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("store ", path, ": in use by another process (", why,
                     "); one store has one controller: a second one would split the cluster"));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db, fd));
  absl::MutexLock lock(&store->mu_);  // not shared yet; what its helpers require
  auto fail = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("store ", path, ": ", why));
  };
  absl::StatusOr<std::string> check = store->QueryText("PRAGMA quick_check");
  if (!check.ok()) return fail(check.status().message());
  if (*check != "ok") {
    return fail(
        absl::StrCat("fails SQLite's integrity check (", *check, "); restore it from a backup"));
  }
  // WAL with synchronous=NORMAL: a committed batch survives a crash of the
  // process (kill -9); only power loss can take the last commits. FULL would
  // fsync every commit while the controller holds its lock, and a slow disk
  // then stalls failure detection for every node.
  for (const char* sql :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=5000"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) return fail(s.message());
  }
  // Initialised: the rows table exists and holds a row (every controller
  // writes its epoch at start, and "meta/format" at creation).
  absl::StatusOr<std::string> tables =
      store->QueryText("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='rows'");
  if (!tables.ok()) return fail(tables.status().message());
  bool initialised = false;
  if (*tables == "1") {
    absl::StatusOr<std::string> rows = store->QueryText("SELECT count(*) FROM rows");
    if (!rows.ok()) return fail(rows.status().message());
    initialised = *rows != "0";
  }
  if (!initialised && !options.init) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store ", path,
        ": exists but holds no gpuha state (empty, or its tables were dropped). A controller "
        "starting there would begin again at epoch 1 while agents hold a higher epoch and "
        "ignore its fences. Restore the file from a backup, or start once with --init to begin "
        "a new state there"));
  }
  if (absl::Status s = store->Exec(kSchema); !s.ok()) return fail(s.message());
  return store;
}

absl::Status SqliteStore::CreateFresh(const std::string& path) {
  // A name of its own, and link() into place rather than rename(): two
  // controllers starting together on a new path must not each lock a file
  // the other then replaces (a split cluster). The loser finds the path
  // taken, and opens (and fails to lock) the winner's file.
  const std::string tmp = absl::StrCat(path, ".init.", ::getpid());
  ::unlink(tmp.c_str());
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(tmp.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  char* err = nullptr;
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, kSchema, nullptr, nullptr, &err);
  std::string why = rc == SQLITE_OK ? "" : err ? err : db ? sqlite3_errmsg(db) : "out of memory";
  sqlite3_free(err);
  if (sqlite3_close(db) != SQLITE_OK && rc == SQLITE_OK) rc = SQLITE_ERROR, why = "close failed";
  if (rc == SQLITE_OK && ::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    rc = SQLITE_ERROR;
    why = std::strerror(errno);
  }
  ::unlink(tmp.c_str());
  if (rc != SQLITE_OK) {
    return absl::UnavailableError(absl::StrCat("store ", path, ": cannot create: ", why));
  }
  return absl::OkStatus();
}

SqliteStore::~SqliteStore() {
  sqlite3_close(db_);
  ::close(lock_fd_);
}

absl::StatusOr<std::string> SqliteStore::QueryText(const char* sql) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) {
    return absl::DataLossError(sqlite3_errmsg(db_));
  }
  std::string out;
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) out = ColumnText(st, 0);
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return absl::DataLossError(sqlite3_errmsg(db_));
  return out;
}

absl::Status SqliteStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::UnavailableError(msg);
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Apply(const std::vector<StoreWrite>& batch) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  sqlite3_stmt* put = nullptr;
  sqlite3_stmt* del = nullptr;
  sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO rows (tbl, key, value) VALUES (?, ?, ?)", -1,
                     &put, nullptr);
  sqlite3_prepare_v2(db_, "DELETE FROM rows WHERE tbl = ? AND key = ?", -1, &del, nullptr);
  absl::Status status;
  for (const StoreWrite& w : batch) {
    sqlite3_stmt* st = w.value ? put : del;
    sqlite3_reset(st);
    BindText(st, 1, w.table);
    BindText(st, 2, w.key);
    if (w.value) BindText(st, 3, *w.value);
    if (sqlite3_step(st) != SQLITE_DONE) {
      status = absl::UnavailableError(absl::StrCat("store write failed: ", sqlite3_errmsg(db_)));
      break;
    }
  }
  sqlite3_finalize(put);
  sqlite3_finalize(del);
  if (!status.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return status;
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::map<std::string, std::string>> SqliteStore::Load(const std::string& table) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT key, value FROM rows WHERE tbl = ?", -1, &st, nullptr);
  BindText(st, 1, table);
  std::map<std::string, std::string> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) out[ColumnText(st, 0)] = ColumnText(st, 1);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return absl::UnavailableError(absl::StrCat("store read failed: ", rc));
  return out;
}

absl::StatusOr<int64_t> SqliteStore::AppendEvent(const std::string& json) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "INSERT INTO events (value) VALUES (?)", -1, &st, nullptr);
  BindText(st, 1, json);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("store event write failed: ", sqlite3_errmsg(db_)));
  }
  return sqlite3_last_insert_rowid(db_);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> SqliteStore::LoadEvents(
    int64_t after_id, size_t limit) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT id, value FROM events WHERE id > ? ORDER BY id LIMIT ?", -1, &st,
                     nullptr);
  sqlite3_bind_int64(st, 1, after_id);
  sqlite3_bind_int64(st, 2, static_cast<int64_t>(limit));
  std::vector<std::pair<int64_t, std::string>> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    out.emplace_back(sqlite3_column_int64(st, 0), ColumnText(st, 1));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return absl::DataLossError(absl::StrCat("store read failed: ", rc));
  return out;
}

}  // namespace gpuha::controller
