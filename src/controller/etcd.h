// The controller on etcd v3: a Store whose rows live in etcd, and leadership
// on an etcd lease, so that several controllers share one state and one of
// them acts. etcd is reached over its gRPC API (proto/etcd/v3, our own
// declarations of etcd's published wire format), never the JSON gateway.
//
//   auto client = EtcdClient::Connect({.endpoints = {"http://127.0.0.1:2379"}});
//   EtcdLeader leader(*client, "/gpuha/leader", "ctrl-a", std::chrono::seconds(2));
//   auto token = leader.Campaign(&stopping);          // blocks until this one leads
//   auto store = std::make_unique<EtcdStore>(*client, "/gpuha/");
//   store->SetFence(leader.key(), *token);            // a deposed leader commits nothing
//   leader.KeepAlive([](const std::string& why) { ... leadership lost ... });
//
// Layout under the prefix: "t/TABLE/KEY" a row, "e/%020d" event N, "e-next"
// the next event id. A batch is one etcd transaction, so it is atomic; with a
// fence set, the transaction first compares the leader key's create revision.
//
// Thread-safety: EtcdClient and EtcdStore may be used from any thread;
// EtcdLeader's calls come from one thread (KeepAlive runs its own).
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/store.h"
#include "etcd/v3/rpc.grpc.pb.h"

namespace gpuha::controller {

// The first key after every key that starts with `prefix`: a range's end.
std::string PrefixEnd(std::string prefix);
// The key the leader holds with its lease; its value is the leader's address.
inline std::string LeaderKey(const std::string& prefix) { return prefix + "leader"; }

struct EtcdOptions {
  std::vector<std::string> endpoints{};  // http://HOST:PORT or https://HOST:PORT
  // For https endpoints: the CA (empty: the system's roots) and, for etcd's
  // --client-cert-auth, our certificate and key.
  std::string tls_ca{}, tls_cert{}, tls_key{};
  common::Duration timeout = std::chrono::seconds(2);  // per call
  // Connect fails unless an endpoint answers. Off: it checks the URLs and
  // TLS files only, and the first calls say whether etcd answers.
  bool require_answer = true;
};

// Lets another thread end a WatchOnce early: it returns no events.
class WatchCancel {
 public:
  void Cancel();  // ends the watch under way, and every later one given this

 private:
  friend class EtcdClient;
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
  bool cancelled_ = false;              // guarded by mu_
};

class EtcdClient {
 public:
  // Checks every endpoint's URL and, unless told not to, that one of them
  // answers (Maintenance.Status).
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<EtcdClient>> Connect(EtcdOptions options);

  // Unary calls. One that finds its endpoint unreachable moves to the next;
  // errors name etcd's message and the endpoints tried.
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& r);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& r);
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds);
  absl::Status LeaseRevoke(int64_t id);
  // One keep-alive of lease `id`, over all endpoints within `deadline` in
  // all; the lease's remaining TTL in seconds (0: gone).
  absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t id, common::Duration deadline);
  absl::StatusOr<etcdserverpb::StatusResponse> Status();
  // Watches [key, range_end) (range_end empty: `key` alone) from
  // `start_revision` on, and returns the first events that come, or none
  // when `wait` passes first. `no_puts` leaves out puts (deletes only). One
  // endpoint, the current one; a compacted start revision is an error.
  // `cancel`, when given, ends it early from another thread.
  absl::StatusOr<std::vector<etcdserverpb::Event>> WatchOnce(
      const std::string& key, const std::string& range_end, int64_t start_revision,
      common::Duration wait, bool no_puts = false, WatchCancel* cancel = nullptr);

  const std::vector<std::string>& endpoints() const { return urls_; }

 private:
  struct Endpoint {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  };
  EtcdClient() = default;
  std::shared_ptr<Endpoint> Dial(const std::string& target) const;
  std::shared_ptr<Endpoint> At(size_t i) const;
  // A fresh channel for endpoint `i`, at most once a second.
  void Redial(size_t i);
  // Runs `call(endpoint, context)` on the current endpoint, then on the others
  // while they are unreachable: `deadline` for each, or for all of them
  // together when `shared_deadline`.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(const char* what, Call call, common::Duration deadline,
                                 bool shared_deadline = false);

  std::vector<std::string> urls_;
  std::vector<std::string> targets_;  // HOST:PORT of each URL
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  mutable std::mutex endpoints_mu_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;             // guarded by endpoints_mu_
  std::vector<std::chrono::steady_clock::time_point> redialed_;  // guarded by endpoints_mu_
  common::Duration timeout_{};
  std::atomic<size_t> current_{0};
};

class EtcdStore : public Store {
 public:
  // `max_txn_ops`: etcd's --max-txn-ops (128 unless the cluster raised it);
  // a batch with more writes is split into transactions of that many.
  EtcdStore(std::shared_ptr<EtcdClient> client, std::string prefix, size_t max_txn_ops = 128);
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
  absl::Status Apply(const std::vector<StoreWrite>& batch) override;
  absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& table) override;
  absl::StatusOr<int64_t> AppendEvent(const std::string& json) override;
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> LoadEvents(int64_t after_id,
                                                                          size_t limit) override;

 private:
  // The fence's compare (none when unset) and the error when it fails.
  void AddFence(etcdserverpb::TxnRequest* txn) const;
  absl::Status FenceLost() const;
  absl::StatusOr<std::optional<etcdserverpb::KeyValue>> Get(const std::string& key);
  // The id of the newest event stored; 0 when there is none.
  absl::StatusOr<int64_t> NewestEventId();

  std::shared_ptr<EtcdClient> client_;
  const std::string prefix_;
  const size_t max_txn_ops_;  // writes per transaction
  mutable std::mutex mu_;
  std::string fence_key_;                        // guarded by mu_
  int64_t fence_revision_ = 0;                   // guarded by mu_
  mutable std::function<void()> on_fence_lost_;  // guarded by mu_; cleared once run
  std::mutex append_mu_;                         // one AppendEvent at a time from this process
  std::atomic<int64_t> read_revision_{0};
};

class EtcdLeader {
 public:
  EtcdLeader(std::shared_ptr<EtcdClient> client, std::string key, std::string identity,
             common::Duration ttl);
  ~EtcdLeader();  // stops the keep-alive thread; does not resign
  // Blocks until this process holds the key (written with its own lease), or
  // `*stopping` turns true (Cancelled). Returns the key's create revision:
  // the fencing token, which only grows from one leader to the next.
  absl::StatusOr<int64_t> Campaign(const std::atomic<bool>* stopping);
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
  absl::StatusOr<std::string> Holder();
  const std::string& key() const { return key_; }

 private:
  void KeepAliveLoop();
  void WatchKeyLoop();
  // Counts the leadership lost and runs on_lost_, once (either thread).
  void Lose(const std::string& why);
  void StopThreads();
  // How long before its TTL the lease counts as lost: a tenth, at most 200 ms.
  common::Duration Margin() const;
  void HoldUntil(std::chrono::steady_clock::time_point renewed);

  std::shared_ptr<EtcdClient> client_;
  const std::string key_, identity_;
  const common::Duration ttl_;
  int64_t lease_ = 0;
  // When the last renewal that etcd confirmed was sent (a grant counts).
  std::chrono::steady_clock::time_point renewed_;
  // When the lease counts as lost, as steady_clock nanoseconds (0: not held).
  std::atomic<int64_t> holds_until_ns_{0};
  int64_t create_revision_ = 0;  // the key's, when Campaign won it
  std::function<void(const std::string& why)> on_lost_;
  std::atomic<bool> lost_{false};
  std::thread keepalive_;
  std::thread watch_key_;
  WatchCancel watch_cancel_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
};

}  // namespace gpuha::controller
