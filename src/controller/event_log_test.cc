#include "controller/event_log.h"

#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

Event E(const std::string& type, const std::string& node, uint64_t epoch, double ms) {
  return Event{.mono_ms = ms, .unix_ms = 1e12 + ms, .type = type, .node = node, .epoch = epoch};
}

std::vector<Event> Logged(std::vector<Event> events) {
  EventLog log(100);
  for (Event& e : events) log.Append(std::move(e));
  return log.Since(0);
}

TEST(EventLogTest, KeepsTheNewestAndCountsIdsOn) {
  EventLog log(3);
  for (int i = 0; i < 5; ++i) log.Append(E("x", "", 1, i));
  std::vector<Event> all = log.Since(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().id, 3);
  EXPECT_EQ(all.back().id, 5);
  EXPECT_EQ(log.Since(4).size(), 1u);
  EXPECT_EQ(log.Since(0, 2).size(), 2u);
  log.Restore(Event{.id = 40, .type = "y"});
  EXPECT_EQ(log.Append(E("z", "", 1, 9)).id, 41);
}

TEST(EventLogTest, JsonRoundTripsAndBadFieldsAreNamed) {
  Event e{.id = 7,
          .mono_ms = 1.5,
          .unix_ms = 2.5,
          .type = "fenced",
          .node = "n1",
          .epoch = 3,
          .detail = "d"};
  absl::StatusOr<Event> back = EventFromJson(EventJson(e));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(EventJson(*back), EventJson(e));
  EXPECT_EQ(EventFromJson(nlohmann::json{{"type", "x"}, {"epoch", "three"}}).status().message(),
            "event.epoch: wrong type");
  EXPECT_FALSE(EventFromJson(nlohmann::json::array()).ok());
  EXPECT_FALSE(EventFromJson(nlohmann::json{{"node", "n"}}).ok());
}

TEST(FailoverTimingsTest, EachStepIsTheFirstMatchAfterDetection) {
  std::vector<Event> events = Logged({
      E("routes_pushed", "", 1, 1),  // before the failover: not its
      E("fault_seen", "n2", 2, 9),
      E("detected", "n2", 2, 10),
      E("fenced", "n1", 2, 10.5),  // another node's fence
      E("fenced", "n2", 2, 11),
      E("routes_pushed", "", 2, 12),
      E("routers_acked", "", 2, 14),
      E("routers_acked", "", 2, 20),
  });
  std::vector<FailoverTiming> f = FailoverTimings(events);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].detected.node, "n2");
  ASSERT_TRUE(f[0].fault_seen && f[0].fenced && f[0].routes_pushed && f[0].routers_acked);
  EXPECT_EQ(f[0].fault_seen->mono_ms, 9);
  EXPECT_EQ(f[0].fenced->mono_ms, 11);
  EXPECT_EQ(f[0].routes_pushed->mono_ms, 12);
  EXPECT_EQ(f[0].routers_acked->mono_ms, 14);
}

TEST(FailoverTimingsTest, TwoFailoversAndAnUnconfirmedFence) {
  std::vector<Event> events = Logged({
      E("detected", "n1", 2, 10),
      E("fence_unconfirmed", "n1", 2, 10.2),
      E("routes_pushed", "", 2, 10.4),
      E("detected", "n2", 3, 11),
      E("fenced", "n2", 3, 11.2),
      E("routes_pushed", "", 3, 11.4),
      E("routers_acked", "", 3, 13),
  });
  std::vector<FailoverTiming> f = FailoverTimings(events);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].fenced->type, "fence_unconfirmed");
  EXPECT_EQ(f[0].routes_pushed->mono_ms, 10.4);
  // The acknowledgement of a later version covers the first failover's too.
  EXPECT_EQ(f[0].routers_acked->mono_ms, 13);
  EXPECT_FALSE(f[0].fault_seen);
  EXPECT_EQ(f[1].fenced->mono_ms, 11.2);
  EXPECT_EQ(f[1].routes_pushed->mono_ms, 11.4);
}

TEST(FailoverTimingsTest, StepsDoNotCrossARestartOrTheNextFailover) {
  std::vector<Event> events = Logged({
      E("detected", "n1", 2, 10),
      E("detected", "n2", 3, 11),
      E("fenced", "n1", 3, 12),  // not n1's first failover's fence: another began
      E("routes_pushed", "", 3, 12.5),
      E("detected", "n3", 4, 20),
      E("controller_started", "", 4, 1),  // a new process: another monotonic clock
      E("fenced", "n3", 5, 2),
      E("routes_pushed", "", 5, 3),
      E("routers_acked", "", 5, 4),
  });
  std::vector<FailoverTiming> f = FailoverTimings(events);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_FALSE(f[0].fenced);
  EXPECT_FALSE(f[0].routes_pushed);
  EXPECT_EQ(f[1].routes_pushed->mono_ms, 12.5);
  EXPECT_FALSE(f[2].fenced || f[2].routes_pushed || f[2].routers_acked);
}

TEST(EventLogTest, NewestAreTheLastOnes) {
  EventLog log(100);
  for (int i = 0; i < 10; ++i) log.Append(E("x", "", 1, i));
  std::vector<Event> last = log.Newest(3);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_EQ(last.front().id, 8);
  EXPECT_EQ(last.back().id, 10);
  EXPECT_EQ(log.Newest(50).size(), 10u);
}

// A killed server: the router's refused connection is hinted at once, the
// agent's failed probe comes 85 ms later and the failover follows it. The
// fault was first seen by the router; a hint of another node, one older than
// the window or one before the node's previous failover is not this fault's.
TEST(FailoverTimingsTest, ARoutersEarlierSightingIsWhenTheFaultWasSeen) {
  std::vector<FailoverTiming> f = FailoverTimings(Logged({
      E("router_hint", "n2", 1, 100),
      E("detected", "n2", 2, 200),      // n2's previous failover
      E("router_hint", "n2", 2, 5000),  // over the window before the next
      E("router_hint", "n1", 2, 9900),  // another node
      E("router_hint", "n2", 2, 9910),  // the router's sighting
      E("router_hint", "n2", 2, 9930),  // a second router, later
      E("fault_seen", "n2", 3, 9995),   // the agent's failed probe
      E("detected", "n2", 3, 9995.1),
      E("detected", "n3", 4, 12000),  // no hint: none
      E("fault_seen", "n4", 5, 12050),
      E("router_hint", "n4", 5, 12090),  // after the agent's: the agent's
      E("detected", "n4", 5, 12100),
  }));
  ASSERT_EQ(f.size(), 4u);
  ASSERT_TRUE(f[0].fault_seen);
  EXPECT_EQ(f[0].fault_seen->mono_ms, 100);  // a hint of the same node, inside the window
  ASSERT_TRUE(f[1].fault_seen);
  EXPECT_EQ(f[1].fault_seen->type, "router_hint");
  EXPECT_NEAR(f[1].detected.unix_ms - f[1].fault_seen->unix_ms, 85.1, 0.01);
  EXPECT_FALSE(f[2].fault_seen);
  ASSERT_TRUE(f[3].fault_seen);
  EXPECT_EQ(f[3].fault_seen->type, "fault_seen");
}

// A hint before the node's previous failover, or before the controller
// restarted, is not this fault's, however close; an agent whose clock runs
// ahead (its sighting after `detected`) loses to the router's.
TEST(FailoverTimingsTest, AHintIsNotSoughtPastThePreviousFailoverOrARestart) {
  std::vector<FailoverTiming> f = FailoverTimings(Logged({
      E("router_hint", "n1", 1, 100),
      E("detected", "n1", 2, 200),
      E("detected", "n1", 3, 900),  // 800 ms later: inside the window, but the hint was the first's
      E("router_hint", "n2", 3, 1000),
      E("controller_started", "", 3, 1100),
      E("detected", "n2", 4, 1200),
      E("router_hint", "n3", 4, 1300),
      E("fault_seen", "n3", 5, 1450),  // the agent's clock, 50 ms ahead of the controller's
      E("detected", "n3", 5, 1400),
  }));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_TRUE(f[0].fault_seen);
  EXPECT_FALSE(f[1].fault_seen);
  EXPECT_FALSE(f[2].fault_seen);
  ASSERT_TRUE(f[3].fault_seen);
  EXPECT_EQ(f[3].fault_seen->type, "router_hint");
}

TEST(FailoverTimingsTest, MissingStepsStayEmpty) {
  std::vector<FailoverTiming> f = FailoverTimings(Logged({E("detected", "n1", 2, 10)}));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].fenced || f[0].routes_pushed || f[0].routers_acked || f[0].fault_seen);
}

}  // namespace
}  // namespace gpuha::controller

namespace gpuha::controller {
namespace {

// The bucket counts of one step's histogram, read back from the exposition.
std::string Exposition(const FailoverStepHistograms& h) {
  common::PromText p;
  h.AppendTo(&p);
  return p.str();
}

TEST(FailoverStepHistogramsTest, EachStepOfEachFailoverCountsOnce) {
  FailoverStepHistograms h;
  std::vector<Event> first = {E("fault_seen", "n2", 2, 9), E("detected", "n2", 2, 10),
                              E("fenced", "n2", 2, 11)};
  std::vector<Event> events = Logged(first);
  h.Observe(FailoverTimings(events));
  h.Observe(FailoverTimings(events));  // a second scrape of the same events
  std::string text = Exposition(h);
  EXPECT_NE(
      text.find("gpuha_controller_failover_step_seconds_count{step=\"detected_to_fenced\"} 1\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("gpuha_controller_failover_step_seconds_bucket{step=\"detected_to_fenced\","
                      "le=\"0.001\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("gpuha_controller_failover_step_seconds_count{step=\"fault_to_detected\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find(
          "gpuha_controller_failover_step_seconds_count{step=\"detected_to_routers_acked\"} 0\n"),
      std::string::npos);
  // The routes and the acknowledgement come later: counted then, the fence not again.
  first.push_back(E("routes_pushed", "", 2, 40));
  first.push_back(E("routers_acked", "", 2, 310));
  h.Observe(FailoverTimings(Logged(first)));
  text = Exposition(h);
  EXPECT_NE(
      text.find("gpuha_controller_failover_step_seconds_count{step=\"detected_to_fenced\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("gpuha_controller_failover_step_seconds_bucket{step=\"detected_to_routers_acked\","
                "le=\"0.25\"} 0\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("gpuha_controller_failover_step_seconds_bucket{step=\"detected_to_routers_acked\","
                "le=\"0.5\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find(
          "gpuha_controller_failover_step_seconds_sum{step=\"detected_to_routers_acked\"} 0.3\n"),
      std::string::npos);
}

TEST(FailoverStepHistogramsTest, FailoversRestoredAtRecoveryAreNotCountedAgain) {
  FailoverStepHistograms h;
  std::vector<Event> restored = Logged({E("detected", "n2", 2, 10), E("fenced", "n2", 2, 11)});
  h.Skip(FailoverTimings(restored));
  h.Observe(FailoverTimings(restored));
  EXPECT_NE(Exposition(h).find(
                "gpuha_controller_failover_step_seconds_count{step=\"detected_to_fenced\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace gpuha::controller
