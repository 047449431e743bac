#include "common/query.h"

#include <gtest/gtest.h>

namespace gpuha::common {
namespace {

TEST(QueryTest, PathIsEverythingBeforeTheQuestionMark) {
  EXPECT_EQ(TargetPath("/v2/models/cv/infer?delay_ms=5"), "/v2/models/cv/infer");
  EXPECT_EQ(TargetPath("/metrics"), "/metrics");
  EXPECT_EQ(TargetPath("?x=1"), "");
}

TEST(QueryTest, ParametersAreSplitAndDecoded) {
  QueryParams q = QueryParams::FromTarget("/x?after=12&name=a%20b+c&flag&empty=&after=99#frag");
  EXPECT_EQ(q.Get("after"), "12");  // the first of a repeated key
  EXPECT_EQ(q.Get("name"), "a b c");
  EXPECT_EQ(q.Get("flag"), "");
  EXPECT_EQ(q.Get("empty"), "");
  EXPECT_FALSE(q.Get("missing"));
  EXPECT_EQ(q.all().size(), 5u);
  EXPECT_TRUE(QueryParams::FromTarget("/x").all().empty());
  EXPECT_TRUE(QueryParams::FromTarget("/x?").all().empty());
}

TEST(QueryTest, BrokenEscapesAreKeptAsTheyAre) {
  QueryParams q = QueryParams::Parse("a=100%&b=%zz&c=%4");
  EXPECT_EQ(q.Get("a"), "100%");
  EXPECT_EQ(q.Get("b"), "%zz");
  EXPECT_EQ(q.Get("c"), "%4");
}

TEST(QueryTest, IntegersAreCheckedAndBadOnesNameTheKey) {
  QueryParams q = QueryParams::Parse("n=42&bad=4x&neg=-3");
  EXPECT_EQ(**q.Int("n"), 42);
  EXPECT_EQ(**q.Int("neg"), -3);
  EXPECT_FALSE(q.Int("missing")->has_value());
  EXPECT_EQ(q.Int("bad").status().message(), "bad: '4x' is not an integer");
}

}  // namespace
}  // namespace gpuha::common
