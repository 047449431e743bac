// ReconnectPolicy: which controller a client (an agent's heartbeat stream, a
// router's route watch) tries next, and how long it waits first. It walks
// the listed controllers in turn, going on to the next at once, and backs
// off after each whole round 100 ms, 200 ms ... 2 s, jittered by +-20% so a
// fleet does not reconnect in step; it starts over once a session stayed up
// for 5 s. One wait per round, not per controller: among three controllers
// on etcd only the leader listens, and a client that waited before each
// standby found a new leader only after its startup grace had ended. An attempt may take
// ConnectTimeout() to connect: 1 s, doubled after each attempt whose connection timed out, up to 4
// s, so that a controller whose TLS handshakes are slow (a loaded host) is reached in the end
// instead of being cut at the same 1 s on every attempt; an attempt that connected starts it over.
//
//   ReconnectPolicy policy(config.controllers, /*seed=*/hash(node));
//   while (!stopping) {
//     TimePoint started = clock->Now();
//     absl::Status s = RunSession(policy.target(), policy.ConnectTimeout());
//     Duration wait = policy.Failed(started, clock->Now(),  // moves to the next
//                                   absl::IsDeadlineExceeded(s));
//     ... log s, policy.target() and wait; sleep `wait` unless stopping
//   }
//
// Pure: time comes in as arguments. Thread-safety: none; one loop owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/backoff.h"
#include "common/clock.h"
#include "common/net_util.h"

namespace gpuha::common {

class ReconnectPolicy {
 public:
  ReconnectPolicy(std::vector<HostPort> targets, uint64_t seed)
      : targets_(std::move(targets)), backoff_(BackoffOptions(seed)) {}

  static Backoff::Options BackoffOptions(uint64_t seed) {
    return {.initial = std::chrono::milliseconds(100),
            .max = std::chrono::milliseconds(2000),
            .stable_after = std::chrono::milliseconds(5000),
            .jitter = 0.2,
            .seed = seed};
  }
  // The longest a client waits between two attempts (max plus its jitter):
  // a restarted controller must wait at least this long for its agents
  // before it takes their silence for failure.
  static Duration LongestWait() {
    Backoff::Options o = BackoffOptions(0);
    return std::chrono::duration_cast<Duration>(o.max * (1 + o.jitter));
  }

  static constexpr Duration kFirstConnect = std::chrono::milliseconds(1000);
  static constexpr Duration kLongestConnect = std::chrono::milliseconds(4000);

  // The controller to try now. At least one must be listed.
  const HostPort& target() const { return targets_[next_ % targets_.size()]; }
  // How long the attempt on target() may wait for its connection.
  Duration ConnectTimeout() const {
    return std::min(kFirstConnect * (int64_t{1} << std::min(timeouts_, 2)), kLongestConnect);
  }
  // A session that began at `started` ended at `now`: the next controller
  // is up, after the returned wait. `connect_timed_out`: it never connected.
  Duration Failed(TimePoint started, TimePoint now, bool connect_timed_out = false) {
    ++next_;
    timeouts_ = connect_timed_out ? timeouts_ + 1 : 0;
    backoff_.MaybeReset(started, now);
    if (next_ % targets_.size() != 0) return Duration::zero();  // the round goes on
    return backoff_.Next();
  }

 private:
  std::vector<HostPort> targets_;
  Backoff backoff_;
  size_t next_ = 0;
  int timeouts_ = 0;  // attempts in a row whose connection timed out
};

}  // namespace gpuha::common
