#include "router/tenants.h"

#include <gtest/gtest.h>

#include "common/net_util.h"

namespace gpuha::router {
namespace {

constexpr int64_t kSec = 1'000'000'000;

TEST(RateLimiterTest, BurstThenRate) {
  RateLimiter l(10, 5);  // 10/s, bursts of 5
  int64_t wait = 0;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l.Allow(kSec, &wait)) << i;
  EXPECT_FALSE(l.Allow(kSec, &wait));
  EXPECT_GT(wait, 0);
  EXPECT_LE(wait, kSec / 10);
  EXPECT_TRUE(l.Allow(kSec + wait, &wait));  // one more after the wait
  EXPECT_FALSE(l.Allow(kSec + kSec / 10 - 1, &wait));
  // A quiet second refills the burst, no more.
  int passed = 0;
  for (int i = 0; i < 20; ++i) passed += l.Allow(3 * kSec, &wait);
  EXPECT_EQ(passed, 5);
}

TEST(TenantSetTest, LooksUpByKeyHash) {
  std::vector<TenantConfig> tc = {{"acme", {common::Sha256Hex("k1")}, 0, 0, 4}};
  auto set = TenantSet::Build(tc, nullptr);
  EXPECT_TRUE(set->auth_required());
  ASSERT_NE(set->Lookup("k1"), nullptr);
  EXPECT_EQ(set->Lookup("k1")->name, "acme");
  EXPECT_EQ(set->Lookup("k2"), nullptr);
  EXPECT_EQ(set->Lookup(""), nullptr);
  EXPECT_EQ(set->Lookup("k1")->limiter, nullptr);
}

TEST(TenantSetTest, ReloadKeepsInFlightCounts) {
  std::vector<TenantConfig> tc = {{"acme", {common::Sha256Hex("k1")}, 5, 0, 4}};
  auto a = TenantSet::Build(tc, nullptr);
  a->Lookup("k1")->in_flight->fetch_add(3);
  tc[0].key_hashes = {common::Sha256Hex("k2")};  // key rotated
  auto b = TenantSet::Build(tc, a.get());
  EXPECT_EQ(b->Lookup("k1"), nullptr);
  ASSERT_NE(b->Lookup("k2"), nullptr);
  EXPECT_EQ(b->Lookup("k2")->in_flight->load(), 3);
  EXPECT_NE(b->Lookup("k2")->limiter, nullptr);
  EXPECT_FALSE(TenantSet::Build({}, nullptr)->auth_required());
}

}  // namespace
}  // namespace gpuha::router
