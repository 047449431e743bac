// Config field readers every component shares, so a duration or a key hash
// is read, and rejected, the same way in the agent, controller and router.
// Each reads one key of a YamlMap and reports a bad value through
// YamlMap::Fail, which names the file, line, column and field.
//
//   ReadMillis(limits, "connect_timeout_ms", &c.connect_timeout, {.min = 1});
//   if (auto h = ReadSha256Hex(tokens, "sha256")) c.tokens[*h] = ...;
//
// Thread-safety: none needed (pure functions over one YamlMap).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/yaml_reader.h"

namespace gpuha::common {

struct MillisRange {
  int64_t min = 1;
  int64_t max = std::numeric_limits<int64_t>::max();
};

// Reads `key` as a whole number of milliseconds in `range` into `out`; a
// missing key leaves `out` alone. Errors say "must be at least MIN" or
// "must be between MIN and MAX".
template <class Duration>
void ReadMillis(YamlMap& m, absl::string_view key, Duration* out, MillisRange range = {}) {
  std::optional<int64_t> v = m.Int(key);
  if (!v) return;
  if (*v < range.min || *v > range.max) {
    m.Fail(key,
           range.max == std::numeric_limits<int64_t>::max()
               ? absl::StrCat("must be at least ", range.min, " ms, got ", *v)
               : absl::StrCat("must be between ", range.min, " and ", range.max, " ms, got ", *v));
    return;
  }
  *out = std::chrono::duration_cast<Duration>(std::chrono::milliseconds(*v));
}

// A SHA-256 in hex (64 digits, either case), as lower case; nullopt when
// `text` is not one. API keys and bearer tokens are stored this way
// (`gpuha ctl hash-token KEY` makes one).
std::optional<std::string> ParseSha256Hex(absl::string_view text);

// The key's value through ParseSha256Hex; a bad one fails the field.
std::optional<std::string> ReadSha256Hex(YamlMap& m, absl::string_view key);

}  // namespace gpuha::common
