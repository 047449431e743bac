#include "controller/join_tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/net_util.h"

namespace gpuha::controller {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(JoinTokensTest, NoneAskedLetsEveryoneIn) {
  JoinTokens tokens("");
  EXPECT_TRUE(tokens.Check("gpu-1", "", "10.0.0.1", common::TimePoint{}).ok());
}

TEST(JoinTokensTest, TheRightTokenJoinsAndAWrongOneNamesTheNode) {
  JoinTokens tokens(common::Sha256Hex("s3cret"));
  const common::TimePoint t0{};
  EXPECT_TRUE(tokens.Check("gpu-1", "s3cret", "10.0.0.1", t0).ok());
  absl::Status wrong = tokens.Check("gpu-1", "guess", "10.0.0.1", t0);
  EXPECT_TRUE(absl::IsPermissionDenied(wrong)) << wrong;
  EXPECT_THAT(wrong.message(), HasSubstr("node 'gpu-1': the join token is wrong"));
  absl::Status missing = tokens.Check("gpu\n1", "", "10.0.0.1", t0);
  EXPECT_THAT(missing.message(), HasSubstr("node 'gpu\\n1': the join token is missing"));
}

TEST(JoinTokensTest, ASourcePastItsWrongTokensIsRefusedUncheckedForTheRestOfTheSecond) {
  JoinTokens tokens(common::Sha256Hex("s3cret"));
  const common::TimePoint t0{};
  for (int i = 0; i < JoinTokens::kMaxWrongPerSecond; ++i) {
    EXPECT_TRUE(absl::IsPermissionDenied(tokens.Check("gpu-1", "guess", "10.0.0.1", t0)));
  }
  // Even the right token is not checked now; another source is.
  absl::Status held = tokens.Check("gpu-1", "s3cret", "10.0.0.1", t0 + milliseconds(999));
  EXPECT_TRUE(absl::IsResourceExhausted(held)) << held;
  EXPECT_THAT(held.message(), HasSubstr("too many wrong join tokens from 10.0.0.1"));
  EXPECT_TRUE(tokens.Check("gpu-2", "s3cret", "10.0.0.2", t0).ok());
  // An unknown source is never throttled.
  for (int i = 0; i < 2 * JoinTokens::kMaxWrongPerSecond; ++i) {
    EXPECT_TRUE(absl::IsPermissionDenied(tokens.Check("gpu-3", "guess", "", t0)));
  }
  // The next second counts afresh.
  EXPECT_TRUE(tokens.Check("gpu-1", "s3cret", "10.0.0.1", t0 + milliseconds(1000)).ok());
}

}  // namespace
}  // namespace gpuha::controller
