// Backoff: exponential delays with optional jitter, reset after a stable
// period (keepalived restarts a crashed child after 1, 2, 4 ... 60 s).
//
//   Backoff b({.initial = 1s, .max = 60s, .stable_after = 60s});
//   Duration wait = b.Next();      // 1s, 2s, 4s ... 60s
//   b.MaybeReset(started_at, now); // resets once the run lasted stable_after
//
// Jitter comes from the caller's seeded generator, so tests repeat.
// Thread-safety: none.
#pragma once

#include <algorithm>
#include <random>

#include "common/clock.h"

namespace gpuha::common {

class Backoff {
 public:
  struct Options {
    Duration initial = std::chrono::seconds(1);
    Duration max = std::chrono::seconds(60);
    Duration stable_after = std::chrono::seconds(60);
    double jitter = 0;  // 0.2 spreads each delay over +-20%
    uint64_t seed = 1;
  };
  explicit Backoff(Options o) : o_(o), rng_(o.seed) {}

  // The delay before the next attempt; doubles each call up to max.
  Duration Next() {
    Duration d = current_ == Duration::zero() ? o_.initial : std::min(current_ * 2, o_.max);
    current_ = d;
    if (o_.jitter <= 0) return d;
    std::uniform_real_distribution<double> spread(1 - o_.jitter, 1 + o_.jitter);
    return std::chrono::duration_cast<Duration>(d * spread(rng_));
  }
  // Forgets the failures when the last attempt stayed up for stable_after.
  void MaybeReset(TimePoint started, TimePoint now) {
    if (now - started >= o_.stable_after) current_ = Duration::zero();
  }
  void Reset() { current_ = Duration::zero(); }

 private:
  Options o_;
  Duration current_ = Duration::zero();
  std::mt19937_64 rng_;
};

}  // namespace gpuha::common
