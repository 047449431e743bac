#include "controller/leader_lease.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpuha::controller {

using std::chrono::milliseconds;

common::Duration LeaderLease::margin() const {
  return std::min<common::Duration>(ttl_ / 10, milliseconds(200));
}

void LeaderLease::Won(common::TimePoint sent) {
  state_ = State::kLeading;
  renewed_ = sent;
  failing_ = false;
}

void LeaderLease::Renewed(common::TimePoint sent) {
  failing_ = false;
  if (state_ == State::kLeading) renewed_ = std::max(renewed_, sent);
}

void LeaderLease::RenewalFailed(std::string why) {
  failing_ = true;
  last_error_ = std::move(why);
}

bool LeaderLease::Lose() {
  if (state_ == State::kLost) return false;
  state_ = State::kLost;
  return true;
}

std::optional<std::string> LeaderLease::Expire(common::TimePoint now) {
  if (state_ != State::kLeading || now < deadline()) return std::nullopt;
  state_ = State::kLost;
  return absl::StrCat("no renewal of the leader lease for ", common::ToMillis(ttl_ - margin()),
                      " ms of its ", common::ToMillis(ttl_), " ms (", last_error_, ")");
}

common::Duration LeaderLease::UntilRenewal(common::TimePoint now) const {
  const common::Duration pause =
      failing_ ? std::min<common::Duration>(ttl_ / 10, milliseconds(100)) : ttl_ / 3;
  // No later than the moment the lease counts as lost.
  return std::max(common::Duration::zero(), std::min(pause, LeftAt(now)));
}

}  // namespace gpuha::controller
