#include "common/config_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"

namespace gpuha::common {
namespace {

using ::testing::HasSubstr;

YamlDocument Doc(const std::string& text) { return *YamlDocument::LoadString(text, "t.yaml"); }

TEST(ConfigFieldsTest, MillisInRangeAreReadAndOutOfRangeNameTheField) {
  YamlDocument d = Doc("a_ms: 250\nb_ms: 0\nc_ms: 70000\n");
  YamlMap root = d.Root();
  std::chrono::milliseconds a{1};
  common::Duration b{}, c{};
  ReadMillis(root, "a_ms", &a);
  EXPECT_EQ(a.count(), 250);
  ReadMillis(root, "missing_ms", &a);
  EXPECT_EQ(a.count(), 250);
  ReadMillis(root, "b_ms", &b, {.min = 0});
  EXPECT_EQ(b, common::Duration::zero());
  ReadMillis(root, "c_ms", &c, {.min = 10, .max = 60000});
  EXPECT_THAT(root.Finish().message(),
              HasSubstr("t.yaml:3:7: c_ms: must be between 10 and 60000 ms, got 70000"));
}

TEST(ConfigFieldsTest, ZeroMillisNeedsAnExplicitMinimumOfZero) {
  YamlDocument d = Doc("b_ms: 0\n");
  YamlMap root = d.Root();
  std::chrono::milliseconds b{5};
  ReadMillis(root, "b_ms", &b);
  EXPECT_EQ(b.count(), 5);
  EXPECT_THAT(root.Finish().message(), HasSubstr("b_ms: must be at least 1 ms, got 0"));
}

// Regression: the router rejected upper-case hex and the controller
// accepted it; both now read one rule, and store lower case.
TEST(ConfigFieldsTest, Sha256HexIsReadTheSameWayInEitherCase) {
  std::string lower(64, 'a');
  std::string upper(64, 'A');
  EXPECT_EQ(ParseSha256Hex(lower), lower);
  EXPECT_EQ(ParseSha256Hex(upper), lower);
  EXPECT_FALSE(ParseSha256Hex(std::string(63, 'a')));
  EXPECT_FALSE(ParseSha256Hex(std::string(63, 'a') + "g"));
  EXPECT_FALSE(ParseSha256Hex(""));
  YamlDocument d = Doc("k: " + upper + "\nbad: xyz\n");
  YamlMap root = d.Root();
  EXPECT_EQ(ReadSha256Hex(root, "k"), lower);
  EXPECT_FALSE(ReadSha256Hex(root, "bad"));
  EXPECT_THAT(root.Finish().message(), HasSubstr("bad: 'xyz' is not a hex SHA-256"));
}

}  // namespace
}  // namespace gpuha::common
