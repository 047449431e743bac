// bench/failover: the system-level failover figures of issue 6, each the
// median over N runs of `gpuha demo` (real processes on loopback: controller,
// router, 4 agents with workers, checked KServe load with 2% legitimately
// slow 1.5 s requests).
//
//   failover_bench GPUHA_BINARY [RUNS] [RATE]
//
// Prints a markdown table for bench/RESULTS.md. The peers (nginx and HAProxy
// with a backup server, defaults and tuned) run in bench/router_failover.sh.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "tests/e2e/child_process.h"

using nlohmann::json;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: failover_bench GPUHA_BINARY [RUNS] [RATE]\n");
    return 2;
  }
  std::string gpuha = argv[1];
  int runs = argc > 2 ? std::atoi(argv[2]) : 10;
  std::string rate = argc > 3 ? argv[3] : "400";
  std::map<std::string, std::vector<double>> m;
  std::map<std::string, int> missing;  // runs in which a step was not seen
  std::string dir = "/tmp/gpuha-failover-bench";
  std::filesystem::create_directories(dir);
  for (int i = 0; i < runs; ++i) {
    std::string report = dir + "/run-" + std::to_string(i) + ".json";
    gpuha::e2e::ChildProcess demo({gpuha, "demo", "--faults",
                                   "crash,xid79,thermal,agent-hang,server-hang", "--rate", rate,
                                   "--slow-fraction", "0.02", "--json", report});
    auto rc = demo.Wait(std::chrono::minutes(5));
    auto text = gpuha::common::ReadFile(report);
    if (!rc || !text.ok()) {
      std::fprintf(stderr, "run %d failed:\n%s\n", i, demo.err().c_str());
      return 1;
    }
    json r = json::parse(*text);
    double lossless_failed = 0, hang_failed = 0, hang_gap = 0;
    for (const json& f : r["faults"]) {
      std::string name = f["fault"];
      auto num = [&](const char* k) { return f[k].is_null() ? 0.0 : f[k].get<double>(); };
      // A step the demo did not see in its window is left out, and counted.
      auto timed = [&](const std::string& measure, const char* k) {
        if (f[k].is_null()) {
          missing[measure]++;
        } else {
          m[measure].push_back(f[k].get<double>());
        }
      };
      if (name == "crash") {
        timed("crash detected (ms)", "detected_ms");
        timed("crash: first request served by the standby (ms)", "first_standby_ms");
      }
      if (name == "agent-hang") timed("hung agent detected (ms)", "detected_ms");
      if (name == "server-hang") {
        timed("hung server: detected by the controller (ms)", "detected_ms");
        timed("hung server: first request served by the standby (ms)", "first_standby_ms");
      }
      if (name == "crash" || name == "xid79" || name == "thermal") {
        lossless_failed += num("failed");
      } else {
        hang_failed += num("failed");
        hang_gap = std::max(hang_gap, num("max_gap_ms"));
      }
    }
    m["failed requests across crash, XID 79 and thermal drain"].push_back(lossless_failed);
    m["requests lost when a node hangs (agent or server SIGSTOP)"].push_back(hang_failed);
    m["longest stretch with no answer on a hung node's stream (ms)"].push_back(hang_gap);
    m["slow (1.5 s) requests cut"].push_back(r["load"]["slow_sent"].get<double>() -
                                             r["load"]["slow_ok"].get<double>());
    m["requests per run"].push_back(r["load"]["sent"].get<double>());
    std::fprintf(stderr, "run %d/%d: lost %s\n", i + 1, runs, r["lost"].dump().c_str());
  }
  std::printf("| measure | runs | median | min | max |\n|---|---|---|---|---|\n");
  for (const auto& [name, v] : m) {
    std::printf("| %s | %zu of %d | %.1f | %.1f | %.1f |\n", name.c_str(), v.size(), runs,
                Median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  }
  for (const auto& [name, n] : missing) {
    if (m.count(name) == 0) std::printf("| %s | 0 of %d | - | - | - |\n", name.c_str(), runs);
  }
  return 0;
}
