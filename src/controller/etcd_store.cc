#include "controller/etcd_store.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_client.h"
#include "common/net_util.h"

namespace gpuha::controller {

namespace {

using etcd::PrefixEnd;
using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;

std::string EventKey(const std::string& prefix, int64_t id) {
  return absl::StrFormat("%se/%020d", prefix, id);
}

}  // namespace

EtcdStore::EtcdStore(std::shared_ptr<etcd::EtcdClient> client, std::string prefix,
                     size_t max_txn_ops)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      max_txn_ops_(std::max<size_t>(1, max_txn_ops)) {}

void EtcdStore::SetFence(const std::string& key, int64_t create_revision) {
  absl::MutexLock lock(&mu_);
  fence_key_ = key;
  fence_revision_ = create_revision;
}

void EtcdStore::AddFence(TxnRequest* txn) const {
  absl::MutexLock lock(&mu_);
  if (fence_key_.empty()) return;
  Compare* c = txn->add_compare();
  c->set_key(fence_key_);
  c->set_target(Compare::CREATE);
  c->set_result(Compare::EQUAL);
  c->set_create_revision(fence_revision_);
}

void EtcdStore::OnFenceLost(std::function<void()> f) {
  absl::MutexLock lock(&mu_);
  on_fence_lost_ = std::move(f);
}

absl::Status EtcdStore::FenceLost() const {
  std::function<void()> lost;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = absl::FailedPreconditionError(absl::StrCat(
        "store: this controller no longer leads (", fence_key_,
        " is not the one created at revision ", fence_revision_, "); its write was refused"));
    lost.swap(on_fence_lost_);
  }
  if (lost) lost();
  return s;
}

absl::Status EtcdStore::Apply(const std::vector<StoreWrite>& batch) {
  // etcd refuses a key twice in one transaction: the last write of a key wins,
  // as it would applied in order.
  std::map<std::string, std::optional<std::string>> last;
  for (const StoreWrite& w : batch) {
    last[absl::StrCat(prefix_, "t/", w.table, "/", w.key)] = w.value;
  }
  // etcd takes at most --max-txn-ops operations in each list of a
  // transaction (128 by default): a larger batch goes as several, in order,
  // each fenced. It is then not atomic; raise etcd's limit and
  // store.max_txn_ops together to keep it so.
  if (last.size() > max_txn_ops_) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn(
          "store: a batch of {} writes goes as {} etcd transactions and is not atomic; raise "
          "etcd's --max-txn-ops and store.max_txn_ops (now {}) to keep batches whole",
          last.size(), (last.size() + max_txn_ops_ - 1) / max_txn_ops_, max_txn_ops_);
    }
  }
  // The meta rows (epoch, route version) go last: split, each transaction
  // lands whole, and a version never names rows that are not there yet.
  std::vector<std::pair<std::string, std::optional<std::string>>> ops(last.begin(), last.end());
  const std::string meta = absl::StrCat(prefix_, "t/meta/");
  std::stable_partition(ops.begin(), ops.end(),
                        [&](const auto& op) { return op.first.rfind(meta, 0) != 0; });
  auto it = ops.begin();
  while (it != ops.end()) {
    TxnRequest txn;
    AddFence(&txn);
    for (size_t n = 0; n < max_txn_ops_ && it != ops.end(); ++n, ++it) {
      etcdserverpb::RequestOp* op = txn.add_success();
      if (it->second) {
        op->mutable_request_put()->set_key(it->first);
        op->mutable_request_put()->set_value(*it->second);
      } else {
        op->mutable_request_delete_range()->set_key(it->first);
      }
    }
    auto r = client_->Txn(txn);
    if (!r.ok()) return r.status();
    if (!r->succeeded()) return FenceLost();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> EtcdStore::Load(const std::string& table) {
  const std::string from = absl::StrCat(prefix_, "t/", table, "/");
  RangeRequest req;
  req.set_key(from);
  req.set_range_end(PrefixEnd(from));
  req.set_revision(read_revision_.load());
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  std::map<std::string, std::string> rows;
  for (const etcdserverpb::KeyValue& kv : r->kvs()) rows[kv.key().substr(from.size())] = kv.value();
  return rows;
}

absl::StatusOr<std::optional<etcdserverpb::KeyValue>> EtcdStore::Get(const std::string& key) {
  RangeRequest req;
  req.set_key(key);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  if (r->kvs().empty()) return std::optional<etcdserverpb::KeyValue>();
  return std::optional<etcdserverpb::KeyValue>(r->kvs(0));
}

absl::StatusOr<int64_t> EtcdStore::AppendEvent(const std::string& json) {
  absl::MutexLock lock(&append_mu_);
  const std::string next_key = prefix_ + "e-next";
  // Compare-and-swap on the counter; a retry after an answer that was lost
  // finds its own event in place and does not append it twice.
  bool ambiguous = false;  // the last attempt's answer was lost: it may have applied
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto next = Get(next_key);
    if (!next.ok()) return next.status();
    int64_t id = 1;
    if (*next && (!absl::SimpleAtoi((*next)->value(), &id) || id < 1)) {
      // The counter only says where the events end, which their keys say
      // too: a damaged one (written by hand, a bad restore) is rebuilt from
      // them rather than stopping every event from being stored.
      auto newest = NewestEventId();
      if (!newest.ok()) return newest.status();
      spdlog::warn("store: {} holds '{}', not an event id; counting on from the newest event ({})",
                   next_key, absl::CHexEscape((*next)->value().substr(0, 64)), *newest);
      id = *newest + 1;
    }
    if (attempt > 0 && id > 1) {  // a resent Txn may have applied: ours is there
      auto mine = Get(EventKey(prefix_, id - 1));
      if (mine.ok() && *mine && (*mine)->value() == json) return id - 1;
    }
    TxnRequest txn;
    AddFence(&txn);
    Compare* c = txn.add_compare();
    c->set_key(next_key);
    c->set_result(Compare::EQUAL);
    c->set_target(Compare::MOD);
    c->set_mod_revision(*next ? (*next)->mod_revision() : 0);
    etcdserverpb::PutRequest* event = txn.add_success()->mutable_request_put();
    event->set_key(EventKey(prefix_, id));
    event->set_value(json);
    etcdserverpb::PutRequest* counter = txn.add_success()->mutable_request_put();
    counter->set_key(next_key);
    counter->set_value(std::to_string(id + 1));
    auto r = client_->Txn(txn);
    ambiguous = !r.ok() && r.status().code() == absl::StatusCode::kUnavailable;
    if (ambiguous && attempt < 2) continue;  // etcd gone for longer: the caller hears it
    if (!r.ok()) return r.status();
    if (r->succeeded()) return id;
    // The counter moved (another writer, or our own lost answer), or the
    // fence failed: the fence is checked here, the counter next round.
    std::string fence_key;
    int64_t fence_revision = 0;
    {
      absl::MutexLock fence_lock(&mu_);
      fence_key = fence_key_;
      fence_revision = fence_revision_;
    }
    if (!fence_key.empty()) {
      auto holder = Get(fence_key);
      if (holder.ok() && (!*holder || (*holder)->create_revision() != fence_revision)) {
        return FenceLost();
      }
    }
  }
  return absl::UnavailableError("store: appending an event kept racing another writer");
}

absl::StatusOr<int64_t> EtcdStore::NewestEventId() {
  RangeRequest req;
  req.set_key(prefix_ + "e/");
  req.set_range_end(PrefixEnd(prefix_ + "e/"));
  req.set_sort_order(RangeRequest::DESCEND);
  req.set_sort_target(RangeRequest::KEY);
  req.set_limit(1);
  req.set_keys_only(true);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  if (r->kvs().empty()) return 0;
  int64_t id = 0;
  if (!absl::SimpleAtoi(r->kvs(0).key().substr(prefix_.size() + 2), &id)) {
    return absl::DataLossError(absl::StrCat("store: '", r->kvs(0).key(), "' is not an event key"));
  }
  return id;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> EtcdStore::LoadEvents(int64_t after_id,
                                                                                   size_t limit) {
  RangeRequest req;
  req.set_key(EventKey(prefix_, after_id + 1));
  req.set_range_end(PrefixEnd(prefix_ + "e/"));
  req.set_limit(static_cast<int64_t>(limit));
  req.set_revision(read_revision_.load());
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  std::vector<std::pair<int64_t, std::string>> out;
  const size_t skip = prefix_.size() + 2;
  for (const etcdserverpb::KeyValue& kv : r->kvs()) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(kv.key().substr(skip), &id)) {
      return absl::DataLossError(absl::StrCat("store: '", kv.key(), "' is not an event key"));
    }
    out.emplace_back(id, kv.value());
  }
  return out;
}

}  // namespace gpuha::controller
