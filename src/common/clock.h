// Clock: the one door to time for failure detection, sampling and backoff
// (leveldb's Env, Envoy's TimeSource). Production uses RealClock; tests use
// FakeClock and move time by hand, so timing logic is tested without sleeps.
//
//   FakeClock clock;
//   Detector d(&clock);
//   clock.Advance(std::chrono::milliseconds(150));
//
// Thread-safety: both clocks are safe to call from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gpuha::common {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time, for intervals and deadlines.
  virtual TimePoint Now() const = 0;
  // Wall-clock nanoseconds since the Unix epoch, for events shown to people.
  virtual int64_t UnixNanos() const = 0;
};

class RealClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance.
  static RealClock* Get() {
    static RealClock clock;
    return &clock;
  }
};

class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  int64_t UnixNanos() const override { return kUnixBase + now_ns_.load(); }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  static constexpr int64_t kUnixBase = 1'700'000'000'000'000'000;
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

inline int64_t ToMillis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace gpuha::common
