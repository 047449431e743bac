// The router's policy units on a fake clock: retry budget, outlier ejection,
// the sticky rule and upstream order, and admission. No sockets, no sleeps.
#include <gtest/gtest.h>

#include "common/clock.h"
#include "router/admission.h"
#include "router/exchange.h"
#include "router/progress.h"
#include "router/retry_budget.h"
#include "router/upstream_health.h"
#include "router/upstream_selector.h"

namespace gpuha::router {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RetryBudgetTest, StartsWithASecondsWorthAndIsExhausted) {
  common::FakeClock clock;
  RetryBudget b({.percent = 0, .min_per_second = 3, .burst = 100}, clock.Now());
  EXPECT_TRUE(b.TryWithdraw(clock.Now()));
  EXPECT_TRUE(b.TryWithdraw(clock.Now()));
  EXPECT_TRUE(b.TryWithdraw(clock.Now()));
  EXPECT_FALSE(b.TryWithdraw(clock.Now()));
  EXPECT_DOUBLE_EQ(b.Balance(clock.Now()), 0);
}

TEST(RetryBudgetTest, RequestsEarnTheirPercentOfARetry) {
  common::FakeClock clock;
  RetryBudget b({.percent = 20, .min_per_second = 0, .burst = 100}, clock.Now());
  EXPECT_FALSE(b.TryWithdraw(clock.Now()));
  for (int i = 0; i < 4; ++i) b.Deposit(clock.Now());
  EXPECT_FALSE(b.TryWithdraw(clock.Now()));  // 0.8 of a retry
  b.Deposit(clock.Now());
  EXPECT_TRUE(b.TryWithdraw(clock.Now()));  // 1.0
  EXPECT_FALSE(b.TryWithdraw(clock.Now()));
  // 102 requests earn 20.4 retries: 20, and no more.
  for (int i = 0; i < 102; ++i) b.Deposit(clock.Now());
  int retries = 0;
  while (b.TryWithdraw(clock.Now())) ++retries;
  EXPECT_EQ(retries, 20);
}

TEST(RetryBudgetTest, TimeEarnsMinPerSecond) {
  common::FakeClock clock;
  RetryBudget b({.percent = 0, .min_per_second = 10, .burst = 100}, clock.Now());
  while (b.TryWithdraw(clock.Now())) {
  }
  clock.Advance(milliseconds(99));
  EXPECT_FALSE(b.TryWithdraw(clock.Now()));  // 0.99
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(b.TryWithdraw(clock.Now()));
  clock.Advance(seconds(2));
  EXPECT_NEAR(b.Balance(clock.Now()), 20, 1e-9);
}

TEST(RetryBudgetTest, BalanceIsCappedAtBurst) {
  common::FakeClock clock;
  RetryBudget b({.percent = 50, .min_per_second = 10, .burst = 5}, clock.Now());
  clock.Advance(seconds(60));
  for (int i = 0; i < 1000; ++i) b.Deposit(clock.Now());
  EXPECT_DOUBLE_EQ(b.Balance(clock.Now()), 5);
  int retries = 0;
  while (b.TryWithdraw(clock.Now())) ++retries;
  EXPECT_EQ(retries, 5);
}

TEST(RetryBudgetTest, ClockGoingBackEarnsNothing) {
  common::FakeClock clock;
  RetryBudget b({.percent = 0, .min_per_second = 10, .burst = 100}, clock.Now() + seconds(5));
  EXPECT_DOUBLE_EQ(b.Balance(clock.Now()), 10);
}

TEST(UpstreamHealthTest, EjectionBacksOffExponentiallyUpToMax) {
  common::FakeClock clock;
  UpstreamHealth h({.base = milliseconds(100), .max = milliseconds(350)});
  EXPECT_TRUE(h.usable(clock.Now()));
  h.ConnectionFailed(clock.Now());
  EXPECT_FALSE(h.usable(clock.Now()));
  EXPECT_TRUE(h.candidate());  // a last resort
  clock.Advance(milliseconds(99));
  EXPECT_TRUE(h.ejected(clock.Now()));
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(h.usable(clock.Now()));
  h.ConnectionFailed(clock.Now());  // second: 200 ms
  clock.Advance(milliseconds(199));
  EXPECT_TRUE(h.ejected(clock.Now()));
  clock.Advance(milliseconds(1));
  EXPECT_FALSE(h.ejected(clock.Now()));
  h.ConnectionFailed(clock.Now());  // third: 400 ms, capped at 350
  clock.Advance(milliseconds(349));
  EXPECT_TRUE(h.ejected(clock.Now()));
  clock.Advance(milliseconds(1));
  EXPECT_FALSE(h.ejected(clock.Now()));
  EXPECT_EQ(h.failures(), 3);
}

TEST(UpstreamHealthTest, AnswerForgetsFailuresButTheEjectionRunsOut) {
  common::FakeClock clock;
  UpstreamHealth h({.base = milliseconds(100), .max = seconds(10)});
  h.ConnectionFailed(clock.Now());
  h.ConnectionFailed(clock.Now());
  h.Answered();
  EXPECT_EQ(h.failures(), 0);
  EXPECT_TRUE(h.ejected(clock.Now()));  // 200 ms still running
  clock.Advance(milliseconds(200));
  h.ConnectionFailed(clock.Now());  // counted from one again: 100 ms
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(h.usable(clock.Now()));
}

TEST(UpstreamHealthTest, ProbedUpEndsTheEjectionDownAndHungAreNotCandidates) {
  common::FakeClock clock;
  UpstreamHealth h({.base = seconds(1), .max = seconds(10)});
  h.ConnectionFailed(clock.Now());
  h.SetHealth(Health::kUp);
  EXPECT_TRUE(h.usable(clock.Now()));
  h.SetHealth(Health::kHung);
  EXPECT_FALSE(h.candidate());
  h.SetHealth(Health::kDown);
  EXPECT_FALSE(h.candidate());
  h.SetHealth(Health::kUp);
  h.resolvable = false;
  EXPECT_FALSE(h.candidate());
}

TEST(UpstreamSelectorTest, PrimaryFirstThenStandby) {
  common::FakeClock clock;
  UpstreamHealth p, s;
  auto order = StreamOrder(&p, &s, /*stuck=*/false, clock.Now());
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], &p);
  EXPECT_EQ(order[1], &s);
  auto alone = StreamOrder<UpstreamHealth>(&p, nullptr, /*stuck=*/true, clock.Now());
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0], &p);
}

TEST(UpstreamSelectorTest, EjectedPrimaryGoesBehindItsStandby) {
  common::FakeClock clock;
  UpstreamHealth p({.base = seconds(1), .max = seconds(1)}), s;
  p.ConnectionFailed(clock.Now());
  auto order = StreamOrder(&p, &s, false, clock.Now());
  DropUnfit(order, clock.Now());
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], &s);
  EXPECT_EQ(order[1], &p);  // the last resort
}

TEST(UpstreamSelectorTest, DownAndHungUpstreamsAreDropped) {
  common::FakeClock clock;
  UpstreamHealth p, s;
  p.SetHealth(Health::kHung);
  auto order = StreamOrder(&p, &s, false, clock.Now());
  DropUnfit(order, clock.Now());
  ASSERT_EQ(order.size(), 1u);
  EXPECT_EQ(order[0], &s);
  s.SetHealth(Health::kDown);
  order = StreamOrder(&p, &s, false, clock.Now());
  DropUnfit(order, clock.Now());
  EXPECT_TRUE(order.empty());
}

// Learns the window from the answers: p90 of head latencies times 4, within
// the floor and ceiling; the ceiling until anything is learned.
TEST(ProgressMonitorTest, WindowIsLearnedFromLatencies) {
  common::FakeClock clock;
  ProgressMonitor m({.floor = milliseconds(150), .ceiling = seconds(30)});
  EXPECT_EQ(m.Window(), seconds(30));
  for (int i = 0; i < 98; ++i) m.Answered(clock.Now(), milliseconds(5));
  m.Answered(clock.Now(), milliseconds(1500));  // 2% slow: above the p90
  m.Answered(clock.Now(), milliseconds(1500));
  EXPECT_EQ(m.Window(), milliseconds(150));  // 5 ms * 4, floored
  for (int i = 0; i < 300; ++i) m.Answered(clock.Now(), milliseconds(400));
  EXPECT_EQ(m.Window(), milliseconds(1600));  // only the last 256 count
  for (int i = 0; i < 300; ++i) m.Answered(clock.Now(), seconds(20));
  EXPECT_EQ(m.Window(), seconds(30));  // capped
}

// n requests, `apart` from each other from `first`, each declaring `expect`.
std::vector<ProgressMonitor::Waiting> Since(common::TimePoint first, int n, milliseconds apart,
                                            common::Duration expect = {}) {
  std::vector<ProgressMonitor::Waiting> out;
  for (int i = 0; i < n; ++i) out.push_back({first + i * apart, expect});
  return out;
}

// The half-hang: answers stop, requests pile up; stalled one window after.
TEST(ProgressMonitorTest, AnUpstreamThatStopsAnsweringUnderLoadIsStalledAfterOneWindow) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (int i = 0; i < 100; ++i) m.Answered(clock.Now(), milliseconds(5));
  const common::TimePoint stop = clock.Now();
  // 500 requests a second arrive and none is answered.
  clock.Advance(milliseconds(150));
  EXPECT_FALSE(m.Stalled(clock.Now(), Since(stop, 75, milliseconds(2))));
  clock.Advance(milliseconds(7));
  EXPECT_TRUE(m.Stalled(clock.Now(), Since(stop, 78, milliseconds(2))));
}

// Legitimately slow requests on a healthy upstream are never cut.
TEST(ProgressMonitorTest, SlowRequestsOnAnUpstreamThatKeepsAnsweringAreNotAStall) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (int i = 0; i < 100; ++i) m.Answered(clock.Now(), milliseconds(5));
  // Three 1.5 s requests began together; fast ones keep being answered.
  std::vector<ProgressMonitor::Waiting> slow = Since(clock.Now(), 3, milliseconds(0));
  for (int t = 0; t < 1400; t += 10) {
    clock.Advance(milliseconds(10));
    m.Answered(clock.Now(), milliseconds(5));
    EXPECT_FALSE(m.Stalled(clock.Now(), slow)) << t;
  }
  // A lone slow request with no other traffic proves nothing either.
  clock.Advance(seconds(5));
  EXPECT_FALSE(m.Stalled(clock.Now(), Since(clock.Now() - seconds(5), 1, milliseconds(0))));
  // Two are not enough; three are (min_waiting).
  EXPECT_FALSE(m.Stalled(clock.Now(), Since(clock.Now() - seconds(5), 2, milliseconds(1))));
  EXPECT_TRUE(m.Stalled(clock.Now(), Since(clock.Now() - seconds(5), 3, milliseconds(1))));
}

// A server whose requests all take long (an LLM) gets a long window.
TEST(ProgressMonitorTest, ALongRequestWorkloadGetsALongWindow) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (int i = 0; i < 50; ++i) m.Answered(clock.Now(), seconds(4));
  clock.Advance(seconds(10));
  EXPECT_FALSE(m.Stalled(clock.Now(), Since(clock.Now() - seconds(10), 8, milliseconds(10))));
  clock.Advance(seconds(7));
  EXPECT_TRUE(m.Stalled(clock.Now(), Since(clock.Now() - seconds(17), 8, milliseconds(10))));
}

// A request's declared expectation replaces the learned window for it.
TEST(ProgressMonitorTest, ADeclaredExpectationReplacesTheLearnedWindow) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (int i = 0; i < 100; ++i) m.Answered(clock.Now(), milliseconds(5));  // window: 150 ms
  const common::TimePoint stop = clock.Now();
  clock.Advance(seconds(2));
  // Long generations that said they take 20 s are not overdue at 2 s...
  EXPECT_FALSE(m.Stalled(clock.Now(), Since(stop, 5, milliseconds(1), seconds(20))));
  // ...but are past 20 s, and undeclared ones are past the window.
  EXPECT_TRUE(m.Stalled(clock.Now(), Since(stop, 5, milliseconds(1))));
  clock.Advance(seconds(19));
  EXPECT_TRUE(m.Stalled(clock.Now(), Since(stop, 5, milliseconds(1), seconds(20))));

  // A server whose requests took 4 s (window 16 s): requests that say they
  // take 100 ms are overdue after the floor (150 ms), not 16 s.
  ProgressMonitor slow;
  for (int i = 0; i < 50; ++i) slow.Answered(clock.Now(), seconds(4));
  const common::TimePoint quiet = clock.Now();
  clock.Advance(milliseconds(140));
  EXPECT_FALSE(slow.Stalled(clock.Now(), Since(quiet, 3, milliseconds(0), milliseconds(100))));
  clock.Advance(milliseconds(20));
  EXPECT_TRUE(slow.Stalled(clock.Now(), Since(quiet, 3, milliseconds(0), milliseconds(100))));
  EXPECT_FALSE(slow.Stalled(clock.Now(), Since(quiet, 3, milliseconds(0))));
}

// Issue 37: the engine stops while slow requests it had begun are still
// out. They come back one by one over the next 1.5 s; none of them is
// progress for the requests begun since, which are stalled one window
// after the stop all the same.
TEST(ProgressMonitorTest, SlowAnswersToRequestsBegunBeforeTheStopAreNotProgress) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (size_t i = 0; i < ProgressMonitor::kSamples; ++i) {
    clock.Advance(milliseconds(1));
    m.Answered(clock.Now(), milliseconds(1));  // window: the 150 ms floor
  }
  const common::TimePoint stop = clock.Now();
  // 1,000 requests a second from the stop on, none answered; the slow
  // requests begun up to 1.5 s before the stop are answered every 20 ms.
  for (int t = 20; t <= 400; t += 20) {
    clock.Advance(milliseconds(20));
    m.Answered(clock.Now(), milliseconds(1500));
    std::vector<ProgressMonitor::Waiting> waiting = Since(stop, t, milliseconds(1));
    // Begun 2 ms after the stop, the third request is overdue after 152 ms.
    EXPECT_EQ(m.Stalled(clock.Now(), waiting), t > 152) << t;
    ASSERT_TRUE(m.StallDue(waiting).has_value());
    EXPECT_EQ(*m.StallDue(waiting), stop + milliseconds(2) + milliseconds(150)) << t;
  }
  EXPECT_EQ(m.last_progress(), stop);
}

// A healthy server's queue, drained in order under a burst: every answer
// moves the frontier, so requests that wait long behind others are never
// taken for a stall.
TEST(ProgressMonitorTest, AQueueDrainedInOrderIsProgressHoweverLongItsRequestsWait) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (int i = 0; i < 100; ++i) m.Answered(clock.Now(), milliseconds(5));
  const common::TimePoint burst = clock.Now();
  // 1,000 requests arrive at once, 10 us apart; one is answered every 1 ms
  // in the order they came, so the last waits a second.
  std::vector<ProgressMonitor::Waiting> queue = Since(burst, 0, milliseconds(0));
  for (int i = 0; i < 1000; ++i) queue.push_back({burst + std::chrono::microseconds(10 * i)});
  for (int answered = 0; answered < 1000; ++answered) {
    clock.Advance(milliseconds(1));
    m.Answered(clock.Now(), clock.Now() - queue[answered].since);
    std::vector<ProgressMonitor::Waiting> waiting(queue.begin() + answered + 1, queue.end());
    ASSERT_FALSE(m.Stalled(clock.Now(), waiting)) << answered;
  }
}

// A server that answers a little out of order under load (kept-alive
// connections first, new ones from its accept queue after): answers to
// requests begun within a window of the newest answered one are progress.
TEST(ProgressMonitorTest, AnswersALittleOutOfOrderAreProgress) {
  common::FakeClock clock;
  ProgressMonitor m;
  for (size_t i = 0; i < ProgressMonitor::kSamples; ++i) m.Answered(clock.Now(), milliseconds(1));
  const common::TimePoint t0 = clock.Now();
  clock.Advance(milliseconds(200));
  m.Answered(clock.Now(), milliseconds(1));  // the newest, answered first
  std::vector<ProgressMonitor::Waiting> behind = Since(clock.Now(), 4, milliseconds(1));
  // Older ones from the accept queue, begun 100 ms before it, keep coming.
  for (int t = 10; t <= 400; t += 10) {
    clock.Advance(milliseconds(10));
    m.Answered(clock.Now(), clock.Now() - (t0 + milliseconds(100 + t)));
    // Each is progress, the first (89 ms behind the newest) too: a strict
    // frontier would not count it.
    EXPECT_EQ(m.last_progress(), clock.Now()) << t;
    EXPECT_FALSE(m.Stalled(clock.Now(), behind)) << t;
  }
  EXPECT_EQ(m.last_progress(), clock.Now());
}

// Token streams: one or two open streams are judged as well, every one of
// them silent past the window (three or more: three of them).
TEST(ProgressMonitorTest, OneOrTwoSilentTokenStreamsAreStalled) {
  common::FakeClock clock;
  ProgressMonitor tokens;
  for (int i = 0; i < 100; ++i) {
    tokens.Learn(milliseconds(10));  // window: the 150 ms floor
    tokens.Progressed(clock.Now());
  }
  const common::TimePoint last = clock.Now();
  clock.Advance(milliseconds(140));
  EXPECT_FALSE(tokens.StreamsStalled(clock.Now(), Since(last, 1, milliseconds(0))));
  clock.Advance(milliseconds(20));
  EXPECT_TRUE(tokens.StreamsStalled(clock.Now(), Since(last, 1, milliseconds(0))));
  EXPECT_TRUE(tokens.StreamsStalled(clock.Now(), Since(last, 2, milliseconds(1))));
  // Two open, one of them still moving: not stalled.
  std::vector<ProgressMonitor::Waiting> two = {{last}, {clock.Now() - milliseconds(5)}};
  tokens.Progressed(clock.Now() - milliseconds(5));
  EXPECT_FALSE(tokens.StreamsStalled(clock.Now(), two));
  // Nothing open: nothing to judge.
  EXPECT_FALSE(tokens.StreamsStalled(clock.Now() + seconds(10), {}));
}

TEST(StickyTableTest, StuckStreamStaysOnItsStandbyUntilTheHoldPassesAndThePrimaryIsBack) {
  common::FakeClock clock;
  StickyTable sticky(seconds(10));
  EXPECT_FALSE(sticky.Stuck("cam-1", "a", "b", true, clock.Now()));
  sticky.Stick("cam-1", "a", "b", clock.Now());
  clock.Advance(seconds(9));
  EXPECT_TRUE(sticky.Stuck("cam-1", "a", "b", /*primary_usable=*/true, clock.Now()));
  clock.Advance(seconds(1));
  // The hold is over, but the primary is still out: stay.
  EXPECT_TRUE(sticky.Stuck("cam-1", "a", "b", /*primary_usable=*/false, clock.Now()));
  EXPECT_FALSE(sticky.Stuck("cam-1", "a", "b", /*primary_usable=*/true, clock.Now()));
  EXPECT_EQ(sticky.size(), 0u);
  EXPECT_FALSE(sticky.Stuck("cam-1", "a", "b", false, clock.Now()));
}

TEST(StickyTableTest, NewRoutesFromTheControllerWin) {
  common::FakeClock clock;
  StickyTable sticky(seconds(10));
  sticky.Stick("cam-1", "a", "b", clock.Now());
  EXPECT_FALSE(sticky.Stuck("cam-1", "b", "c", false, clock.Now()));
  EXPECT_EQ(sticky.size(), 0u);
  sticky.Stick("cam-2", "a", "b", clock.Now());
  EXPECT_FALSE(sticky.Stuck("cam-2", "a", "c", false, clock.Now()));  // the standby moved
}

TEST(StickyTableTest, StuckStreamOrdersItsStandbyFirstEvenWithAUsablePrimary) {
  common::FakeClock clock;
  StickyTable sticky(seconds(10));
  UpstreamHealth p, s;
  sticky.Stick("cam-1", "a", "b", clock.Now());
  bool stuck = sticky.Stuck("cam-1", "a", "b", p.usable(clock.Now()), clock.Now());
  auto order = StreamOrder(&p, &s, stuck, clock.Now());
  EXPECT_EQ(order[0], &s);
  clock.Advance(seconds(10));
  stuck = sticky.Stuck("cam-1", "a", "b", p.usable(clock.Now()), clock.Now());
  order = StreamOrder(&p, &s, stuck, clock.Now());
  EXPECT_EQ(order[0], &p);
}

std::shared_ptr<TenantSet> Tenants(double rps, double burst, int64_t max_concurrent) {
  // sha256("k-acme")
  return TenantSet::Build(
      {{.name = "acme",
        .key_hashes = {"0b131655124822cb1cf254042086d2bf26a4f1c6cd82727aab583e915346"
                       "aca3"},
        .requests_per_second = rps,
        .burst = burst,
        .max_concurrent = max_concurrent}},
      nullptr);
}

TEST(AdmissionTest, OpenTenantWhenNoTenantsAreConfigured) {
  auto open = TenantSet::Build({}, nullptr);
  KeyCache cache;
  Identity who = Identify(*open, "", &cache);
  ASSERT_TRUE(who.tenant);
  EXPECT_FALSE(who.refusal);
}

TEST(AdmissionTest, MissingAndUnknownKeysAreRefusedWith401) {
  auto tenants = Tenants(0, 0, 0);
  KeyCache cache;
  Identity none = Identify(*tenants, "", &cache);
  EXPECT_FALSE(none.tenant);
  ASSERT_TRUE(none.refusal);
  EXPECT_EQ(none.refusal->reason, Reason::kUnauthorized);
  EXPECT_NE(none.refusal->detail.find("no API key"), std::string::npos);
  Identity wrong = Identify(*tenants, "k-other", &cache);
  ASSERT_TRUE(wrong.refusal);
  EXPECT_EQ(wrong.refusal->detail, "unknown API key");
  EXPECT_FALSE(cache.tenant);
}

// Adversarial finding: a connection's cached key outlived a reload. The
// key revoked (its tenant removed) went on working on a kept-alive
// connection; a key moved to another tenant stayed the first one's.
TEST(AdmissionTest, AReloadHoldsForAConnectionsCachedKey) {
  auto before = Tenants(0, 0, 0);
  KeyCache cache;
  Identity who = Identify(*before, "k-acme", &cache);
  ASSERT_TRUE(who.tenant);
  EXPECT_EQ(who.tenant->name, "acme");
  EXPECT_EQ(Identify(*before, "k-acme", &cache).tenant, who.tenant);  // from the cache

  // The same key, now another tenant's (a reload built on the one before).
  auto moved = TenantSet::Build(
      {{.name = "globex",
        .key_hashes = {"0b131655124822cb1cf254042086d2bf26a4f1c6cd82727aab583e915346aca3"}}},
      before.get());
  Identity now = Identify(*moved, "k-acme", &cache);
  ASSERT_TRUE(now.tenant);
  EXPECT_EQ(now.tenant->name, "globex");

  // Revoked: refused at once, on the same connection.
  auto revoked =
      TenantSet::Build({{.name = "globex", .key_hashes = {std::string(64, 'f')}}}, moved.get());
  Identity refused = Identify(*revoked, "k-acme", &cache);
  EXPECT_FALSE(refused.tenant);
  ASSERT_TRUE(refused.refusal);
  EXPECT_EQ(refused.refusal->reason, Reason::kUnauthorized);
  EXPECT_FALSE(cache.tenant);
}

TEST(AdmissionTest, RateLimitRefusesWithRetryAfterAndRefillsWithTime) {
  common::FakeClock clock;
  auto tenants = Tenants(/*rps=*/2, /*burst=*/2, 0);
  std::shared_ptr<Tenant> t = tenants->Lookup("k-acme");
  ASSERT_TRUE(t);
  EXPECT_FALSE(CheckRate(*t, clock.Now()));
  EXPECT_FALSE(CheckRate(*t, clock.Now()));
  std::optional<Refusal> r = CheckRate(*t, clock.Now());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, Reason::kRateLimited);
  EXPECT_EQ(r->retry_after_s, 1);
  clock.Advance(milliseconds(500));  // one more at 2 per second
  EXPECT_FALSE(CheckRate(*t, clock.Now()));
  EXPECT_TRUE(CheckRate(*t, clock.Now()));
}

TEST(AdmissionTest, QuotaCountsRequestsInFlightAndReleasesThem) {
  Tenant t;
  t.max_concurrent = 2;
  {
    QuotaSlot a(t), b(t);
    EXPECT_FALSE(a.over());
    EXPECT_FALSE(b.over());
    {
      QuotaSlot c(t);
      EXPECT_TRUE(c.over());
      EXPECT_EQ(t.in_flight->load(), 3);
    }
    EXPECT_EQ(t.in_flight->load(), 2);
  }
  EXPECT_EQ(t.in_flight->load(), 0);
  QuotaSlot d(t);
  EXPECT_FALSE(d.over());
  Tenant unlimited;
  QuotaSlot e(unlimited);
  EXPECT_FALSE(e.over());
  EXPECT_EQ(unlimited.in_flight->load(), 1);
}

TEST(RelayFramingTest, LengthAndChunkedBodiesKeepTheirFraming) {
  RelayFraming f = DecideRelayFraming(false, 200, false, 42, true, 11, true);
  EXPECT_EQ(f.down, Framing::kLength);
  EXPECT_EQ(f.length, 42u);
  EXPECT_TRUE(f.upstream_reusable);
  EXPECT_TRUE(f.client_keep_alive);
  EXPECT_FALSE(f.head_only);
  f = DecideRelayFraming(false, 200, true, std::nullopt, true, 11, true);
  EXPECT_EQ(f.down, Framing::kChunked);
  EXPECT_TRUE(f.upstream_reusable);
}

TEST(RelayFramingTest, BodyUntilCloseIsRechunkedAndTheUpstreamNotReused) {
  RelayFraming f = DecideRelayFraming(false, 200, false, std::nullopt, true, 11, true);
  EXPECT_EQ(f.down, Framing::kChunked);
  EXPECT_FALSE(f.upstream_reusable);
  EXPECT_TRUE(f.client_keep_alive);
  EXPECT_FALSE(f.close_client);
}

TEST(RelayFramingTest, Http10ClientGetsABodyDelimitedByClose) {
  RelayFraming f = DecideRelayFraming(false, 200, true, std::nullopt, true, 10, true);
  EXPECT_EQ(f.down, Framing::kNone);
  EXPECT_FALSE(f.client_keep_alive);
  EXPECT_TRUE(f.close_client);
}

TEST(RelayFramingTest, HeadAnd204And304CarryNoBody) {
  for (auto [head, status] : {std::pair{true, 200}, {false, 204}, {false, 304}}) {
    RelayFraming f = DecideRelayFraming(head, status, false, 7, true, 11, true);
    EXPECT_TRUE(f.head_only);
    EXPECT_EQ(f.down, Framing::kLength);  // the length is passed on, no body follows
    EXPECT_EQ(f.length, 7u);
    RelayFraming none = DecideRelayFraming(head, status, false, std::nullopt, true, 11, true);
    EXPECT_EQ(none.down, Framing::kNone);
    EXPECT_TRUE(none.upstream_reusable);
  }
}

}  // namespace
}  // namespace gpuha::router
