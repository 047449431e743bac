// The controller's leadership on an etcd lease (over etcd/client.h), so that
// of several controllers sharing one state one acts.
//
//   EtcdLeader leader(client, "/gpuha/leader", "ctrl-a", std::chrono::seconds(2));
//   auto token = leader.Campaign(&stopping);          // blocks until this one leads
//   store->SetFence(leader.key(), *token);            // (controller/etcd_store.h)
//   leader.KeepAlive([](const std::string& why) { ... leadership lost ... });
//
// Thread-safety: Campaign, KeepAlive and Resign from one thread (KeepAlive
// runs two of its own); Holds from any thread, under the controller's lock
// too (the order is the controller's lock, then this one's: this one never
// waits on the controller's, and on_lost runs with neither held).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "controller/leader_lease.h"
#include "etcd/client.h"

namespace gpuha::controller {

class EtcdLeader {
 public:
  // `clock` times the lease (LeaderLease); the waits between calls to etcd
  // are real time.
  EtcdLeader(std::shared_ptr<etcd::EtcdClient> client, std::string key, std::string identity,
             common::Duration ttl, common::Clock* clock = common::RealClock::Get());
  ~EtcdLeader();  // stops the keep-alive thread; does not resign
  // Blocks until this process holds the key (written with its own lease), or
  // `*stopping` turns true (Cancelled). Returns the key's create revision:
  // the fencing token, which only grows from one leader to the next.
  [[nodiscard]] absl::StatusOr<int64_t> Campaign(const std::atomic<bool>* stopping);
  // Keeps the lease alive from a thread. `on_lost` runs once, on that thread,
  // when the lease is gone: expired, revoked, or etcd unreachable (or without
  // quorum) for a TTL less a margin (a tenth, at most 200 ms), so that this
  // process stops before etcd can expire the lease and another leads.
  // A second thread watches the key itself: deleted (by hand, `etcdctl del`)
  // or written by another, it is another's to take at once, and `on_lost`
  // runs then, from that thread, while the lease still lives.
  void KeepAlive(std::function<void(const std::string& why)> on_lost);
  // Revokes the lease: the key goes at once and the next controller takes over.
  void Resign();
  // True until the moment the keep-alive counts the lease lost (a margin
  // before etcd could expire it), renewal by renewal; any thread.
  bool Holds() const;
  // Who holds the key now ("" when nobody).
  [[nodiscard]] absl::StatusOr<std::string> Holder();
  const std::string& key() const { return key_; }

 private:
  void KeepAliveLoop();
  void WatchKeyLoop();
  // Counts the leadership lost and runs on_lost_, once (either thread).
  void Lose(const std::string& why);
  void StopThreads();

  std::shared_ptr<etcd::EtcdClient> client_;
  const std::string key_, identity_;
  const common::Duration ttl_;
  common::Clock* const clock_;
  int64_t lease_ = 0;
  // When the last renewal that etcd confirmed was sent while campaigning
  // (a grant counts): the lease's start once KeepAlive takes over.
  common::TimePoint renewed_{};
  int64_t create_revision_ = 0;  // the key's, when Campaign won it
  std::function<void(const std::string& why)> on_lost_;
  std::thread keepalive_;
  std::thread watch_key_;
  etcd::WatchCancel watch_cancel_;
  mutable absl::Mutex mu_;
  LeaderLease hold_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gpuha::controller
