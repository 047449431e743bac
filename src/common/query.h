// QueryParams: the parameters of a request target's query string
// (RFC 3986 section 3.4, application/x-www-form-urlencoded: '&'-separated
// key=value pairs, '+' for a space, %XX escapes). One parser for the
// controller's API, the worker and the test backend.
//
//   QueryParams q = QueryParams::FromTarget("/api/v1/events?after=12&x=a%20b");
//   absl::StatusOr<std::optional<int64_t>> after = q.Int("after");  // 12
//   q.Get("x");                                                     // "a b"
//   TargetPath("/v2/models/cv/infer?delay_ms=5");                   // "/v2/models/cv/infer"
//
// A key given twice keeps its first value. Thread-safety: immutable once made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpuha::common {

// The path of a request target: everything before the first '?'.
absl::string_view TargetPath(absl::string_view target);

class QueryParams {
 public:
  // The parameters after the first '?' of `target` (none without one).
  static QueryParams FromTarget(absl::string_view target);
  // The parameters of a bare query string ("a=1&b=2").
  static QueryParams Parse(absl::string_view query);

  std::optional<std::string> Get(absl::string_view key) const;
  // nullopt when absent; InvalidArgument naming the key when not an integer.
  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key) const;
  const std::vector<std::pair<std::string, std::string>>& all() const { return params_; }

 private:
  std::vector<std::pair<std::string, std::string>> params_;
};

}  // namespace gpuha::common
