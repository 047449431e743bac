// The etcd v3 client on a real etcd (Debian's etcd-server): the calls the
// controller's store and leader election are built on. The store and the
// election have their own tests (controller/etcd_test.cc).
#include "etcd/client.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "common/testing/etcd_server.h"

namespace gpuha::etcd {
namespace {

using std::chrono::milliseconds;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd_.Start()) << etcd_.log(); }
  std::shared_ptr<EtcdClient> Client() {
    auto c = EtcdClient::Connect({.endpoints = {etcd_.url()}, .timeout = milliseconds(500)});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  gpuha::testing::EtcdServer etcd_;
};

TEST_F(EtcdClientTest, AWatchReturnsTheFirstChangeOrNothingWhenItsWaitEnds) {
  auto client = Client();
  ASSERT_NE(client, nullptr);
  auto put = [&](const std::string& key, const std::string& value) {
    etcdserverpb::TxnRequest txn;
    etcdserverpb::PutRequest* p = txn.add_success()->mutable_request_put();
    p->set_key(key);
    p->set_value(value);
    auto r = client->Txn(txn);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->header().revision() : 0;
  };
  const int64_t rev = put("/w/a", "1");
  // Nothing changes: the wait ends with no events and no error.
  auto none = client->WatchOnce("/w/a", "", rev + 1, milliseconds(200));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  // From a past revision: the change already made is returned at once.
  auto past = client->WatchOnce("/w/a", "", rev, milliseconds(2000));
  ASSERT_TRUE(past.ok()) << past.status();
  ASSERT_EQ(past->size(), 1u);
  EXPECT_EQ((*past)[0].kv().value(), "1");
  // A deletes-only watch skips a put and wakes on the delete.
  auto deleted = std::async(std::launch::async, [&] {
    return client->WatchOnce("/w/a", "", rev + 1, milliseconds(3000), /*no_puts=*/true);
  });
  std::this_thread::sleep_for(milliseconds(200));
  put("/w/a", "2");
  EXPECT_EQ(deleted.wait_for(milliseconds(300)), std::future_status::timeout)
      << "a deletes-only watch woke on a put";
  etcdserverpb::TxnRequest del;
  del.add_success()->mutable_request_delete_range()->set_key("/w/a");
  ASSERT_TRUE(client->Txn(del).ok());
  ASSERT_EQ(deleted.wait_for(milliseconds(2000)), std::future_status::ready);
  auto events = deleted.get();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].type(), etcdserverpb::Event::DELETE);

  // Another thread ends a long wait at once, and every later one.
  WatchCancel cancel;
  auto waiting = std::async(std::launch::async, [&] {
    return client->WatchOnce("/w/b", "", 0, milliseconds(10000), false, &cancel);
  });
  std::this_thread::sleep_for(milliseconds(200));
  cancel.Cancel();
  ASSERT_EQ(waiting.wait_for(milliseconds(2000)), std::future_status::ready);
  auto ended = waiting.get();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->empty());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(client->WatchOnce("/w/b", "", 0, milliseconds(10000), false, &cancel).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
}

}  // namespace
}  // namespace gpuha::etcd
