#include "cli/ctl_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace gpuha::cli {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr double kNow = 1764689958123.0;  // 2025-12-02T15:39:18.123Z

TEST(CtlFormatTest, TimesAreRfc3339InUtcToTheMillisecond) {
  EXPECT_EQ(FormatTime(kNow), "2025-12-02T15:39:18.123Z");
  EXPECT_EQ(FormatTime(0), "1970-01-01T00:00:00.000Z");
}

TEST(CtlFormatTest, AgesAreFlooredToOneUnit) {
  EXPECT_EQ(FormatAge(kNow, kNow), "now");
  EXPECT_EQ(FormatAge(kNow - 12'900, kNow), "12s ago");
  EXPECT_EQ(FormatAge(kNow - 3 * 60'000 - 59'000, kNow), "3m ago");
  EXPECT_EQ(FormatAge(kNow - 2 * 3'600'000, kNow), "2h ago");
  EXPECT_EQ(FormatAge(kNow - 4 * 86'400'000.0, kNow), "4d ago");
  EXPECT_EQ(FormatAge(kNow + 5'000, kNow), "in 5s");  // another machine's clock ahead
}

TEST(CtlFormatTest, DurationsAreRoundedForPeople) {
  EXPECT_EQ(FormatDurationMs(0.42), "0.4ms");
  EXPECT_EQ(FormatDurationMs(85.3999), "85ms");
  EXPECT_EQ(FormatDurationMs(1234), "1.2s");
  EXPECT_EQ(FormatDurationMs(185'000), "3m05s");
  EXPECT_EQ(FormatDurationMs(7'800'000), "2h10m");
  EXPECT_EQ(FormatDurationMs(-3), "-3.0ms");
  // A field that is not a time or a duration prints as such, not as garbage.
  EXPECT_EQ(FormatDurationMs(1e300), "-");
  EXPECT_EQ(FormatTime(1e300), "-");
  EXPECT_EQ(FormatAge(-1e300, kNow), "-");
}

TEST(CtlFormatTest, CellsShowBooleansNullsListsAndNoFloatNoise) {
  EXPECT_EQ(FormatCell(true, CellKind::kText, kNow), "yes");
  EXPECT_EQ(FormatCell(json(), CellKind::kTime, kNow), "-");
  EXPECT_EQ(FormatCell(12.300000001, CellKind::kText, kNow), "12.3");
  EXPECT_EQ(FormatCell(4.0, CellKind::kText, kNow), "4");
  EXPECT_EQ(
      FormatCell(json::array({{{"code", "xid79"}}, {{"code", "nic_down"}}}), CellKind::kList, kNow),
      "xid79,nic_down");
  EXPECT_EQ(FormatCell(json::array(), CellKind::kList, kNow), "-");
  // A field of an unexpected type prints as JSON rather than failing.
  EXPECT_EQ(FormatCell("soon", CellKind::kDuration, kNow), "soon");
}

// Text from the API is shown, not obeyed: an escape sequence in an event's
// detail cannot recolour or clear the operator's terminal.
TEST(CtlFormatTest, ControlCharactersAreShownEscaped) {
  const std::string hostile = "xid \x1b[2J\x1b[31mgone\r\n\x7f";
  EXPECT_EQ(Printable(hostile), "xid \\x1b[2J\\x1b[31mgone\\x0d\\x0a\\x7f");
  EXPECT_EQ(FormatCell(hostile, CellKind::kText, kNow), Printable(hostile));
  EXPECT_EQ(FormatCell(json::array({hostile}), CellKind::kList, kNow), Printable(hostile));
  std::string table =
      RenderTable(json::array({{{"detail", hostile}}}), {{"detail", "detail"}}, kNow);
  EXPECT_EQ(table.find('\x1b'), std::string::npos) << table;
  std::string yaml = RenderYaml({{"detail", hostile}});
  EXPECT_EQ(yaml.find('\x1b'), std::string::npos) << yaml;
  EXPECT_EQ(Printable("plain text, ünïcode"), "plain text, ünïcode");
}

TEST(CtlFormatTest, TableColumnsAreAsWideAsTheirWidestCell) {
  json rows = json::array({{{"name", "n1"}, {"at", kNow - 61'000}, {"took", 85}},
                           {{"name", "gpu-long-name"}, {"took", 1500}}});
  std::string t = RenderTable(
      rows,
      {{"name", "name"}, {"age", "at", CellKind::kAge}, {"took", "took", CellKind::kDuration}},
      kNow);
  EXPECT_EQ(t,
            "NAME           AGE     TOOK\n"
            "n1             1m ago  85ms\n"
            "gpu-long-name  -       1.5s\n");
}

TEST(CtlFormatTest, FieldsAlignTheirValues) {
  std::string f = RenderFields({{"name", "n1"}, {"fenced", false}},
                               {{"Name", "name"}, {"Fenced", "fenced"}, {"Missing", "nope"}}, kNow);
  EXPECT_EQ(f, "Name:    n1\nFenced:  no\nMissing: -\n");
}

TEST(CtlFormatTest, YamlReadsBackAsTheSameDocument) {
  json j = {{"name", "n1"},
            {"gpus", json::array({{{"index", 0}, {"power_w", 212.5}}})},
            {"fenced", false},
            {"address", nullptr},
            {"detail", "colon: and # hash"}};
  YAML::Node y = YAML::Load(RenderYaml(j));
  EXPECT_EQ(y["name"].as<std::string>(), "n1");
  EXPECT_EQ(y["gpus"][0]["power_w"].as<double>(), 212.5);
  EXPECT_FALSE(y["fenced"].as<bool>());
  EXPECT_TRUE(y["address"].IsNull());
  EXPECT_EQ(y["detail"].as<std::string>(), "colon: and # hash");
}

TEST(CtlFormatTest, SinceTakesADurationOrAnRfc3339Time) {
  EXPECT_EQ(*ParseSince("10m", kNow), kNow - 600'000);
  EXPECT_EQ(*ParseSince("1h30m", kNow), kNow - 5'400'000);
  EXPECT_EQ(*ParseSince("2025-12-02T15:00:00Z", kNow), 1764687600000.0);
  EXPECT_EQ(*ParseSince("2025-12-02T16:00:00+01:00", kNow), 1764687600000.0);
  for (const char* bad : {"", "10", "yesterday", "-5m", "2025-13-02T00:00:00Z"}) {
    auto s = ParseSince(bad, kNow);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("--since")) << bad;
  }
  EXPECT_THAT(ParseSince("a\nb", kNow).status().message(), HasSubstr("a\\nb"));
}

}  // namespace
}  // namespace gpuha::cli
