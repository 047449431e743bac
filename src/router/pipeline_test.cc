// The request pipeline on its own: admission, the order of attempts, the
// retry budget, the re-choice when routes move, and the answer when every
// upstream failed, on a fake clock with no socket.
// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange (Boost 1.74)
// clang-format on
#include "router/pipeline.h"

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/net_util.h"
#include "router/route_table.h"

namespace gpuha::router {
namespace {

constexpr char kA[] = "10.0.0.1:8000";
constexpr char kB[] = "10.0.0.2:8000";
constexpr char kC[] = "10.0.0.3:8000";

class PipelineTest : public ::testing::Test {
 protected:
  PipelineTest() { Publish({{"cam-1", "", kA, kB}}); }

  // The routes the control thread publishes, as Router::SetRoutes does.
  void Publish(const std::vector<StaticRoute>& routes) {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.routes = RouteTable::FromStatic(routes);
    shared_.routes_gen.fetch_add(1);
  }
  Loop& L() {
    if (!loop_) {
      loop_ = std::make_unique<Loop>(clock_, config_, shared_);
      loop_->tenants = TenantSet::Build(tenants_, nullptr);
    }
    return *loop_;
  }
  std::optional<Refusal> Admit(Pipeline& p, std::string_view stream = "cam-1") {
    return p.Admit({.stream_header = stream, .target = "/v2/models/m/infer", .key_cache = &cache_});
  }
  // A retry budget that never pays (set before L()).
  void NoRetryBudget() {
    config_.retry_min_per_second = 0;
    config_.retry_budget_percent = 0;
    config_.retry_burst = 0;
  }
  static std::string Address(const UpstreamState* up) { return up ? up->address : "none"; }

  common::FakeClock clock_;
  RouterConfig config_;
  RouterShared shared_;
  std::vector<TenantConfig> tenants_;
  KeyCache cache_;
  std::unique_ptr<Loop> loop_;
  std::optional<Refusal> refused_;
};

TEST_F(PipelineTest, AdmissionNamesWhatIsMissingInTheClientsProtocol) {
  Pipeline p(L());
  std::optional<Refusal> r = p.Admit({.target = "/v2/models/m/infer", .key_cache = &cache_});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, Reason::kNoStream);
  EXPECT_NE(r->detail.find("X-Gpuha-Stream header"), std::string::npos) << r->detail;
  Pipeline g(L());
  r = g.Admit(
      {.target = "/inference.GRPCInferenceService/ModelInfer", .key_cache = &cache_, .grpc = true});
  ASSERT_TRUE(r);
  EXPECT_NE(r->detail.find("x-gpuha-stream metadata"), std::string::npos) << r->detail;
  Pipeline u(L());
  r = Admit(u, "cam-9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, Reason::kUnknownStream);
  EXPECT_EQ(L().stats.requests.load(), 3u);
  EXPECT_EQ(L().stats.in_flight.load(), 0);  // none admitted
}

TEST_F(PipelineTest, ThePrimaryThenTheStandbyAndTheBudgetPaysForTheSecond) {
  NoRetryBudget();
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  EXPECT_EQ(L().stats.in_flight.load(), 1);
  EXPECT_EQ(Address(p.Next(&refused_)), kA);
  EXPECT_TRUE(p.HasNext());
  p.Failed({.why = "connect: refused"});
  // Nothing in the budget: the standby is not asked.
  EXPECT_EQ(p.Next(&refused_), nullptr);
  ASSERT_TRUE(refused_);
  EXPECT_EQ(refused_->reason, Reason::kRetryBudget);
  EXPECT_NE(refused_->detail.find("connect: refused"), std::string::npos) << refused_->detail;
}

TEST_F(PipelineTest, AVerdictsResendIsNotRationedAndTheStreamSticksToItsStandby) {
  NoRetryBudget();
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_EQ(Address(p.Next(&refused_)), kA);
  p.Failed({.why = "hung", .hung = true});
  EXPECT_EQ(Address(p.Next(&refused_)), kB);
  EXPECT_EQ(L().stats.hung_resends.load(), 1u);
  // The next request of the stream asks the standby first.
  Pipeline q(L());
  ASSERT_FALSE(Admit(q));
  EXPECT_EQ(Address(q.Next(&refused_)), kB);
}

TEST_F(PipelineTest, RoutesThatMovedWhileItWaitedAreWhereItGoesUnlessAnAnswerWasSetAside) {
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_EQ(Address(p.Next(&refused_)), kA);
  Publish({{"cam-1", "", kA, kC}});  // b fenced meanwhile, c the standby now
  p.Failed({.why = "read: reset"});
  EXPECT_EQ(Address(p.Next(&refused_)), kC);

  // An error answer set aside for the standby it was admitted with goes
  // there, though the routes moved.
  Publish({{"cam-1", "", kA, kB}});
  Pipeline q(L());
  ASSERT_FALSE(Admit(q));
  ASSERT_EQ(Address(q.Next(&refused_)), kA);
  Publish({{"cam-1", "", kA, ""}});
  q.Failed({.why = "answered 503", .answered = true, .server_error = true});
  EXPECT_EQ(Address(q.Next(&refused_)), kB);
  EXPECT_EQ(L().stats.retries_5xx.load(), 1u);
}

TEST_F(PipelineTest, AnAnswerThatLivedGoesOnWhereTheRoutesOfNowSayEvenBackToAnEarlierUpstream) {
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_EQ(Address(p.Next(&refused_)), kA);
  p.Failed({.why = "connect: refused"});
  ASSERT_EQ(Address(p.Next(&refused_)), kB);
  p.Lived();  // b served part of the answer, then broke
  p.Failed({.why = "broke mid-answer"});
  // a, which failed before the answer began, is asked for the rest.
  EXPECT_EQ(Address(p.Next(&refused_)), kA);
  p.Failed({.why = "connect: refused"});
  EXPECT_EQ(p.Next(&refused_), nullptr);
  EXPECT_FALSE(refused_);
  Refusal r = p.Exhausted();
  EXPECT_EQ(r.reason, Reason::kUpstreamFailed);
  EXPECT_NE(r.detail.find("every upstream failed; last: "), std::string::npos) << r.detail;
  EXPECT_EQ(p.attempts(), 3);
}

TEST_F(PipelineTest, AnAnswerThatLivedEndsWithTheRefusalOfTheRoutesOfNow) {
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_EQ(Address(p.Next(&refused_)), kA);
  p.Lived();
  Publish({{"cam-1", "", "", ""}});  // unplaced: the cluster is over capacity
  p.Failed({.why = "broke mid-answer"});
  EXPECT_FALSE(p.HasNext());  // not b, of routes gone by
  Refusal r = p.Exhausted();
  EXPECT_EQ(r.reason, Reason::kNoCapacity);
  EXPECT_NE(r.detail.find("broke mid-answer"), std::string::npos) << r.detail;
}

TEST_F(PipelineTest, AWholeAnswerNoLongerCountsAgainstTheQuotaOrInFlight) {
  tenants_ = {{.name = "acme", .key_hashes = {common::Sha256Hex("k-acme")}, .max_concurrent = 1}};
  Publish({{"cam-1", "acme", kA, kB}});
  auto Admit = [&](Pipeline& p) {
    return p.Admit({.api_key = "k-acme", .stream_header = "cam-1", .key_cache = &cache_});
  };
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  EXPECT_EQ(L().stats.in_flight.load(), 1);
  {
    Pipeline q(L());
    std::optional<Refusal> r = Admit(q);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->reason, Reason::kOverQuota);
  }
  p.Release();  // its last bytes are about to go out
  EXPECT_EQ(L().stats.in_flight.load(), 0);
  Pipeline q(L());
  EXPECT_FALSE(Admit(q));
}

TEST_F(PipelineTest, TheClientsOwnDeadlineSaysNothingOfTheUpstream) {
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_EQ(Address(p.Next(&refused_)), kA);
  Publish({{"cam-1", "", kA, kC}});
  p.Failed({.why = "grpc-timeout passed", .timeout = true, .client_deadline = true});
  EXPECT_EQ(Address(p.Next(&refused_)), kB);  // not re-chosen
  // Nor stuck to its standby: the next request asks the primary first.
  Pipeline q(L());
  ASSERT_FALSE(Admit(q));
  EXPECT_EQ(Address(q.Next(&refused_)), kA);
}

TEST_F(PipelineTest, ATimeoutOfTheClientsIsTheFinalAnswer) {
  Pipeline p(L());
  ASSERT_FALSE(Admit(p));
  ASSERT_TRUE(p.Next(&refused_));
  p.Failed({.why = "no response within 100 ms", .timeout = true});
  ASSERT_TRUE(p.Next(&refused_));
  p.Failed({.why = "connect: refused"});
  EXPECT_EQ(p.Exhausted().reason, Reason::kUpstreamTimeout);
}

}  // namespace
}  // namespace gpuha::router
