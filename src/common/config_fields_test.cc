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

TEST(ConfigFieldsTest, TlsCertAndKeyComeTogetherAndTheRuleDecidesTheCa) {
  {
    YamlDocument d = Doc("tls: { ca: c.pem, cert: a.pem, key: a.key }\n");
    YamlMap root = d.Root();
    TlsFiles f = ReadTlsFiles(root.Map("tls"), {.ca_needs_cert = true});
    EXPECT_EQ(f.ca, "c.pem");
    EXPECT_EQ(f.cert, "a.pem");
    EXPECT_EQ(f.key, "a.key");
    EXPECT_TRUE(root.Finish().ok());
  }
  {
    YamlDocument d = Doc("tls:\n  cert: a.pem\n");
    YamlMap root = d.Root();
    ReadTlsFiles(root.Map("tls"));
    EXPECT_THAT(root.Finish().message(), HasSubstr("t.yaml:2:3: tls.key: cert and key come"));
  }
  {
    YamlDocument d = Doc("tls: { ca: c.pem }\n");
    YamlMap root = d.Root();
    ReadTlsFiles(root.Map("tls"), {.ca_needs_cert = true});
    EXPECT_THAT(root.Finish().message(), HasSubstr("tls.cert: a ca (verifying peers) needs"));
  }
  {
    YamlDocument d = Doc("up: { cert: a.pem, key: a.key }\n");
    YamlMap root = d.Root();
    ReadTlsFiles(root.Map("up"), {.ca_required = true});
    EXPECT_THAT(root.Finish().message(), HasSubstr("up.ca: needs the CA"));
  }
  {
    YamlDocument d = Doc("tls: { ca: c.pem, cert: a.pem, key: a.key }\n");
    YamlMap root = d.Root();
    ReadTlsFiles(root.Map("tls"), {.allow_ca = false});
    EXPECT_THAT(root.Finish().message(), HasSubstr("tls.ca"));  // an unknown key here
  }
}

TEST(ConfigFieldsTest, EnumsReadTheirValueOrListTheAllowedSpellings) {
  enum class Color { kRed, kBlue };
  YamlDocument d = Doc("a: blue\nb: green\n");
  YamlMap root = d.Root();
  EXPECT_EQ(ReadEnum<Color>(root, "a", {{"red", Color::kRed}, {"blue", Color::kBlue}}),
            Color::kBlue);
  EXPECT_FALSE(ReadEnum<Color>(root, "missing", {{"red", Color::kRed}}));
  EXPECT_FALSE(ReadEnum<Color>(root, "b", {{"red", Color::kRed}, {"blue", Color::kBlue}}));
  EXPECT_THAT(root.Finish().message(), HasSubstr("b: 'green' is not one of: red, blue"));
}

}  // namespace
}  // namespace gpuha::common
