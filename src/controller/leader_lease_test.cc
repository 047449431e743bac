#include "controller/leader_lease.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(LeaderLeaseTest, ItHoldsUntilAMarginBeforeTheTtlSinceTheLastConfirmedRenewalWasSent) {
  common::FakeClock clock;
  LeaderLease lease(milliseconds(2000));
  EXPECT_EQ(lease.margin(), milliseconds(200));  // a tenth, at most 200 ms
  EXPECT_FALSE(lease.Holds(clock.Now()));        // a standby holds nothing
  const common::TimePoint sent = clock.Now();
  clock.Advance(milliseconds(30));  // the grant's answer came 30 ms later
  lease.Won(sent);
  EXPECT_TRUE(lease.Holds(clock.Now()));
  EXPECT_EQ(lease.LeftAt(clock.Now()), milliseconds(1770));
  clock.Advance(milliseconds(1769));
  EXPECT_TRUE(lease.Holds(clock.Now()));
  EXPECT_FALSE(lease.Expire(clock.Now()));
  clock.Advance(milliseconds(1));
  EXPECT_FALSE(lease.Holds(clock.Now()));
  std::optional<std::string> why = lease.Expire(clock.Now());
  ASSERT_TRUE(why);
  EXPECT_THAT(*why, HasSubstr("no renewal of the leader lease for 1800 ms of its 2000 ms"));
  EXPECT_FALSE(lease.Expire(clock.Now()));  // said once
  EXPECT_EQ(lease.state(), LeaderLease::State::kLost);
  EXPECT_FALSE(lease.Lose());
}

TEST(LeaderLeaseTest, ARenewalMovesTheDeadlineFromWhenItWasSent) {
  common::FakeClock clock;
  LeaderLease lease(milliseconds(900));  // margin 90 ms
  lease.Won(clock.Now());
  EXPECT_EQ(lease.UntilRenewal(clock.Now()), milliseconds(300));  // a third of the TTL
  clock.Advance(milliseconds(300));
  const common::TimePoint sent = clock.Now();
  clock.Advance(milliseconds(500));  // a slow answer
  lease.Renewed(sent);
  EXPECT_EQ(lease.LeftAt(clock.Now()), milliseconds(900 - 90 - 500));
  lease.Renewed(sent - milliseconds(100));  // an older renewal's late answer moves nothing
  EXPECT_EQ(lease.LeftAt(clock.Now()), milliseconds(310));
}

TEST(LeaderLeaseTest, FailingRenewalsGoFasterButNeverPastTheDeadlineAndNameTheError) {
  common::FakeClock clock;
  LeaderLease lease(milliseconds(2000));
  lease.Won(clock.Now());
  lease.RenewalFailed("etcd: no leader");
  EXPECT_EQ(lease.UntilRenewal(clock.Now()), milliseconds(100));  // a tenth, at most 100 ms
  clock.Advance(milliseconds(1750));
  EXPECT_EQ(lease.UntilRenewal(clock.Now()), milliseconds(50));  // the deadline first
  clock.Advance(milliseconds(60));
  EXPECT_EQ(lease.UntilRenewal(clock.Now()), common::Duration::zero());
  std::optional<std::string> why = lease.Expire(clock.Now());
  ASSERT_TRUE(why);
  EXPECT_THAT(*why, HasSubstr("(etcd: no leader)"));
}

TEST(LeaderLeaseTest, ALossSeenElsewhereIsCountedOnce) {
  common::FakeClock clock;
  LeaderLease lease(milliseconds(2000));
  lease.Won(clock.Now());
  EXPECT_TRUE(lease.Lose());  // the key was deleted
  EXPECT_FALSE(lease.Lose());
  EXPECT_FALSE(lease.Holds(clock.Now()));
  EXPECT_FALSE(lease.Expire(clock.Now() + milliseconds(5000)));  // already lost
  lease.Renewed(clock.Now());                                    // a late answer revives nothing
  EXPECT_FALSE(lease.Holds(clock.Now()));
}

}  // namespace
}  // namespace gpuha::controller
