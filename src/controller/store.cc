#include "controller/store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

absl::Status MemoryStore::Apply(const std::vector<StoreWrite>& batch) {
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(table);
  return it == tables_.end() ? std::map<std::string, std::string>{} : it->second;
}

absl::StatusOr<int64_t> MemoryStore::AppendEvent(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_) return absl::UnavailableError("store: injected write failure");
  events_.push_back(json);
  return static_cast<int64_t>(events_.size());
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> MemoryStore::LoadEvents(
    int64_t after_id, size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, std::string>> out;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(after_id, 0));
       i < events_.size() && out.size() < limit; ++i) {
    out.emplace_back(static_cast<int64_t>(i + 1), events_[i]);
  }
  return out;
}

void MemoryStore::FailWrites(bool fail) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_ = fail;
}

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("store ", path, ": ", why));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  // WAL with synchronous=NORMAL: a committed batch survives a crash of the
  // process (kill -9); only power loss can take the last commits. FULL would
  // fsync every commit while the controller holds its lock, and a slow disk
  // then stalls failure detection for every node.
  for (const char* sql :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=5000",
        "CREATE TABLE IF NOT EXISTS rows (tbl TEXT NOT NULL, key TEXT NOT NULL, "
        "value TEXT NOT NULL, PRIMARY KEY (tbl, key))",
        "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY "
        "AUTOINCREMENT, value TEXT NOT NULL)"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("store ", path, ": ", s.message()));
    }
  }
  return store;
}

SqliteStore::~SqliteStore() { sqlite3_close(db_); }

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
  std::lock_guard<std::mutex> lock(mu_);
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
    sqlite3_bind_text(st, 1, w.table.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, w.key.c_str(), -1, SQLITE_TRANSIENT);
    if (w.value) sqlite3_bind_text(st, 3, w.value->c_str(), -1, SQLITE_TRANSIENT);
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
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT key, value FROM rows WHERE tbl = ?", -1, &st, nullptr);
  sqlite3_bind_text(st, 1, table.c_str(), -1, SQLITE_TRANSIENT);
  std::map<std::string, std::string> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    out[reinterpret_cast<const char*>(sqlite3_column_text(st, 0))] =
        reinterpret_cast<const char*>(sqlite3_column_text(st, 1));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return absl::UnavailableError(absl::StrCat("store read failed: ", rc));
  return out;
}

absl::StatusOr<int64_t> SqliteStore::AppendEvent(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "INSERT INTO events (value) VALUES (?)", -1, &st, nullptr);
  sqlite3_bind_text(st, 1, json.c_str(), -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("store event write failed: ", sqlite3_errmsg(db_)));
  }
  return sqlite3_last_insert_rowid(db_);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> SqliteStore::LoadEvents(
    int64_t after_id, size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT id, value FROM events WHERE id > ? ORDER BY id LIMIT ?", -1, &st,
                     nullptr);
  sqlite3_bind_int64(st, 1, after_id);
  sqlite3_bind_int64(st, 2, static_cast<int64_t>(limit));
  std::vector<std::pair<int64_t, std::string>> out;
  while (sqlite3_step(st) == SQLITE_ROW) {
    out.emplace_back(sqlite3_column_int64(st, 0),
                     reinterpret_cast<const char*>(sqlite3_column_text(st, 1)));
  }
  sqlite3_finalize(st);
  return out;
}

}  // namespace gpuha::controller
