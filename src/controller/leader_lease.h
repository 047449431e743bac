// LeaderLease: a leader's hold on its etcd lease as a state machine on time
// passed in (as FailureDetector is), the I/O left to EtcdLeader.
//
//   standby --Won(sent)--> leading --Expire(now) past the deadline--> lost
//                             |  \--Lose(why): expired, revoked, key gone--> lost
//                             '--Renewed(sent): the deadline moves on
//
// The lease counts as lost `margin()` (a tenth of the TTL, at most 200 ms)
// before a TTL has passed since the last confirmed renewal was sent: etcd
// counts its TTL from when it received that renewal, later still, so the
// leader always stops acting before etcd can expire the lease and let
// another lead (as Kubernetes' renewDeadline comes before its
// leaseDuration). Renewals go every third of the TTL, and every tenth (at
// most 100 ms) while they fail, never later than the deadline.
//
//   LeaderLease lease(std::chrono::seconds(2));
//   lease.Won(sent);
//   clock.Advance(...);  if (auto why = lease.Expire(clock.Now())) ... lost ...
//
// Thread-safety: none; EtcdLeader holds its lock around it.
#pragma once

#include <optional>
#include <string>

#include "common/clock.h"

namespace gpuha::controller {

class LeaderLease {
 public:
  enum class State { kStandby, kLeading, kLost };

  explicit LeaderLease(common::Duration ttl) : ttl_(ttl) {}

  // The campaign won, with a grant or renewal confirmed that was sent at `sent`.
  void Won(common::TimePoint sent);
  // A renewal sent at `sent` was confirmed: the deadline moves on.
  void Renewed(common::TimePoint sent);
  // A renewal failed (`why`): the next goes sooner; the deadline stays.
  void RenewalFailed(std::string why);
  // Lost for a reason seen elsewhere (the lease expired or was revoked, the
  // key deleted or another's; a resignation). True the first time only.
  bool Lose();
  // Lost when `now` is past the deadline with no renewal confirmed: the
  // reason, the first time only.
  std::optional<std::string> Expire(common::TimePoint now);

  // How long to wait at `now` before the next renewal.
  common::Duration UntilRenewal(common::TimePoint now) const;
  // How long is left at `now` before the lease counts as lost (what a
  // renewal may take at most).
  common::Duration LeftAt(common::TimePoint now) const { return deadline() - now; }
  // Leading and not past the deadline at `now`.
  bool Holds(common::TimePoint now) const { return state_ == State::kLeading && now < deadline(); }
  State state() const { return state_; }
  common::Duration margin() const;

 private:
  common::TimePoint deadline() const { return renewed_ + ttl_ - margin(); }

  const common::Duration ttl_;
  State state_ = State::kStandby;
  common::TimePoint renewed_{};  // when the last confirmed renewal was sent
  bool failing_ = false;         // the last renewal failed
  std::string last_error_ = "no answer";
};

}  // namespace gpuha::controller
