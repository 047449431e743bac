// UpstreamHealth: what the router's policy knows of one upstream, with no
// sockets in it. The verdict of the prober (up, down, hung) and outlier
// ejection on connection-level failures (Envoy's outlier detector): each
// consecutive failure ejects the upstream for base * 2^(failures-1), capped
// at max; an answered request forgets the failures, a probe that finds the
// upstream up also ends the ejection.
//
//   UpstreamHealth h({.base = 1s, .max = 30s});
//   h.ConnectionFailed(now);          // ejected for 1 s, then 2 s, 4 s ...
//   h.usable(now);                    // false while ejected, down or hung
//
// An ejected upstream is still tried as a last resort; a down or hung one is
// not tried at all (see UpstreamSelector).
// Thread-safety: none; each event loop keeps its own.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/clock.h"

namespace gpuha::router {

// The prober's verdict.
enum class Health { kUp, kDown, kHung };

// Outlier ejection's backoff (RouterConfig's ejection_base and ejection_max).
struct EjectionOptions {
  common::Duration base = std::chrono::seconds(1);
  common::Duration max = std::chrono::seconds(30);
};

class UpstreamHealth {
 public:
  using Options = EjectionOptions;
  UpstreamHealth() = default;
  explicit UpstreamHealth(Options o) : o_(o) {}

  // A connect, write or read failed at the connection level.
  void ConnectionFailed(common::TimePoint now) {
    failures_++;
    common::Duration backoff = o_.base * (int64_t{1} << std::min(failures_ - 1, 10));
    ejected_until_ = now + std::min(backoff, o_.max);
  }
  // The upstream answered a request: its failures are forgotten (a running
  // ejection still runs out).
  void Answered() { failures_ = 0; }
  // The prober's verdict. Up forgets failures and ends any ejection.
  void SetHealth(Health h) {
    health_ = h;
    if (h == Health::kUp) {
      failures_ = 0;
      ejected_until_ = {};
    }
  }

  Health health() const { return health_; }
  int failures() const { return failures_; }
  bool ejected(common::TimePoint now) const { return now < ejected_until_; }
  // Worth trying at all: probed up (an ejected upstream is a last resort).
  bool candidate() const { return resolvable && health_ == Health::kUp; }
  // Worth trying first.
  bool usable(common::TimePoint now) const { return candidate() && !ejected(now); }

  bool resolvable = true;  // its address is IP:PORT
  int64_t in_flight = 0;   // requests this loop has on it

 private:
  Options o_;
  Health health_ = Health::kUp;
  int failures_ = 0;
  common::TimePoint ejected_until_{};
};

}  // namespace gpuha::router
