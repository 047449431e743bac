// One suite, every backend: what the controller needs from a store.
#include "controller/store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/etcd_server.h"
#include "common/testing/temp_dir.h"
#include "controller/etcd_store.h"

namespace gpuha::controller {
namespace {

template <typename T>
std::unique_ptr<Store> MakeStore(const std::string& path);
template <>
std::unique_ptr<Store> MakeStore<MemoryStore>(const std::string&) {
  return std::make_unique<MemoryStore>();
}
template <>
std::unique_ptr<Store> MakeStore<SqliteStore>(const std::string& path) {
  auto s = SqliteStore::Open(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

// One real etcd for the test process; each store gets its own prefix.
template <>
std::unique_ptr<Store> MakeStore<EtcdStore>(const std::string&) {
  static gpuha::testing::EtcdServer* etcd = [] {
    auto* e = new gpuha::testing::EtcdServer();
    EXPECT_TRUE(e->Start()) << e->log();
    return e;
  }();
  static int stores = 0;
  auto client = etcd::EtcdClient::Connect({.endpoints = {etcd->url()}});
  EXPECT_TRUE(client.ok()) << client.status();
  return std::make_unique<EtcdStore>(*client, absl::StrCat("/test", ++stores, "/"));
}

template <typename T>
class StoreTest : public ::testing::Test {
 protected:
  std::string path_ = (gpuha::testing::TestTempDir() / "controller.db").string();
};
using Backends = ::testing::Types<MemoryStore, SqliteStore, EtcdStore>;
TYPED_TEST_SUITE(StoreTest, Backends);

TYPED_TEST(StoreTest, BatchWritesAndDeletesReadBack) {
  auto store = MakeStore<TypeParam>(this->path_);
  ASSERT_TRUE(
      store
          ->Apply(
              {{"stream", "a", "{\"w\":1}"}, {"stream", "b", "{\"w\":2}"}, {"node", "n1", "{}"}})
          .ok());
  ASSERT_TRUE(store->Apply({{"stream", "a", std::nullopt}, {"stream", "b", "{\"w\":3}"}}).ok());
  auto rows = store->Load("stream");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, (std::map<std::string, std::string>{{"b", "{\"w\":3}"}}));
  EXPECT_EQ(store->Load("node")->size(), 1u);
  EXPECT_TRUE(store->Load("nothing")->empty());
}

// Writes of one key in one batch apply in order: the last one wins (etcd
// refuses a key twice in a transaction; its store folds them).
TYPED_TEST(StoreTest, TheLastWriteOfAKeyInABatchWins) {
  auto store = MakeStore<TypeParam>(this->path_);
  ASSERT_TRUE(store
                  ->Apply({{"s", "a", "1"},
                           {"s", "a", std::nullopt},
                           {"s", "b", "2"},
                           {"s", "b", "3"},
                           {"t", "b", "4"}})
                  .ok());
  EXPECT_EQ(*store->Load("s"), (std::map<std::string, std::string>{{"b", "3"}}));
  EXPECT_EQ(*store->Load("t"), (std::map<std::string, std::string>{{"b", "4"}}));
}

TYPED_TEST(StoreTest, EventsComeBackInOrderAfterAnId) {
  auto store = MakeStore<TypeParam>(this->path_);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(*store->AppendEvent("e" + std::to_string(i)), i + 1);
  auto events = store->LoadEvents(2, 2);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0], (std::pair<int64_t, std::string>{3, "e2"}));
  EXPECT_EQ((*events)[1].second, "e3");
}

TEST(SqliteStoreTest, CommittedStateSurvivesReopen) {
  std::string path = (gpuha::testing::TestTempDir() / "reopen.db").string();
  {
    auto s = SqliteStore::Open(path);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Apply({{"meta", "epoch", "7"}}).ok());
    ASSERT_TRUE((*s)->AppendEvent("{}").ok());
  }
  auto s = SqliteStore::Open(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*(*s)->Load("meta"))["epoch"], "7");
  EXPECT_EQ((*s)->LoadEvents(0, 10)->size(), 1u);
}

// kill -9 in the middle of a stream of batches: after a reopen, every batch
// is there whole or not at all. Each batch rewrites 200 rows with its own
// number, so a torn batch would leave rows with two numbers.
TEST(SqliteStoreTest, BatchIsAllOrNothingUnderKill9) {
  std::string path = (gpuha::testing::TestTempDir() / "torn.db").string();
  for (int round = 0; round < 5; ++round) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto s = SqliteStore::Open(path);
      if (!s.ok()) ::_exit(3);
      for (int batch = 1;; ++batch) {
        std::vector<StoreWrite> writes;
        for (int k = 0; k < 200; ++k) {
          writes.push_back(
              {"row", "k" + std::to_string(k), std::to_string(round * 1000000 + batch)});
        }
        if (!(*s)->Apply(writes).ok()) ::_exit(4);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 17 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: " << status;
    auto s = SqliteStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    auto rows = (*s)->Load("row");
    ASSERT_TRUE(rows.ok()) << rows.status();
    if (rows->empty()) continue;  // killed before the first commit
    ASSERT_EQ(rows->size(), 200u);
    std::set<std::string> values;
    for (const auto& [k, v] : *rows) values.insert(v);
    EXPECT_EQ(values.size(), 1u) << "a torn batch after kill -9 in round " << round;
  }
}

TEST(SqliteStoreTest, UnopenablePathIsAClearError) {
  auto s = SqliteStore::Open("/nonexistent/dir/controller.db");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find("/nonexistent/dir/controller.db"),
            std::string::npos);
}

// Regression: a key with a NUL byte was cut there by SQLite, and after a
// restart another tenant's stream took its place.
TEST(SqliteStoreTest, KeysAndValuesKeepEveryByte) {
  std::string path = (gpuha::testing::TestTempDir() / "nul.db").string();
  const std::string key("victim\0evil", 11);
  const std::string value("{\"a\":\"x\0y\"}", 11);
  {
    auto s = SqliteStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Apply({{"stream", key, value}, {"stream", "victim", "{}"}}).ok());
  }
  auto s = SqliteStore::Open(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto rows = (*s)->Load("stream");
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ(rows->at(key), value);
  EXPECT_EQ(rows->at("victim"), "{}");
}

// Regression: two controllers on one file each failed the other's nodes.
TEST(SqliteStoreTest, ASecondOpenOfTheSameFileIsRefused) {
  std::string path = (gpuha::testing::TestTempDir() / "locked.db").string();
  auto first = SqliteStore::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SqliteStore::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another process"), std::string::npos)
      << second.status();
  first->reset();  // released with the store (and by the kernel on kill -9)
  EXPECT_TRUE(SqliteStore::Open(path).ok());
}

// Regression: a 0-byte file, or one whose tables were dropped, started the
// controller at epoch 1 with nothing, while agents held epoch 35.
TEST(SqliteStoreTest, AFileWithoutStateIsRefusedUnlessInit) {
  std::string dir = gpuha::testing::TestTempDir().string();
  std::string empty = dir + "/empty.db";
  std::ofstream(empty).close();
  auto s = SqliteStore::Open(empty);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("holds no gpuha state"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("--init"), std::string::npos);
  EXPECT_TRUE(SqliteStore::Open(empty, {.init = true}).ok());
  EXPECT_TRUE(SqliteStore::Open(empty).ok());  // initialised now

  std::string dropped = dir + "/dropped.db";
  {
    auto d = SqliteStore::Open(dropped);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE((*d)->Apply({{"meta", "epoch", "35"}}).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dropped.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE rows", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_FALSE(SqliteStore::Open(dropped).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/fresh.db"));
  EXPECT_TRUE(SqliteStore::Open(dir + "/fresh.db").ok());  // a first start
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find("fresh.db.init"), std::string::npos) << e.path();
  }
}

// Regression: a truncated or foreign file aborted the controller.
TEST(SqliteStoreTest, ADamagedFileIsAClearError) {
  std::string dir = gpuha::testing::TestTempDir().string();
  std::string path = dir + "/damaged.db";
  {
    auto s = SqliteStore::Open(path);
    ASSERT_TRUE(s.ok());
    std::vector<StoreWrite> rows;
    for (int i = 0; i < 2000; ++i) rows.push_back({"t", std::to_string(i), std::string(100, 'x')});
    ASSERT_TRUE((*s)->Apply(rows).ok());
  }
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto truncated = SqliteStore::Open(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find(path), std::string::npos) << truncated.status();
  std::ofstream(dir + "/text.db") << "this is not a database, but it is long enough to look like "
                                     "one to a careless reader of headers\n";
  auto text = SqliteStore::Open(dir + "/text.db");
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("text.db"), std::string::npos) << text.status();
}

TEST(MemoryStoreTest, InjectedFailureAppliesNothing) {
  MemoryStore s;
  s.FailWrites(true);
  EXPECT_FALSE(s.Apply({{"t", "k", "v"}}).ok());
  s.FailWrites(false);
  EXPECT_TRUE(s.Load("t")->empty());
}

}  // namespace
}  // namespace gpuha::controller
