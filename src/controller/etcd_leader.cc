#include "controller/etcd_leader.h"

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

using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;

// The longest a standby waits on the leader key before it renews its own
// lease and checks for a stop.
constexpr common::Duration kStandbyWait = std::chrono::milliseconds(500);
}  // namespace

EtcdLeader::EtcdLeader(std::shared_ptr<etcd::EtcdClient> client, std::string key,
                       std::string identity, common::Duration ttl, common::Clock* clock)
    : client_(std::move(client)),
      key_(std::move(key)),
      identity_(std::move(identity)),
      ttl_(ttl),
      clock_(clock),
      hold_(ttl) {}

EtcdLeader::~EtcdLeader() { StopThreads(); }

void EtcdLeader::StopThreads() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;  // the waits on it end as the lock is released
  }
  watch_cancel_.Cancel();
  if (keepalive_.joinable()) keepalive_.join();
  if (watch_key_.joinable()) watch_key_.join();
}

void EtcdLeader::Lose(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (!hold_.Lose()) return;
  }
  on_lost_(why);
}

namespace {

// Creates `key` with `lease` holding `identity` unless someone holds it; the
// holder's row when someone does.
TxnRequest TakeKeyTxn(const std::string& key, const std::string& identity, int64_t lease) {
  TxnRequest txn;
  Compare* c = txn.add_compare();
  c->set_key(key);
  c->set_target(Compare::CREATE);
  c->set_result(Compare::EQUAL);
  c->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(identity);
  put->set_lease(lease);
  txn.add_failure()->mutable_request_range()->set_key(key);
  return txn;
}

// Deletes `key` if it is still the write at `mod_revision`.
TxnRequest DeleteUnchangedTxn(const std::string& key, int64_t mod_revision) {
  TxnRequest del;
  Compare* same = del.add_compare();
  same->set_key(key);
  same->set_target(Compare::MOD);
  same->set_result(Compare::EQUAL);
  same->set_mod_revision(mod_revision);
  del.add_success()->mutable_request_delete_range()->set_key(key);
  return del;
}

}  // namespace

absl::StatusOr<int64_t> EtcdLeader::Campaign(const std::atomic<bool>* stopping) {
  const int64_t ttl_s = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(ttl_ + std::chrono::milliseconds(999))
             .count());
  std::string last_holder, last_error;
  auto warn = [&](const absl::Status& s) {  // once per distinct error, not every round
    if (s.message() == last_error) return;
    last_error = std::string(s.message());
    spdlog::warn("controller: campaign: {}", last_error);
  };
  while (!stopping->load()) {
    const common::TimePoint sent = clock_->Now();
    if (lease_ == 0) {
      auto grant = client_->LeaseGrant(ttl_s);
      if (grant.ok()) {
        lease_ = grant->id();
        renewed_ = sent;
      } else {
        warn(grant.status());
      }
    } else if (auto left = client_->LeaseKeepAliveOnce(lease_, ttl_); left.ok()) {
      if (*left <= 0) {
        lease_ = 0;  // expired while we waited: grant another
        continue;
      }
      renewed_ = sent;
    }
    if (lease_ != 0) {
      auto r = client_->Txn(TakeKeyTxn(key_, identity_, lease_));
      if (r.ok() && r->succeeded()) return create_revision_ = r->header().revision();
      if (r.ok() && r->responses_size() > 0 && r->responses(0).response_range().kvs_size() > 0) {
        const etcdserverpb::KeyValue& held = r->responses(0).response_range().kvs(0);
        if (held.value() == identity_ && held.lease() == lease_) {
          return create_revision_ = held.create_revision();
        }
        // A leader always holds the key with a lease; one written without
        // (by hand, `etcdctl put`) would never expire and would hold every
        // controller in standby for ever. It is nobody's: deleted, if it is
        // still that same write.
        if (held.lease() == 0) {
          spdlog::warn(
              "controller: the leader key {} holds '{}' with no lease (no controller "
              "writes it so); deleting it and campaigning",
              key_, absl::CHexEscape(held.value()));
          if (auto d = client_->Txn(DeleteUnchangedTxn(key_, held.mod_revision())); !d.ok()) {
            warn(d.status());
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          continue;
        }
        if (held.value() != last_holder) {
          last_holder = held.value();
          if (held.value() == identity_) {  // this process led a moment ago
            spdlog::info(
                "controller: the leader key still holds this controller's previous "
                "lease; waiting for it to go");
          } else {
            spdlog::info("controller: {} leads; standing by to take over", last_holder);
          }
        }
        // Wait for the key's delete (a resign, or the holder's lease ending)
        // rather than polling: the standby campaigns again the moment it
        // goes. Bounded, to renew our own lease and see `stopping`.
        auto gone = client_->WatchOnce(key_, "", r->header().revision() + 1,
                                       std::min<common::Duration>(ttl_ / 4, kStandbyWait),
                                       /*no_puts=*/true);
        if (gone.ok()) continue;
        warn(gone.status());
      } else if (!r.ok()) {
        warn(r.status());
      }
    }
    std::this_thread::sleep_for(
        std::min<common::Duration>(ttl_ / 8, std::chrono::milliseconds(250)));
  }
  return absl::CancelledError("stopped before leading");
}

void EtcdLeader::KeepAlive(std::function<void(const std::string& why)> on_lost) {
  {
    absl::MutexLock lock(&mu_);
    hold_.Won(renewed_);  // before the threads run: the leader acts from here
  }
  on_lost_ = std::move(on_lost);
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  watch_key_ = std::thread([this] { WatchKeyLoop(); });
}

void EtcdLeader::WatchKeyLoop() {
  // From the revision that created the key: any later change to it is a
  // delete or another's write (this leader never writes it again).
  int64_t from = create_revision_ + 1;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || hold_.state() == LeaderLease::State::kLost) return;
    }
    auto events = client_->WatchOnce(key_, "", from, std::chrono::seconds(5), /*no_puts=*/false,
                                     &watch_cancel_);
    if (!events.ok()) {
      // etcd unreachable (the keep-alive judges that) or the revision
      // compacted: the key is read as it is now, and watched from there.
      etcdserverpb::RangeRequest req;
      req.set_key(key_);
      auto now = client_->Range(req);
      if (now.ok()) {
        if (now->kvs().empty() || now->kvs(0).create_revision() != create_revision_) {
          Lose(absl::StrCat("the leader key ", key_, " is gone or another's"));
          return;
        }
        from = now->header().revision() + 1;
      } else {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100))) return;
      }
      continue;
    }
    for (const etcdserverpb::Event& e : *events) {
      const bool mine = e.type() == etcdserverpb::Event::PUT && e.kv().lease() == lease_ &&
                        e.kv().value() == identity_;
      if (!mine) {
        Lose(absl::StrCat("the leader key ", key_,
                          e.type() == etcdserverpb::Event::DELETE
                              ? " was deleted"
                              : absl::StrCat(" was written by another (", e.kv().value(), ")")));
        return;
      }
      from = e.kv().mod_revision() + 1;
    }
  }
}

void EtcdLeader::KeepAliveLoop() {
  // When to renew and when the lease counts as lost: LeaderLease.
  for (;;) {
    common::TimePoint sent;
    common::Duration left;
    {
      absl::ReleasableMutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               absl::FromChrono(hold_.UntilRenewal(clock_->Now())))) {
        return;
      }
      if (hold_.state() == LeaderLease::State::kLost) return;  // the key watch found it another's
      sent = clock_->Now();
      if (std::optional<std::string> why = hold_.Expire(sent)) {
        lock.Release();
        on_lost_(*why);
        return;
      }
      left = hold_.LeftAt(sent);
    }
    absl::StatusOr<int64_t> ttl = client_->LeaseKeepAliveOnce(lease_, left);
    if (ttl.ok() && *ttl <= 0) {
      Lose("the leader lease expired or was revoked");
      return;
    }
    absl::MutexLock lock(&mu_);
    if (ttl.ok()) {
      hold_.Renewed(sent);
    } else {
      hold_.RenewalFailed(std::string(ttl.status().message()));
    }
  }
}

bool EtcdLeader::Holds() const {
  // A reader's lock: the controller asks on every action, often at once
  // from several threads; only the keep-alive and the key watch write.
  absl::ReaderMutexLock lock(&mu_);
  return hold_.Holds(clock_->Now());
}

void EtcdLeader::Resign() {
  StopThreads();
  {
    absl::MutexLock lock(&mu_);
    hold_.Lose();
  }
  if (lease_ != 0) {
    if (absl::Status s = client_->LeaseRevoke(lease_); !s.ok()) {
      spdlog::warn("controller: resigning: {}", std::string(s.message()));
    }
    lease_ = 0;
  }
}

absl::StatusOr<std::string> EtcdLeader::Holder() {
  RangeRequest req;
  req.set_key(key_);
  auto r = client_->Range(req);
  if (!r.ok()) return r.status();
  return r->kvs().empty() ? std::string() : r->kvs(0).value();
}

}  // namespace gpuha::controller
