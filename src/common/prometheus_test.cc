#include "common/prometheus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <regex>
#include <string>

namespace gpuha::common {
namespace {

using ::testing::HasSubstr;

double Value(const std::string& text, const std::string& name) {
  std::smatch m;
  std::regex re("\n" + name + " ([0-9.e+]+)\n");
  std::string padded = "\n" + text;
  if (!std::regex_search(padded, m, re)) return -1;
  return std::stod(m[1]);
}

TEST(PromTextTest, ProcessFamiliesSayWhatRunsAndWhatItCosts) {
  PromText p;
  AppendProcessFamilies("router", &p);
  const std::string& t = p.str();
  EXPECT_THAT(t, HasSubstr("gpuha_build_info{component=\"router\",version=\""));
  EXPECT_THAT(t, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_GT(Value(t, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Value(t, "process_virtual_memory_bytes"), Value(t, "process_resident_memory_bytes"));
  EXPECT_GE(Value(t, "process_open_fds"), 3);  // stdin, stdout, stderr at least
  EXPECT_GE(Value(t, "process_max_fds"), Value(t, "process_open_fds"));
  EXPECT_GE(Value(t, "process_cpu_seconds_total"), 0);
  // Started within the last day, and not in the future.
  const double start = Value(t, "process_start_time_seconds");
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 86400);
}

TEST(PromTextTest, HistogramBucketsAreCumulativeWithInfCountAndSum) {
  PromText p;
  const double bounds[] = {0.1, 1};
  const uint64_t counts[] = {2, 0, 3};  // two under 0.1 s, three over 1 s
  p.Histogram("h_seconds", {{"t", "x"}}, bounds, counts, 2, 7.5);
  EXPECT_EQ(p.str(),
            "h_seconds_bucket{t=\"x\",le=\"0.1\"} 2\n"
            "h_seconds_bucket{t=\"x\",le=\"1\"} 2\n"
            "h_seconds_bucket{t=\"x\",le=\"+Inf\"} 5\n"
            "h_seconds_sum{t=\"x\"} 7.5\n"
            "h_seconds_count{t=\"x\"} 5\n");
}

}  // namespace
}  // namespace gpuha::common
