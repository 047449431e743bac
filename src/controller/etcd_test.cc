// The etcd store's leadership and fencing, and its endpoints, against a real
// etcd (the typed store suite in store_test.cc covers its rows and events).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/etcd_server.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_certs.h"
#include "controller/etcd_leader.h"
#include "controller/etcd_store.h"
#include "etcd/client.h"

namespace gpuha::controller {
namespace {

using etcd::EtcdClient;
using etcd::PrefixEnd;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd_.Start()) << etcd_.log(); }
  std::shared_ptr<EtcdClient> Client() {
    auto c = EtcdClient::Connect({.endpoints = {etcd_.url()}, .timeout = milliseconds(500)});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  gpuha::testing::EtcdServer etcd_;
  std::atomic<bool> stopping_{false};
};

TEST_F(EtcdTest, ASecondControllerWaitsAndTakesOverWhenTheLeaderResigns) {
  EtcdLeader a(Client(), "/gpuha/leader", "ctrl-a", milliseconds(2000));
  auto token_a = a.Campaign(&stopping_);
  ASSERT_TRUE(token_a.ok()) << token_a.status();
  EXPECT_EQ(*a.Holder(), "ctrl-a");
  EtcdLeader b(Client(), "/gpuha/leader", "ctrl-b", milliseconds(2000));
  auto b_leads = std::async(std::launch::async, [&] { return b.Campaign(&stopping_); });
  EXPECT_EQ(b_leads.wait_for(milliseconds(700)), std::future_status::timeout)
      << "two controllers lead at once";
  auto resigned = std::chrono::steady_clock::now();
  a.Resign();
  ASSERT_EQ(b_leads.wait_for(milliseconds(1500)), std::future_status::ready)
      << "the standby did not take over after the leader resigned";
  auto token_b = b_leads.get();
  ASSERT_TRUE(token_b.ok()) << token_b.status();
  // Well inside the lease's TTL: a resignation hands over at once.
  EXPECT_LT(std::chrono::steady_clock::now() - resigned, milliseconds(1000));
  EXPECT_GT(*token_b, *token_a);  // the fencing token only grows
  EXPECT_EQ(*b.Holder(), "ctrl-b");
}

TEST_F(EtcdTest, ADeposedLeaderCommitsNothing) {
  auto client = Client();
  EtcdLeader a(client, "/gpuha/leader", "ctrl-a", milliseconds(2000));
  auto token_a = a.Campaign(&stopping_);
  ASSERT_TRUE(token_a.ok());
  EtcdStore old_store(client, "/gpuha/");
  old_store.SetFence(a.key(), *token_a);
  int told = 0;  // the controller stops acting on this
  old_store.OnFenceLost([&] { ++told; });
  ASSERT_TRUE(old_store.Apply({{"meta", "epoch", "1"}}).ok());
  ASSERT_EQ(*old_store.AppendEvent("{\"by\":\"a\"}"), 1);

  a.Resign();  // or its lease ran out while it was paused
  EtcdLeader b(Client(), "/gpuha/leader", "ctrl-b", milliseconds(2000));
  auto token_b = b.Campaign(&stopping_);
  ASSERT_TRUE(token_b.ok());
  EtcdStore new_store(Client(), "/gpuha/");
  new_store.SetFence(b.key(), *token_b);
  ASSERT_TRUE(new_store.Apply({{"meta", "epoch", "2"}}).ok());

  absl::Status late = old_store.Apply({{"meta", "epoch", "1"}, {"node", "n1", "{}"}});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(late.message(), HasSubstr("no longer leads"));
  EXPECT_EQ(told, 1);
  auto late_event = old_store.AppendEvent("{\"by\":\"a\"}");
  EXPECT_EQ(late_event.status().code(), absl::StatusCode::kFailedPrecondition)
      << late_event.status();
  EXPECT_EQ(told, 1) << "told once, not per refused write";
  EXPECT_EQ((*new_store.Load("meta"))["epoch"], "2");
  EXPECT_TRUE(new_store.Load("node")->empty());
  EXPECT_EQ(*new_store.AppendEvent("{\"by\":\"b\"}"), 2);
  EXPECT_EQ(new_store.LoadEvents(0, 10)->size(), 2u);
}

// Adversarial finding: a garbage event counter (written by hand) stopped
// every event from being stored, while the API went on answering 201. The
// counter is rebuilt from the event keys, and nothing is overwritten.
TEST_F(EtcdTest, AGarbageEventCounterIsRebuiltFromTheEventsStored) {
  EtcdStore store(Client(), "/gpuha/");
  ASSERT_EQ(*store.AppendEvent("{\"n\":1}"), 1);
  ASSERT_EQ(*store.AppendEvent("{\"n\":2}"), 2);
  for (const char* garbage : {"x", "-5", ""}) {
    SCOPED_TRACE(garbage);
    etcdserverpb::TxnRequest txn;
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key("/gpuha/e-next");
    put->set_value(garbage);
    ASSERT_TRUE(Client()->Txn(txn).ok());
    auto id = store.AppendEvent("{\"after\":\"garbage\"}");
    ASSERT_TRUE(id.ok()) << id.status();
    auto events = store.LoadEvents(0, 100);
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(static_cast<int64_t>(events->size()), *id);
    EXPECT_EQ((*events)[0].second, "{\"n\":1}");
    EXPECT_EQ((*events)[1].second, "{\"n\":2}");
  }
  // An empty store with a garbage counter starts at 1.
  EtcdStore other(Client(), "/other/");
  etcdserverpb::TxnRequest txn;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key("/other/e-next");
  put->set_value("garbage");
  ASSERT_TRUE(Client()->Txn(txn).ok());
  EXPECT_EQ(*other.AppendEvent("{}"), 1);
}

// A leader that cannot renew its lease (etcd hung, or without quorum) hears
// so within about one TTL, and stops.
TEST_F(EtcdTest, ALeaderThatCannotRenewItsLeaseIsToldItLostIt) {
  EtcdLeader a(Client(), "/gpuha/leader", "ctrl-a", milliseconds(1500));
  ASSERT_TRUE(a.Campaign(&stopping_).ok());
  std::promise<std::string> lost;
  a.KeepAlive([&](const std::string& why) { lost.set_value(why); });
  auto told = lost.get_future();
  EXPECT_EQ(told.wait_for(milliseconds(2500)), std::future_status::timeout)
      << "a renewing leader was told it lost the lease";
  EXPECT_TRUE(a.Holds());
  auto paused = std::chrono::steady_clock::now();
  etcd_.Pause();
  ASSERT_EQ(told.wait_for(milliseconds(4000)), std::future_status::ready);
  EXPECT_THAT(told.get(), HasSubstr("no renewal of the leader lease"));
  EXPECT_FALSE(a.Holds());
  // Told a margin before the TTL of 1500 ms since the last renewal, which
  // was at most a third of it before the pause.
  EXPECT_LT(std::chrono::steady_clock::now() - paused, milliseconds(3000));
  etcd_.Resume();
}

// Adversarial finding (two leaders): the leader key deleted by hand while
// the leader's lease lives. The standby campaigns and leads at once; the
// old leader must stop acting at once too, not at its lease's end.
TEST_F(EtcdTest, ALeaderWhoseKeyIsDeletedOrTakenIsToldAtOnce) {
  auto client = Client();
  for (const bool taken : {false, true}) {
    EtcdLeader a(client, "/gpuha/leader", "ctrl-a", milliseconds(10000));
    ASSERT_TRUE(a.Campaign(&stopping_).ok());
    std::promise<std::string> lost;
    a.KeepAlive([&](const std::string& why) { lost.set_value(why); });
    auto told = lost.get_future();
    EXPECT_EQ(told.wait_for(milliseconds(300)), std::future_status::timeout);
    ASSERT_TRUE(a.Holds());
    etcdserverpb::TxnRequest txn;
    if (taken) {
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key("/gpuha/leader");
      put->set_value("ctrl-x");
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key("/gpuha/leader");
    }
    const auto at = std::chrono::steady_clock::now();
    ASSERT_TRUE(client->Txn(txn).ok());
    ASSERT_EQ(told.wait_for(milliseconds(2000)), std::future_status::ready)
        << "not told within 2 s of a 10 s lease";
    EXPECT_THAT(told.get(), HasSubstr(taken ? "was written by another (ctrl-x)" : "was deleted"));
    EXPECT_FALSE(a.Holds());
    EXPECT_LT(std::chrono::steady_clock::now() - at, milliseconds(1000));
    a.Resign();
    etcdserverpb::TxnRequest clear;
    clear.add_success()->mutable_request_delete_range()->set_key("/gpuha/leader");
    ASSERT_TRUE(client->Txn(clear).ok());
  }
}

// Adversarial finding: a leader key written without a lease (by hand) held
// every controller in standby for ever. No controller writes it so: a
// campaign deletes it and leads.
TEST_F(EtcdTest, ALeaderKeyWithNoLeaseIsNobodysAndACampaignTakesIt) {
  auto client = Client();
  etcdserverpb::TxnRequest txn;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key("/gpuha/leader");
  put->set_value("someone by hand");
  ASSERT_TRUE(client->Txn(txn).ok());
  EtcdLeader a(client, "/gpuha/leader", "ctrl-a", milliseconds(2000));
  auto won = std::async(std::launch::async, [&] { return a.Campaign(&stopping_); });
  if (won.wait_for(milliseconds(5000)) != std::future_status::ready) {
    stopping_ = true;  // ends the campaign, so that the test ends
    FAIL() << "still standing by after 5 s";
  }
  ASSERT_TRUE(won.get().ok());
  EXPECT_EQ(*a.Holder(), "ctrl-a");
}

// etcd takes 128 operations per transaction unless told otherwise: a
// failover that moves 300 streams is written whole, in transactions of 128.
TEST_F(EtcdTest, ABatchPastEtcdsTransactionLimitIsWrittenWhole) {
  auto client = Client();
  EtcdLeader a(client, "/gpuha/leader", "ctrl-a", milliseconds(2000));
  auto token = a.Campaign(&stopping_);
  ASSERT_TRUE(token.ok());
  EtcdStore store(client, "/gpuha/");
  store.SetFence(a.key(), *token);
  std::vector<StoreWrite> batch;
  for (int i = 0; i < 300; ++i) batch.push_back({"stream", absl::StrCat("cam-", i), "{}"});
  ASSERT_TRUE(store.Apply(batch).ok());
  EXPECT_EQ(store.Load("stream")->size(), 300u);
  EtcdStore one_by_one(client, "/small/", 1);
  ASSERT_TRUE(one_by_one.Apply({{"t", "a", "1"}, {"t", "b", "2"}, {"t", "c", "3"}}).ok());
  EXPECT_EQ(one_by_one.Load("t")->size(), 3u);

  // Split, the meta rows (epoch, route version) go in the last transaction:
  // a route version never lands before the rows it names.
  ASSERT_TRUE(one_by_one
                  .Apply({{"meta", "route_version", "7"},
                          {"node", "n1", "x"},
                          {"stream", "s1", "y"},
                          {"meta", "epoch", "3"}})
                  .ok());
  etcdserverpb::RangeRequest rows;
  rows.set_key("/small/t/");
  rows.set_range_end(PrefixEnd("/small/t/"));
  auto r = client->Range(rows);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t first_meta = INT64_MAX, last_other = 0;
  for (const etcdserverpb::KeyValue& kv : r->kvs()) {
    if (kv.key().rfind("/small/t/meta/", 0) == 0) {
      first_meta = std::min(first_meta, kv.mod_revision());
    } else {
      last_other = std::max(last_other, kv.mod_revision());
    }
  }
  EXPECT_GT(first_meta, last_other);
  // A standby reads every table as of one revision.
  const int64_t then = r->header().revision();
  ASSERT_TRUE(one_by_one.Apply({{"node", "n1", "z"}}).ok());
  EtcdStore reader(client, "/small/");
  reader.ReadAt(then);
  EXPECT_EQ((*reader.Load("node"))["n1"], "x");
  reader.ReadAt(0);
  EXPECT_EQ((*reader.Load("node"))["n1"], "z");
}

TEST_F(EtcdTest, EndpointsAreCheckedAndAnUnreachableOneIsSkipped) {
  auto bad = EtcdClient::Connect({.endpoints = {"ftp://127.0.0.1:2379"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("store.etcd[0]: 'ftp://127.0.0.1:2379'"));
  auto mixed = EtcdClient::Connect({.endpoints = {etcd_.url(), "https://127.0.0.1:1"}});
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.status().message(), HasSubstr("store.etcd[0]"));
  EXPECT_FALSE(EtcdClient::Connect({}).ok());
  const std::string dead = "http://127.0.0.1:1";
  auto none = EtcdClient::Connect({.endpoints = {dead}, .timeout = milliseconds(300)});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr(dead));
  // A dead member first in the list: calls move on to the live one.
  auto client =
      EtcdClient::Connect({.endpoints = {dead, etcd_.url()}, .timeout = milliseconds(300)});
  ASSERT_TRUE(client.ok()) << client.status();
  EtcdStore store(*client, "/x/");
  ASSERT_TRUE(store.Apply({{"t", "k", "v"}}).ok());
  EXPECT_EQ((*store.Load("t"))["k"], "v");
}

// store.etcd over TLS, as etcd runs with --client-cert-auth: our client
// certificate and CA let the controller in, and lead and write; no client
// certificate, or a CA that did not sign etcd's, and Connect says so.
TEST(EtcdTlsTest, AControllerReachesEtcdOverMutualTlsAndNothingElseDoes) {
  const std::string dir = (gpuha::testing::TestTempDir() / "etcd-tls").string();
  const std::string other = (gpuha::testing::TestTempDir() / "etcd-tls-other").string();
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(other);
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(dir));
  ASSERT_TRUE(gpuha::testing::MakeTestCerts(other));
  gpuha::testing::EtcdServer etcd;
  ASSERT_TRUE(etcd.Start("", dir)) << etcd.log();
  ASSERT_EQ(etcd.url().rfind("https://", 0), 0u);

  absl::StatusOr<std::shared_ptr<EtcdClient>> client;
  for (int i = 0; i < 50; ++i) {  // a first leader election may still run
    client = EtcdClient::Connect({.endpoints = {etcd.url()},
                                  .tls_ca = dir + "/ca.pem",
                                  .tls_cert = dir + "/agent.pem",
                                  .tls_key = dir + "/agent.key",
                                  .timeout = milliseconds(1000)});
    if (client.ok()) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(client.ok()) << client.status() << "\n" << etcd.log();
  std::atomic<bool> stopping{false};
  EtcdLeader leader(*client, "/gpuha/leader", "ctrl-a", milliseconds(2000));
  auto token = leader.Campaign(&stopping);
  ASSERT_TRUE(token.ok()) << token.status();
  EtcdStore store(*client, "/gpuha/");
  store.SetFence(leader.key(), *token);
  ASSERT_TRUE(store.Apply({{"node", "gpu-1", "serving"}}).ok());
  EXPECT_EQ(store.Load("node")->at("gpu-1"), "serving");

  auto no_cert = EtcdClient::Connect(
      {.endpoints = {etcd.url()}, .tls_ca = dir + "/ca.pem", .timeout = milliseconds(1000)});
  EXPECT_FALSE(no_cert.ok()) << "etcd let in a client without a certificate";
  auto wrong_ca = EtcdClient::Connect({.endpoints = {etcd.url()},
                                       .tls_ca = other + "/ca.pem",
                                       .tls_cert = other + "/agent.pem",
                                       .tls_key = other + "/agent.key",
                                       .timeout = milliseconds(1000)});
  ASSERT_FALSE(wrong_ca.ok()) << "a CA that did not sign etcd's certificate was trusted";
  EXPECT_THAT(std::string(wrong_ca.status().message()), HasSubstr(etcd.url()));
  EXPECT_THAT(std::string(wrong_ca.status().message()), HasSubstr("certificate verify failed"));
  // The endpoint was never plain http: a client that thinks so is refused.
  auto plain = EtcdClient::Connect(
      {.endpoints = {etcd.url().replace(0, 5, "http")}, .timeout = milliseconds(1000)});
  EXPECT_FALSE(plain.ok());
}

}  // namespace
}  // namespace gpuha::controller
