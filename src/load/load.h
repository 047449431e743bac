// The load generator behind `gpuha load`: N streams through the router for T
// seconds, open loop (a fixed request rate, so failover gaps show instead of
// being absorbed by a slowed-down client) or closed loop (C clients back to
// back). Every answer is checked; the report counts failures by reason, the
// latency distribution and, per stream, the longest stretch with no answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::load {

struct LoadOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  int streams = 20;
  std::string stream_prefix = "cam-";  // streams are PREFIX0 .. PREFIX{N-1}
  double rate = 1000;                  // requests/s in all; 0: closed loop
  int concurrency = 16;                // closed loop: clients
  std::chrono::milliseconds duration{10000};
  std::chrono::milliseconds timeout{30000};  // per request
  std::string api_key;
  std::string path = "/v2/models/m/infer";  // sent as /streams/ID<path>
  std::string method = "GET";
  std::string body;
  double slow_fraction = 0;   // this share of requests gets slow_query appended
  std::string slow_query;     // e.g. "delay_ms=1500"
  bool progress = true;       // a progress line on stderr every second
};

struct StreamReport {
  std::string stream;
  uint64_t ok = 0;
  uint64_t failed = 0;
  double max_gap_ms = 0;  // longest stretch between answers while load ran
};

struct LoadReport {
  uint64_t sent = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  std::map<std::string, uint64_t> failures;  // reason -> count
  uint64_t slow_sent = 0, slow_ok = 0;
  double p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
  double max_gap_ms = 0;  // worst stream
  double seconds = 0;
  std::vector<StreamReport> streams;
  std::string Json() const;
  std::string Text() const;
};

[[nodiscard]] absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o);

}  // namespace gpuha::load
