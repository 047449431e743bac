#include "common/reconnect.h"

#include <gtest/gtest.h>

namespace gpuha::common {
namespace {

using std::chrono::milliseconds;

TEST(ReconnectPolicyTest, WalksTheControllersInTurnAndBacksOff) {
  FakeClock clock;
  ReconnectPolicy p({{"10.0.0.1", 7400}, {"10.0.0.2", 7400}, {"10.0.0.3", 7400}}, 1);
  EXPECT_EQ(p.target().host, "10.0.0.1");
  std::vector<Duration> waits;
  for (int i = 0; i < 6; ++i) {
    TimePoint started = clock.Now();
    clock.Advance(milliseconds(10));  // each session fails at once
    waits.push_back(p.Failed(started, clock.Now()));
  }
  EXPECT_EQ(p.target().host, "10.0.0.1");  // 6 failures: round twice
  // On to the next controller at once within a round; after each round, a
  // wait jittered +-20% around 100, then 200 ms.
  const int64_t base[] = {0, 0, 100, 0, 0, 200};
  for (int i = 0; i < 6; ++i) {
    EXPECT_GE(ToMillis(waits[i]), base[i] * 8 / 10) << i;
    EXPECT_LE(ToMillis(waits[i]), base[i] * 12 / 10) << i;
  }
}

TEST(ReconnectPolicyTest, OneControllerBacksOffAfterEveryAttemptUpToTwoSeconds) {
  FakeClock clock;
  ReconnectPolicy p({{"10.0.0.1", 7400}}, 1);
  const int64_t base[] = {100, 200, 400, 800, 1600, 2000, 2000};
  for (int i = 0; i < 7; ++i) {
    TimePoint started = clock.Now();
    clock.Advance(milliseconds(10));
    const int64_t wait = ToMillis(p.Failed(started, clock.Now()));
    EXPECT_GE(wait, base[i] * 8 / 10) << i;
    EXPECT_LE(wait, base[i] * 12 / 10) << i;
    EXPECT_LE(wait, ToMillis(ReconnectPolicy::LongestWait()));
  }
}

TEST(ReconnectPolicyTest, ASessionThatStayedUpStartsTheBackoffOver) {
  FakeClock clock;
  ReconnectPolicy p({{"10.0.0.1", 7400}, {"10.0.0.2", 7400}}, 1);
  for (int i = 0; i < 5; ++i) p.Failed(clock.Now(), clock.Now());
  EXPECT_EQ(p.target().host, "10.0.0.2");
  TimePoint started = clock.Now();
  clock.Advance(milliseconds(5000));
  EXPECT_LE(ToMillis(p.Failed(started, clock.Now())), 120);  // ends a round: backs off from 100
  EXPECT_EQ(p.target().host, "10.0.0.1");
}

TEST(ReconnectPolicyTest, TheConnectTimeoutGrowsWithTimedOutAttemptsAndStartsOver) {
  // Regression: every attempt got 1 s, so a controller whose TLS handshake
  // took longer (ASan on a loaded CI host) was never reached.
  FakeClock clock;
  ReconnectPolicy p({{"10.0.0.1", 7400}}, 1);
  std::vector<int64_t> timeouts = {ToMillis(p.ConnectTimeout())};
  for (int i = 0; i < 4; ++i) {
    p.Failed(clock.Now(), clock.Now(), /*connect_timed_out=*/true);
    timeouts.push_back(ToMillis(p.ConnectTimeout()));
  }
  EXPECT_EQ(timeouts, (std::vector<int64_t>{1000, 2000, 4000, 4000, 4000}));
  // A session that connected (and was refused, or broke) starts it over: a
  // dead controller tried next costs 1 s, not 4.
  p.Failed(clock.Now(), clock.Now(), /*connect_timed_out=*/false);
  EXPECT_EQ(ToMillis(p.ConnectTimeout()), 1000);
}

}  // namespace
}  // namespace gpuha::common
