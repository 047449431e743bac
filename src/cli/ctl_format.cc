#include "cli/ctl_format.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace gpuha::cli {

using nlohmann::json;

// Times past these are not times (a bad field): kept in int64_t's range.
constexpr double kMaxMs = 1e17;

std::string FormatTime(double unix_ms) {
  if (!(std::fabs(unix_ms) < kMaxMs)) return "-";
  absl::Time t = absl::FromUnixMillis(static_cast<int64_t>(std::floor(unix_ms)));
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

std::string FormatAge(double unix_ms, double now_unix_ms) {
  if (!(std::fabs(unix_ms) < kMaxMs)) return "-";
  double delta_s = (now_unix_ms - unix_ms) / 1000;
  bool future = delta_s < 0;
  auto s = static_cast<int64_t>(std::floor(std::fabs(delta_s)));
  if (s == 0) return "now";
  std::string span = s < 60      ? absl::StrCat(s, "s")
                     : s < 3600  ? absl::StrCat(s / 60, "m")
                     : s < 86400 ? absl::StrCat(s / 3600, "h")
                                 : absl::StrCat(s / 86400, "d");
  return future ? absl::StrCat("in ", span) : absl::StrCat(span, " ago");
}

std::string FormatDurationMs(double ms) {
  if (ms < 0) return absl::StrCat("-", FormatDurationMs(-ms));
  if (ms < 10) return absl::StrFormat("%.1fms", ms);
  if (ms < 1000) return absl::StrFormat("%.0fms", ms);
  if (ms < 60000) return absl::StrFormat("%.1fs", ms / 1000);
  if (!(ms < kMaxMs)) return "-";
  auto s = static_cast<int64_t>(std::llround(ms / 1000));
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string Printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string FormatCell(const json& v, CellKind kind, double now_unix_ms) {
  if (v.is_null()) return "-";
  switch (kind) {
    case CellKind::kTime:
      if (v.is_number()) return FormatTime(v.get<double>());
      break;
    case CellKind::kAge:
      if (v.is_number()) return FormatAge(v.get<double>(), now_unix_ms);
      break;
    case CellKind::kDuration:
      if (v.is_number()) return FormatDurationMs(v.get<double>());
      break;
    case CellKind::kList:
      if (v.is_array()) {
        if (v.empty()) return "-";
        std::vector<std::string> parts;
        for (const json& e : v) {
          parts.push_back(e.is_object() && e.contains("code")
                              ? FormatCell(e["code"], CellKind::kText, 0)
                              : FormatCell(e, CellKind::kText, 0));
        }
        return absl::StrJoin(parts, ",");
      }
      break;
    case CellKind::kText:
      break;
  }
  if (v.is_string()) return Printable(v.get<std::string>());
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_float()) {
    // Raw floats (12.300000001) are noise in a table.
    double d = v.get<double>();
    return d == std::floor(d) && std::fabs(d) < 1e15 ? absl::StrCat(static_cast<int64_t>(d))
                                                     : absl::StrFormat("%.1f", d);
  }
  return v.dump();
}

namespace {

json Field(const json& row, const std::string& field) {
  return row.is_object() && row.contains(field) ? row[field] : json();
}

}  // namespace

std::string RenderTable(const json& rows, const std::vector<Column>& columns, double now_unix_ms) {
  std::vector<std::vector<std::string>> cells;
  cells.emplace_back();
  for (const Column& c : columns) cells.back().push_back(absl::AsciiStrToUpper(c.header));
  if (rows.is_array()) {
    for (const json& r : rows) {
      cells.emplace_back();
      for (const Column& c : columns) {
        cells.back().push_back(FormatCell(Field(r, c.field), c.kind, now_unix_ms));
      }
    }
  }
  std::vector<size_t> width(columns.size(), 0);
  for (const auto& line : cells) {
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  }
  std::string out;
  for (const auto& line : cells) {
    std::string text;
    for (size_t i = 0; i < line.size(); ++i) {
      text += line[i];
      if (i + 1 < line.size()) text.append(width[i] - line[i].size() + 2, ' ');
    }
    out += text + "\n";
  }
  return out;
}

std::string RenderFields(const json& object, const std::vector<Column>& columns,
                         double now_unix_ms) {
  size_t width = 0;
  for (const Column& c : columns) width = std::max(width, c.header.size() + 1);
  std::string out;
  for (const Column& c : columns) {
    out += absl::StrFormat("%-*s %s\n", static_cast<int>(width), c.header + ":",
                           FormatCell(Field(object, c.field), c.kind, now_unix_ms));
  }
  return out;
}

namespace {

YAML::Node ToYaml(const json& j) {
  switch (j.type()) {
    case json::value_t::object: {
      YAML::Node n(YAML::NodeType::Map);
      for (auto& [k, v] : j.items()) n[k] = ToYaml(v);
      return n;
    }
    case json::value_t::array: {
      YAML::Node n(YAML::NodeType::Sequence);
      for (const json& v : j) n.push_back(ToYaml(v));
      return n;
    }
    case json::value_t::string:
      return YAML::Node(j.get<std::string>());
    case json::value_t::boolean:
      return YAML::Node(j.get<bool>());
    case json::value_t::number_integer:
      return YAML::Node(j.get<int64_t>());
    case json::value_t::number_unsigned:
      return YAML::Node(j.get<uint64_t>());
    case json::value_t::number_float:
      return YAML::Node(j.get<double>());
    default:
      return YAML::Node(YAML::NodeType::Null);
  }
}

}  // namespace

std::string RenderYaml(const json& j) {
  YAML::Emitter e;
  e << ToYaml(j);
  return absl::StrCat(e.c_str(), "\n");
}

absl::StatusOr<double> ParseSince(const std::string& text, double now_unix_ms) {
  absl::Duration d;
  if (absl::ParseDuration(text, &d)) {
    if (d < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--since: '", text, "' is negative; give how far back, e.g. 10m"));
    }
    return now_unix_ms - absl::ToDoubleMilliseconds(d);
  }
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &err)) {
    return absl::ToDoubleMilliseconds(t - absl::UnixEpoch());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--since: '", absl::CHexEscape(text),
      "' is neither a duration (90s, 10m, 1h30m) nor an RFC 3339 time (2026-12-02T15:00:00Z)"));
}

}  // namespace gpuha::cli
