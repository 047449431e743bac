// A client of etcd v3 over its gRPC API (proto/etcd/v3, our own declarations
// of etcd's published wire format), never the JSON gateway: the unary calls
// the controller's store and leader election make, each moving to the next
// endpoint when its own is unreachable, and a one-shot watch. Its own module:
// the controller runs on it, and the local cluster (`gpuha demo`, the chaos
// tests) asks it which member leads without linking the controller.
//
//   auto client = EtcdClient::Connect({.endpoints = {"http://127.0.0.1:2379"}});
//   auto got = (*client)->Range(request);
//
// Thread-safety: any thread.
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
#include "etcd/v3/rpc.grpc.pb.h"

namespace gpuha::etcd {

// The first key after every key that starts with `prefix`: a range's end.
std::string PrefixEnd(std::string prefix);
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
  [[nodiscard]] absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& r);
  [[nodiscard]] absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& r);
  [[nodiscard]] absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(int64_t ttl_seconds);
  [[nodiscard]] absl::Status LeaseRevoke(int64_t id);
  // One keep-alive of lease `id`, over all endpoints within `deadline` in
  // all; the lease's remaining TTL in seconds (0: gone).
  [[nodiscard]] absl::StatusOr<int64_t> LeaseKeepAliveOnce(int64_t id, common::Duration deadline);
  [[nodiscard]] absl::StatusOr<etcdserverpb::StatusResponse> Status();
  // Watches [key, range_end) (range_end empty: `key` alone) from
  // `start_revision` on, and returns the first events that come, or none
  // when `wait` passes first. `no_puts` leaves out puts (deletes only). One
  // endpoint, the current one; a compacted start revision is an error.
  // `cancel`, when given, ends it early from another thread.
  [[nodiscard]] absl::StatusOr<std::vector<etcdserverpb::Event>> WatchOnce(
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
  [[nodiscard]] absl::StatusOr<Response> Unary(const char* what, Call call,
                                               common::Duration deadline,
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

}  // namespace gpuha::etcd
