#include "common/yaml_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::common {
namespace {

using ::testing::HasSubstr;

YamlDocument Load(absl::string_view text) {
  absl::StatusOr<YamlDocument> doc = YamlDocument::LoadString(text, "t.yaml");
  EXPECT_TRUE(doc.ok()) << doc.status();
  return *std::move(doc);
}

TEST(YamlMapTest, ReadsTypedValuesFromNestedMaps) {
  YamlDocument doc = Load("a: { n: 3, x: 1.5, b: yes, s: L4 }\nlist: [p, q]\n");
  YamlMap root = doc.Root();
  YamlMap a = root.Map("a");
  EXPECT_EQ(a.Int("n"), 3);
  EXPECT_EQ(a.Number("x"), 1.5);
  EXPECT_EQ(a.Bool("b"), true);
  EXPECT_EQ(a.String("s"), "L4");
  EXPECT_EQ(root.StringList("list"), (std::vector<std::string>{"p", "q"}));
  EXPECT_TRUE(root.Finish().ok());
}

TEST(YamlMapTest, WrongTypeNamesFieldLineAndValue) {
  YamlDocument doc = Load("cluster:\n  nodes: three\n");
  YamlMap root = doc.Root();
  EXPECT_EQ(root.Map("cluster").Int("nodes"), std::nullopt);
  absl::Status s = root.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("t.yaml:2:10: cluster.nodes: expected an integer, got 'three'"));
}

TEST(YamlMapTest, FractionIsNotAnInteger) {
  YamlDocument doc = Load("n: 2.5\n");
  YamlMap root = doc.Root();
  EXPECT_EQ(root.Int("n"), std::nullopt);
  EXPECT_THAT(root.Finish().message(), HasSubstr("n: expected an integer, got '2.5'"));
}

TEST(YamlMapTest, UnknownKeyIsReportedWithSuggestion) {
  YamlDocument doc = Load("cluster:\n  nodes: 3\n  nodse: 4\n");
  YamlMap root = doc.Root();
  root.Map("cluster").Int("nodes");
  absl::Status s = root.Finish();
  EXPECT_THAT(s.message(),
              HasSubstr("t.yaml:3:3: cluster.nodse: unknown key (did you mean 'nodes'?)"));
}

TEST(YamlMapTest, UnknownTopLevelKeyListsKnownKeys) {
  YamlDocument doc = Load("alpha: 1\nzzzzzz: 2\n");
  YamlMap root = doc.Root();
  root.Int("alpha");
  EXPECT_THAT(root.Finish().message(), HasSubstr("zzzzzz: unknown key; known keys here: alpha"));
}

TEST(YamlMapTest, MissingRequiredFieldIsNamed) {
  YamlDocument doc = Load("cluster: {}\n");
  YamlMap root = doc.Root();
  root.Map("cluster").Require("nodes");
  EXPECT_THAT(root.Finish().message(), HasSubstr("cluster.nodes: is required but missing"));
}

TEST(YamlMapTest, EnumRejectsValueOutsideSet) {
  YamlDocument doc = Load("san: nfs\n");
  YamlMap root = doc.Root();
  EXPECT_EQ(root.Enum("san", {"none", "fc", "iscsi"}), std::nullopt);
  EXPECT_THAT(root.Finish().message(), HasSubstr("san: 'nfs' is not one of: none, fc, iscsi"));
}

TEST(YamlMapTest, SyntaxErrorNamesLine) {
  absl::StatusOr<YamlDocument> doc = YamlDocument::LoadString("a: [1, 2\nb: 3\n", "bad.yaml");
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(doc.status().message(), HasSubstr("bad.yaml:"));
  EXPECT_THAT(doc.status().message(), HasSubstr("not valid YAML"));
}

TEST(YamlMapTest, NonMappingTopLevelIsAnError) {
  YamlDocument doc = Load("just some words\n");
  YamlMap root = doc.Root();
  EXPECT_THAT(root.Finish().message(), HasSubstr("expected a mapping at the top level"));
}

TEST(YamlMapTest, DuplicateKeyIsAnError) {
  YamlDocument doc = Load("a: 1\na: 2\n");
  YamlMap root = doc.Root();
  EXPECT_THAT(root.Finish().message(), HasSubstr("t.yaml:2:1: a: duplicate key"));
}

TEST(YamlMapTest, FirstErrorWins) {
  YamlDocument doc = Load("a: x\nb: y\n");
  YamlMap root = doc.Root();
  root.Int("a");
  root.Int("b");
  absl::Status s = root.Finish();
  EXPECT_THAT(s.message(), HasSubstr("a: expected an integer"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("b:")));
}

TEST(YamlMapTest, FailPointsAtValueLine) {
  YamlDocument doc = Load("x: 1\nnodes: -4\n");
  YamlMap root = doc.Root();
  root.Int("x");
  root.Int("nodes");
  root.Fail("nodes", "must be at least 1");
  EXPECT_THAT(root.Finish().message(), HasSubstr("t.yaml:2:8: nodes: must be at least 1"));
}

TEST(YamlMapTest, EmptyDocumentIsEmptyMap) {
  YamlDocument doc = Load("");
  YamlMap root = doc.Root();
  EXPECT_FALSE(root.Has("a"));
  EXPECT_TRUE(root.Finish().ok());
}

TEST(YamlMapTest, MapListReadsEachItem) {
  YamlDocument doc = Load("faults:\n  - { at: 1 }\n  - { at: 2, typo: 3 }\n");
  YamlMap root = doc.Root();
  std::vector<YamlMap> items = root.MapList("faults");
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].Int("at"), 1);
  EXPECT_EQ(items[1].Int("at"), 2);
  EXPECT_THAT(root.Finish().message(), HasSubstr("faults[1].typo: unknown key"));
}

}  // namespace
}  // namespace gpuha::common
