#include "demo/timeline.h"

#include <gtest/gtest.h>

namespace gpuha::demo {
namespace {

using api::Event;

Event E(int64_t id, const std::string& type, const std::string& node, double unix_ms) {
  return Event{.id = id, .unix_ms = unix_ms, .type = type, .node = node, .epoch = 2};
}

TEST(TimelineTest, StepsAreMillisecondsAfterTheInjection) {
  const int64_t t0 = 1'000'000'000'000'000;  // unix ns; 1e9 ms
  std::vector<Event> events = {
      E(1, "detected", "gpu-1", 1e9 + 1),  // another node's failover
      E(2, "routes_pushed", "", 1e9 + 2),  E(3, "detected", "gpu-2", 1e9 + 40),
      E(4, "fenced", "gpu-2", 1e9 + 40.5), E(5, "routes_pushed", "", 1e9 + 41),
      E(6, "routers_acked", "", 1e9 + 43),
  };
  FaultTimeline t;
  ControllerSteps(events, "gpu-2", t0, &t);
  ASSERT_TRUE(t.detected_ms && t.fenced_ms && t.routes_pushed_ms && t.routers_acked_ms);
  EXPECT_DOUBLE_EQ(*t.detected_ms, 40);
  EXPECT_DOUBLE_EQ(*t.fenced_ms, 40.5);
  EXPECT_DOUBLE_EQ(*t.routes_pushed_ms, 41);
  EXPECT_DOUBLE_EQ(*t.routers_acked_ms, 43);
  EXPECT_EQ(t.routes_before_fence, false);  // a crash: fenced first
}

TEST(TimelineTest, ADrainPushesRoutesBeforeItFences) {
  FaultTimeline t;
  ControllerSteps(
      {E(1, "detected", "gpu-2", 10), E(2, "routes_pushed", "", 11), E(3, "fenced", "gpu-2", 12)},
      "gpu-2", 0, &t);
  EXPECT_EQ(t.routes_before_fence, true);
}

TEST(TimelineTest, NoFailoverOfTheNodeLeavesTheStepsEmpty) {
  FaultTimeline t;
  ControllerSteps({E(1, "detected", "gpu-1", 5)}, "gpu-2", 0, &t);
  EXPECT_FALSE(t.detected_ms || t.fenced_ms || t.routes_pushed_ms || t.routers_acked_ms);
  ControllerSteps({}, "gpu-2", 0, &t);
  EXPECT_FALSE(t.detected_ms);
}

}  // namespace
}  // namespace gpuha::demo
