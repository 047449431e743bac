#include "common/backoff.h"

#include <gtest/gtest.h>

namespace gpuha::common {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(BackoffTest, DoublesFromInitialUpToMax) {
  Backoff b({.initial = seconds(1), .max = seconds(5), .stable_after = seconds(60)});
  EXPECT_EQ(b.Next(), seconds(1));
  EXPECT_EQ(b.Next(), seconds(2));
  EXPECT_EQ(b.Next(), seconds(4));
  EXPECT_EQ(b.Next(), seconds(5));
  EXPECT_EQ(b.Next(), seconds(5));
}

TEST(BackoffTest, MaybeResetForgetsOnlyAfterAStableRun) {
  FakeClock clock;
  Backoff b({.initial = seconds(1), .max = seconds(60), .stable_after = seconds(10)});
  b.Next();
  b.Next();
  TimePoint started = clock.Now();
  clock.Advance(seconds(9));
  b.MaybeReset(started, clock.Now());  // up 9 s: not stable yet
  EXPECT_EQ(b.Next(), seconds(4));
  started = clock.Now();
  clock.Advance(seconds(10));
  b.MaybeReset(started, clock.Now());
  EXPECT_EQ(b.Next(), seconds(1));
  b.Next();
  b.Reset();
  EXPECT_EQ(b.Next(), seconds(1));
}

TEST(BackoffTest, JitterStaysInItsBandAndRepeatsForASeed) {
  Backoff::Options o{.initial = seconds(1), .max = seconds(1), .jitter = 0.2, .seed = 7};
  Backoff a(o), b(o);
  for (int i = 0; i < 100; ++i) {
    Duration d = a.Next();
    EXPECT_GE(d, milliseconds(800));
    EXPECT_LE(d, milliseconds(1200));
    EXPECT_EQ(d, b.Next());
  }
}

}  // namespace
}  // namespace gpuha::common
