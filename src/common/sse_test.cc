#include "common/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpuha::common {
namespace {

std::vector<std::string> FeedAll(SseSplitter& s, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& p : pieces) {
    EXPECT_TRUE(s.Feed(p, [&](std::string_view e) { out.emplace_back(e); }));
  }
  return out;
}

TEST(SseTest, WholeEventsOnlyWhateverTheSplit) {
  const std::string stream =
      "data: {\"a\":1}\n\n: keep-alive\n\ndata: x\r\n\r\nevent: error\ndata: l1\ndata: l2\n\n"
      "data: partial";
  // Every split point gives the same events, and the partial one is held.
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseSplitter s;
    auto events = FeedAll(s, {stream.substr(0, cut), stream.substr(cut)});
    ASSERT_EQ(events.size(), 4u) << cut;
    EXPECT_EQ(events[0], "data: {\"a\":1}\n\n");
    EXPECT_EQ(events[2], "data: x\r\n\r\n");
    EXPECT_EQ(s.pending(), std::string("data: partial").size());
  }
  SseSplitter one_by_one;
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(FeedAll(one_by_one, bytes).size(), 4u);
}

TEST(SseTest, FieldsDataLinesAndComments) {
  SseEvent e = ParseSseEvent("event: error\ndata: l1\ndata:l2\r\nid: 7\n\n");
  EXPECT_EQ(e.event, "error");
  EXPECT_EQ(e.data, "l1\nl2");
  EXPECT_FALSE(e.comment_only);
  EXPECT_TRUE(ParseSseEvent(": ping\n\n").comment_only);
  EXPECT_EQ(ParseSseEvent("data: [DONE]\n\n").data, "[DONE]");
}

TEST(SseTest, AnEventOverTheLimitStopsTheSplitter) {
  SseSplitter s(16);
  int n = 0;
  EXPECT_TRUE(s.Feed("data: ok\n\n", [&](std::string_view) { ++n; }));
  EXPECT_FALSE(s.Feed("data: 0123456789abcdef", [&](std::string_view) { ++n; }));
  EXPECT_FALSE(s.Feed("\n\n", [&](std::string_view) { ++n; }));
  EXPECT_EQ(n, 1);
}

TEST(SseTest, StrayBlankLinesAreNotEvents) {
  SseSplitter s;
  auto events = FeedAll(s, {"\n\r\n\ndata: a\n\n\n"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "data: a\n\n");
}

}  // namespace
}  // namespace gpuha::common
