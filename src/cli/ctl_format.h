// ctl_format: how `gpuha ctl` prints the controller API's JSON for people.
// Pure functions, so the CLI's look is unit-tested without a controller.
//
//   std::cout << RenderTable(rows, {{"NAME", "name"}, {"AGE", "unix_ms", Cell::kAge}}, now);
//   std::cout << RenderYaml(j);
//   auto since = ParseSince("10m", now_unix_ms);   // or an RFC 3339 time
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::cli {

// How a column shows its field.
enum class CellKind {
  kText,      // strings as they are, booleans yes/no, null "-", numbers as JSON
  kTime,      // unix ms -> RFC 3339 in UTC, to the millisecond
  kAge,       // unix ms -> "12s ago"
  kDuration,  // ms -> "85ms", "1.2s", "3m05s"
  kList,      // an array of strings (or of objects with "code") joined by ','
};

struct Column {
  std::string header;
  std::string field;
  CellKind kind = CellKind::kText;
};

// `s` with its control characters (C0, DEL) as \xNN: text from the API (an
// event's detail, a reason) cannot move the cursor or recolour the terminal.
std::string Printable(const std::string& s);
// "2026-12-02T15:39:18.123Z".
std::string FormatTime(double unix_ms);
// "now", "12s ago", "3m ago", "2h ago", "4d ago" (floored; future times say "in 5s").
std::string FormatAge(double unix_ms, double now_unix_ms);
// Rounded to what a person reads: "0.4ms", "85ms", "1.2s", "3m05s", "2h10m".
std::string FormatDurationMs(double ms);
std::string FormatCell(const nlohmann::json& v, CellKind kind, double now_unix_ms);

// Columns padded to their widest cell, headers upper case, no trailing spaces.
std::string RenderTable(const nlohmann::json& rows, const std::vector<Column>& columns,
                        double now_unix_ms);
// `Key: value` lines for one object, in the order of `columns`.
std::string RenderFields(const nlohmann::json& object, const std::vector<Column>& columns,
                         double now_unix_ms);
// Block-style YAML of any JSON value (what `-o yaml` prints).
std::string RenderYaml(const nlohmann::json& j);

// --since: a duration back from now ("90s", "10m", "1h30m") or an RFC 3339
// time ("2026-12-02T15:00:00Z"); the answer is unix ms. Errors name the flag
// and the value.
absl::StatusOr<double> ParseSince(const std::string& text, double now_unix_ms);

}  // namespace gpuha::cli
