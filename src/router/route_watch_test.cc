// The route watch against fake controllers over real gRPC on loopback: it
// moves on to the next listed controller when one is unreachable or goes
// away, takes each controller's snapshot, and acknowledges the version it
// holds.
#include "router/route_watch.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "common/testing/eventually.h"
#include "common/testing/raw_http.h"
#include "gpuha/v1/routes.grpc.pb.h"

namespace gpuha::router {
namespace {

using std::chrono::milliseconds;

// Serves one snapshot (epoch, version, stream s1 on `primary`; a standby's
// if `standby`) to each watcher and records the acks it gets.
class FakeRouteService final : public v1::RouteService::Service {
 public:
  FakeRouteService(uint64_t epoch, uint64_t version, std::string primary, bool standby = false)
      : epoch_(epoch), version_(version), primary_(std::move(primary)), standby_(standby) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeRouteService() override { Shutdown(); }
  void Shutdown() {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(200));
    server_.reset();
  }
  uint16_t port() const { return static_cast<uint16_t>(port_); }
  std::vector<uint64_t> acked() {
    std::lock_guard<std::mutex> lock(mu_);
    return acked_;
  }
  std::vector<std::string> suspects() {
    std::lock_guard<std::mutex> lock(mu_);
    return suspects_;
  }
  int watches() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(hello_epochs_.size());
  }
  // The epoch each watcher said it held when it started.
  std::vector<uint64_t> hello_epochs() {
    std::lock_guard<std::mutex> lock(mu_);
    return hello_epochs_;
  }

  grpc::Status Watch(grpc::ServerContext*,
                     grpc::ServerReaderWriter<v1::RouteSnapshot, v1::RouteAck>* stream) override {
    v1::RouteAck ack;
    if (!stream->Read(&ack)) return grpc::Status::OK;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hello_epochs_.push_back(ack.epoch());
    }
    v1::RouteSnapshot snap;
    snap.set_epoch(epoch_);
    snap.set_version(version_);
    snap.set_standby(standby_);
    if (standby_) snap.set_leader("127.0.0.1:7402");
    v1::Route* r = snap.add_routes();
    r->set_stream("s1");
    r->set_tenant("acme");
    r->mutable_primary()->set_node(primary_);
    r->mutable_primary()->set_address("127.0.0.1:1");
    stream->Write(snap);
    while (stream->Read(&ack)) {
      std::lock_guard<std::mutex> lock(mu_);
      acked_.push_back(ack.version());
      suspects_.insert(suspects_.end(), ack.suspect_nodes().begin(), ack.suspect_nodes().end());
    }
    return grpc::Status::OK;
  }

 private:
  uint64_t epoch_, version_;
  std::string primary_;
  bool standby_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<uint64_t> acked_;
  std::vector<uint64_t> hello_epochs_;
  std::vector<std::string> suspects_;
};

bool Eventually(const std::function<bool()>& pred) {
  return gpuha::testing::Eventually(pred, std::chrono::seconds(10), milliseconds(10));
}

uint16_t DeadPort() {
  FakeRouteService gone(1, 1, "x");
  uint16_t port = gone.port();
  gone.Shutdown();
  return port;
}

class RouteWatchTest : public ::testing::Test {
 protected:
  void StartRouter(const std::vector<uint16_t>& controller_ports,
                   common::Duration standby_dwell = RouteWatch::kStandbyDwell) {
    config_.listen = {"127.0.0.1", 0};
    config_.admin = {"127.0.0.1", 0};
    config_.threads = 1;
    config_.probe_interval = milliseconds(0);
    for (uint16_t p : controller_ports) config_.controllers.push_back({"127.0.0.1", p});
    router_ = std::make_unique<Router>(config_);
    ASSERT_TRUE(router_->Start().ok());
    watch_ = std::make_unique<RouteWatch>(router_.get(), config_, common::RealClock::Get(),
                                          standby_dwell);
    watch_->Start();
  }
  void TearDown() override {
    if (watch_) watch_->Stop();
    if (router_) router_->Stop();
  }
  std::string PrimaryOfS1() {
    auto t = router_->routes();
    const RouteEntry* e = t ? t->Find("s1") : nullptr;
    return e ? e->primary.node : "";
  }
  RouterConfig config_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<RouteWatch> watch_;
};

TEST_F(RouteWatchTest, UnreachableControllerIsSkippedForTheNextListed) {
  FakeRouteService live(/*epoch=*/3, /*version=*/7, "n2");
  StartRouter({DeadPort(), live.port()});
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n2"; }));
  EXPECT_EQ(router_->routes()->version(), 7u);
  EXPECT_GE(watch_->reconnects(), 1u);
  EXPECT_TRUE(watch_->connected());
  // The router acknowledges the version it applied.
  EXPECT_TRUE(Eventually([&] {
    auto a = live.acked();
    return std::find(a.begin(), a.end(), 7u) != a.end();
  }));
}

TEST_F(RouteWatchTest, ControllerThatGoesAwayIsReplacedByTheNextWithANewerEpoch) {
  auto first = std::make_unique<FakeRouteService>(/*epoch=*/3, /*version=*/9, "n1");
  FakeRouteService second(/*epoch=*/4, /*version=*/1, "n3");
  StartRouter({first->port(), second.port()});
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n1"; }));
  uint64_t before = watch_->reconnects();
  first.reset();  // the controller dies; the router keeps its routes meanwhile
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n3"; }));
  EXPECT_EQ(router_->routes()->epoch(), 4u);
  EXPECT_EQ(router_->routes()->version(), 1u);
  EXPECT_GT(watch_->reconnects(), before);
}

// A deposed controller's older routes are refused, and the router leaves it
// for the next listed controller rather than staying attached to it.
TEST_F(RouteWatchTest, AnOlderEpochIsRefusedAndItsControllerLeft) {
  auto newer = std::make_unique<FakeRouteService>(/*epoch=*/5, /*version=*/2, "n1");
  FakeRouteService stale(/*epoch=*/4, /*version=*/50, "n3");
  StartRouter({newer->port(), stale.port()});
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n1"; }));
  newer.reset();
  // The router tells the stale controller the epoch it holds, refuses its
  // snapshot, and comes back (after the dead one) to try again.
  ASSERT_TRUE(Eventually([&] { return stale.hello_epochs().size() >= 2; }));
  for (uint64_t e : stale.hello_epochs()) EXPECT_EQ(e, 5u);
  EXPECT_TRUE(stale.acked().empty()) << "the stale routes were acknowledged";
  EXPECT_EQ(PrimaryOfS1(), "n1");
  EXPECT_EQ(router_->routes()->epoch(), 5u);
  EXPECT_EQ(router_->routes()->version(), 2u);
}

// Controllers on etcd: a standby serves the leader's routes. The router
// takes them, then goes on to the leader (where its acks and hints are acted
// on) and stays there.
TEST_F(RouteWatchTest, AStandbysRoutesAreTakenAndTheRouterGoesOnToTheLeader) {
  FakeRouteService standby(/*epoch=*/3, /*version=*/7, "n2", /*standby=*/true);
  FakeRouteService leader(/*epoch=*/3, /*version=*/8, "n1");
  const auto dwell = milliseconds(1000);
  const auto started = std::chrono::steady_clock::now();
  StartRouter({standby.port(), leader.port()}, dwell);  // the standby is tried first
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n2"; }));
  EXPECT_EQ(router_->routes()->version(), 7u);
  ASSERT_TRUE(Eventually([&] { return PrimaryOfS1() == "n1"; }));
  // The dwell counts from the standby's first routes, which came after `started`.
  EXPECT_GE(std::chrono::steady_clock::now() - started, dwell)
      << "left the standby before its dwell, with nothing to report";
  EXPECT_FALSE(watch_->on_standby());
  // The leader holds it: no more visits to the standby.
  std::this_thread::sleep_for(dwell + milliseconds(500));
  EXPECT_EQ(standby.watches(), 1);
  EXPECT_EQ(leader.watches(), 1);
  EXPECT_TRUE(watch_->connected());
}

// A suspect node seen while on a standby (which acts on no hint) sends the
// router to the leader at once, and the hint reaches the leader.
TEST_F(RouteWatchTest, ASuspectSeenOnAStandbyIsReportedToTheLeader) {
  FakeRouteService standby(/*epoch=*/3, /*version=*/7, "n2", /*standby=*/true);
  FakeRouteService leader(/*epoch=*/3, /*version=*/7, "n2");
  // A dwell far past the test's waits: only the hint can send it on.
  StartRouter({standby.port(), leader.port()}, std::chrono::seconds(600));
  ASSERT_TRUE(Eventually([&] { return watch_->on_standby(); }));
  // s1's primary is 127.0.0.1:1: the connection is refused, and n2 suspect.
  gpuha::testing::Reply r =
      gpuha::testing::Send(router_->port(), gpuha::testing::Get("/streams/s1/x", ""));
  EXPECT_EQ(r.status, 502) << r.error << r.body;
  ASSERT_TRUE(Eventually([&] {
    auto s = leader.suspects();
    return std::find(s.begin(), s.end(), "n2") != s.end();
  })) << "the hint waited for the dwell, or was lost";
  EXPECT_TRUE(standby.suspects().empty()) << "a hint went to the standby";
}

}  // namespace
}  // namespace gpuha::router
