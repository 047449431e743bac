#include "controller/job.h"

#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using placement::Role;

TEST(PickJobNodeTest, AFirstPlacementGoesToAnActiveNodeWithTheGpusFree) {
  const std::vector<JobCandidate> nodes = {{"buffer-1", 8, Role::kBuffer},
                                           {"passive-1", 8, Role::kPassive},
                                           {"active-1", 1, Role::kActive},
                                           {"active-2", 4, Role::kActive},
                                           {"active-3", 4, Role::kActive}};
  // Ties go to the first listed (the controller lists nodes by name).
  EXPECT_EQ(PickJobNode(nodes, 2, /*move=*/false, ""), "active-2");
  EXPECT_EQ(PickJobNode(nodes, 1, false, ""), "active-1");
  // No active node has 6 free: passive before buffer.
  EXPECT_EQ(PickJobNode(nodes, 6, false, ""), "passive-1");
  EXPECT_EQ(PickJobNode(nodes, 9, false, ""), "");
  EXPECT_EQ(PickJobNode({}, 1, false, ""), "");
}

// A job moved off a failed node goes where that node's work went (the node
// that took its place), then to spare capacity: passive, buffer, and an
// active node last, whose GPUs serve its own streams.
TEST(PickJobNodeTest, AMoveGoesToTheNodeThatTookItsNodesPlaceThenToSpares) {
  const std::vector<JobCandidate> nodes = {{"active-1", 8, Role::kActive},
                                           {"buffer-1", 8, Role::kBuffer},
                                           {"passive-1", 2, Role::kPassive},
                                           {"passive-2", 8, Role::kActive}};  // promoted
  EXPECT_EQ(PickJobNode(nodes, 4, /*move=*/true, "passive-2"), "passive-2");
  EXPECT_EQ(PickJobNode(nodes, 2, true, ""), "passive-1");
  EXPECT_EQ(PickJobNode(nodes, 4, true, ""), "buffer-1");
  // The preferred node without the GPUs free: the next best.
  EXPECT_EQ(PickJobNode(nodes, 4, true, "passive-1"), "buffer-1");
  EXPECT_EQ(PickJobNode({{"active-1", 8, Role::kActive}}, 4, true, "gone"), "active-1");
}

}  // namespace
}  // namespace gpuha::controller
