// The controller's Store on etcd v3 (over etcd/client.h): rows and events
// under a prefix, so that several controllers share one state, fenced by
// the leader's key (controller/etcd_leader.h) so that a controller that no
// longer leads commits nothing.
//
//   auto store = std::make_unique<EtcdStore>(client, "/gpuha/");
//   store->SetFence(leader.key(), *token);            // a deposed leader commits nothing
//
// Layout under the prefix: "t/TABLE/KEY" a row, "e/%020d" event N, "e-next"
// the next event id. A batch is one etcd transaction, so it is atomic; with a
// fence set, the transaction first compares the leader key's create revision.
//
// Thread-safety: any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/store.h"
#include "etcd/client.h"

namespace gpuha::controller {

// The key the leader holds with its lease; its value is the leader's address.
inline std::string LeaderKey(const std::string& prefix) { return prefix + "leader"; }

class EtcdStore : public Store {
 public:
  // `max_txn_ops`: etcd's --max-txn-ops (128 unless the cluster raised it);
  // a batch with more writes is split into transactions of that many.
  EtcdStore(std::shared_ptr<etcd::EtcdClient> client, std::string prefix, size_t max_txn_ops = 128);
  const char* Kind() const override { return "etcd"; }
  // Every later write also requires that `key` was created at `create_revision`:
  // the leader's key, so that a controller that no longer leads commits nothing.
  void SetFence(const std::string& key, int64_t create_revision);
  // Runs once, on the writing thread, when a write finds the fence gone:
  // another controller leads, and this one must stop acting at once.
  void OnFenceLost(std::function<void()> f);
  // Load and LoadEvents read the store as it was at `revision` (0: as it is
  // now). A standby reads all its state at one revision, so that no commit
  // lands between its tables.
  void ReadAt(int64_t revision) { read_revision_ = revision; }
  [[nodiscard]] absl::Status Apply(const std::vector<StoreWrite>& batch) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& table) override;
  [[nodiscard]] absl::StatusOr<int64_t> AppendEvent(const std::string& json) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(
      int64_t after_id, size_t limit) override;

 private:
  // The fence's compare (none when unset) and the error when it fails.
  void AddFence(etcdserverpb::TxnRequest* txn) const;
  [[nodiscard]] absl::Status FenceLost() const;
  [[nodiscard]] absl::StatusOr<std::optional<etcdserverpb::KeyValue>> Get(const std::string& key);
  // The id of the newest event stored; 0 when there is none.
  [[nodiscard]] absl::StatusOr<int64_t> NewestEventId();

  std::shared_ptr<etcd::EtcdClient> client_;
  const std::string prefix_;
  const size_t max_txn_ops_;  // writes per transaction
  mutable absl::Mutex mu_;
  std::string fence_key_ ABSL_GUARDED_BY(mu_);
  int64_t fence_revision_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::function<void()> on_fence_lost_ ABSL_GUARDED_BY(mu_);  // cleared once run
  absl::Mutex append_mu_;  // one AppendEvent at a time from this process
  std::atomic<int64_t> read_revision_{0};
};

}  // namespace gpuha::controller
