#include "plan/interactive.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace gpuha::plan {
namespace {

using ::testing::HasSubstr;

TEST(InteractiveTest, DefaultsAndAnswersBuildAnInput) {
  // stateless, zero-downtime, tolerance, restart, vm-ha, sharing, budget, san,
  // gpu, nodes, gpus/node, streams/gpu, k, target, buffer, 4 x facilities.
  std::istringstream in("yes\n\n\n\n\n\nyes\niscsi\nL4\n4\n\n10\n\n25\ngpu\n\n\n\n\n");
  std::ostringstream out;
  absl::StatusOr<PlanInput> p = AskPlanInput(in, out);
  ASSERT_TRUE(p.ok()) << p.status() << "\n" << out.str();
  EXPECT_TRUE(p->workload.stateless);
  EXPECT_FALSE(p->policy.gpu_sharing);
  EXPECT_TRUE(p->policy.budget_constrained);
  EXPECT_EQ(p->san, SanType::kIscsi);
  EXPECT_EQ(p->cluster.nodes, 4);
  EXPECT_EQ(p->cluster.target_streams, 25);
  EXPECT_EQ(p->cluster.buffer_node, BufferNode::kGpu);
  EXPECT_TRUE(p->defaults_applied.empty());
}

TEST(InteractiveTest, BadAnswerIsExplainedAndAskedAgain) {
  std::istringstream in("perhaps\nno\n\n\n\n\n\n\n\nL4\nthree\n3\n\n10\n\n\n20\n\n\n\n\n\n");
  std::ostringstream out;
  absl::StatusOr<PlanInput> p = AskPlanInput(in, out);
  ASSERT_TRUE(p.ok()) << p.status() << "\n" << out.str();
  EXPECT_THAT(out.str(), HasSubstr("'perhaps': answer yes or no"));
  EXPECT_THAT(out.str(), HasSubstr("'three' is not a whole number"));
  EXPECT_THAT(out.str(), HasSubstr("an answer is required"));  // target has no default
  EXPECT_FALSE(p->workload.stateless);
  EXPECT_EQ(p->cluster.nodes, 3);
}

TEST(InteractiveTest, UnknownGpuAsksForTdp) {
  std::istringstream in("yes\n\n\n\n\n\n\n\nB300X\n1100\n\n\n\n\n20\n\n\n\n\n\n");
  std::ostringstream out;
  absl::StatusOr<PlanInput> p = AskPlanInput(in, out);
  ASSERT_TRUE(p.ok()) << p.status() << "\n" << out.str();
  EXPECT_EQ(p->cluster.tdp_watts, 1100);
}

TEST(InteractiveTest, EndOfInputIsAnError) {
  std::istringstream in("yes\nno\n");
  std::ostringstream out;
  absl::StatusOr<PlanInput> p = AskPlanInput(in, out);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("ended before every question was answered"));
}

}  // namespace
}  // namespace gpuha::plan
