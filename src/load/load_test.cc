// gpuha load against a TestBackend on loopback: the stall metric leaves
// deliberately slow requests out and counts failures in.
#include "load/load.h"

#include <gtest/gtest.h>

#include "common/net_util.h"
#include "router/testing/test_backend.h"

namespace gpuha::load {
namespace {

using std::chrono::milliseconds;

LoadOptions Options(uint16_t port) {
  LoadOptions o;
  o.port = port;
  o.streams = 2;
  o.rate = 100;
  o.duration = milliseconds(1500);
  o.timeout = milliseconds(5000);
  o.progress = false;
  return o;
}

TEST(LoadTest, SlowRequestsLeaveHolesInAnswersButNoStall) {
  auto backend = router::testing::TestBackend::Start({.name = "b"});
  ASSERT_TRUE(backend.ok()) << backend.status();
  LoadOptions o = Options((*backend)->port());
  o.slow_fraction = 0.5;
  o.slow_query = "delay_ms=600";
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->failed, 0u) << r->Json();
  ASSERT_GT(r->slow_sent, 10u);
  EXPECT_EQ(r->slow_ok, r->slow_sent);  // all answered within the grace
  // Fast requests answer in about a millisecond; the 600 ms ones are not
  // anybody's stall. (Their holes show in max_gap_ms instead.)
  EXPECT_LT(r->max_stall_ms, 600) << r->Json();
  EXPECT_NE(r->Json().find("\"max_stall_ms\":"), std::string::npos);
}

TEST(LoadTest, FailuresStallTheStreamUntilAnAnswer) {
  LoadOptions o = Options(common::FreeLoopbackPort());  // nothing listens: every request fails
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 0u);
  EXPECT_EQ(r->failed, r->sent);
  // The streams waited from their first request to the end of the run.
  EXPECT_GT(r->max_stall_ms, 1000) << r->Json();
  EXPECT_LE(r->max_stall_ms, 1500.5) << r->Json();
}

}  // namespace
}  // namespace gpuha::load
