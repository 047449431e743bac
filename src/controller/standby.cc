#include "controller/standby.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"

namespace gpuha::controller {

using std::chrono::milliseconds;

Standby::Standby(const ControllerConfig& config, std::shared_ptr<etcd::EtcdClient> client,
                 FenceRunner* fencer)
    : config_(config), client_(std::move(client)), fencer_(fencer), server_(config) {}

Standby::~Standby() { Stop(); }

absl::Status Standby::Start() {
  if (absl::Status s = server_.Start(); !s.ok()) return s;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Standby::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cancel_.Cancel();
  if (thread_.joinable()) thread_.join();
  server_.Stop();
}

bool Standby::Pause(common::Duration d) {
  absl::MutexLock lock(&mu_);
  return !mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(d));
}

void Standby::Loop() {
  const std::string& prefix = config_.etcd.prefix;
  const std::string end = etcd::PrefixEnd(prefix);
  int64_t from = 0;  // the first revision not yet loaded
  bool load = true;
  std::string last_error;
  while (Pause(milliseconds(0))) {
    if (load) {
      etcdserverpb::RangeRequest who;
      who.set_key(LeaderKey(prefix));
      auto held = client_->Range(who);
      std::string leader = held.ok() && !held->kvs().empty() ? held->kvs(0).value() : "";
      absl::Status s = held.status();
      std::shared_ptr<Controller> state;
      if (s.ok()) {
        auto store = std::make_unique<EtcdStore>(client_, prefix,
                                                 static_cast<size_t>(config_.etcd.max_txn_ops));
        // Every table as of the leader key's read: no commit in between.
        store->ReadAt(held->header().revision());
        state = std::make_shared<Controller>(config_, std::move(store), common::RealClock::Get(),
                                             fencer_);
        s = state->LoadAsStandby();
      }
      if (!s.ok()) {
        const std::string error = absl::StrCat("cannot read etcd: ", s.message());
        if (error != last_error) spdlog::warn("controller: standby: {}", error);
        last_error = error;
        server_.Set(nullptr, leader, error);
        Pause(milliseconds(500));
        continue;
      }
      last_error.clear();
      server_.Set(std::move(state), leader, "");
      from = held->header().revision() + 1;
    }
    auto changed = client_->WatchOnce(prefix, end, from, milliseconds(2000),
                                      /*no_puts=*/false, &cancel_);
    load = !changed.ok() || !changed->empty();
    // Let the rest of a burst land; after an error, do not spin.
    if (load) Pause(milliseconds(changed.ok() ? 100 : 500));
  }
}

}  // namespace gpuha::controller
