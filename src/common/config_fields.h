// Config field readers every component shares, so a duration or a key hash
// is read, and rejected, the same way in the agent, controller and router.
// Each reads one key of a YamlMap and reports a bad value through
// YamlMap::Fail, which names the file, line, column and field.
//
//   ReadMillis(limits, "connect_timeout_ms", &c.connect_timeout, {.min = 1});
//   if (auto h = ReadSha256Hex(tokens, "sha256")) c.tokens[*h] = ...;
//   TlsFiles tls = ReadTlsFiles(root.Map("tls"), {.allow_ca = true});
//   auto role = ReadEnum<Role>(node, "role", {{"active", Role::kActive}, ...});
//
// Thread-safety: none needed (pure functions over one YamlMap).
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// Reads `key` as a whole number in [min, max] into `out` (an integer type);
// a missing key leaves `out` alone. Errors: "must be between MIN and MAX,
// got X". Every numeric config field has a range: INT64_MAX in a timeout or
// 2^32 in a size breaks later in ways that name nothing.
template <class T>
void ReadIntIn(YamlMap& m, absl::string_view key, int64_t min, int64_t max, T* out) {
  std::optional<int64_t> v = m.Int(key);
  if (!v) return;
  if (*v < min || *v > max) {
    m.Fail(key, absl::StrCat("must be between ", min, " and ", max, ", got ", *v));
    return;
  }
  *out = static_cast<T>(*v);
}

// The same for a real number; `zero_ok` also accepts exactly 0 below `min`
// (0 often means "off").
void ReadNumberIn(YamlMap& m, absl::string_view key, double min, double max, double* out,
                  bool zero_ok = false);

// A SHA-256 in hex (64 digits, either case), as lower case; nullopt when
// `text` is not one. API keys and bearer tokens are stored this way
// (`gpuha ctl hash-token KEY` makes one).
std::optional<std::string> ParseSha256Hex(absl::string_view text);

// The key's value through ParseSha256Hex; a bad one fails the field.
std::optional<std::string> ReadSha256Hex(YamlMap& m, absl::string_view key);

// One TLS section's files: { ca: FILE, cert: FILE, key: FILE }.
struct TlsFiles {
  std::string ca, cert, key;
};
struct TlsRule {
  bool allow_ca = true;        // false: `ca` is an unknown key here
  bool ca_required = false;    // the section must name a CA (read it only when present)
  bool ca_needs_cert = false;  // a CA (verifying peers) only with our own cert
};
// Reads the section's files. cert and key come together; the rule decides
// what `ca` needs. Errors name the field ("tls.key: tls.cert and tls.key come
// together"). The files are not opened here: each component opens them at
// start, where a failure names the field too.
TlsFiles ReadTlsFiles(YamlMap tls, TlsRule rule = {});

// The key's value as one of `values`; an unknown spelling fails the field
// with the allowed list. Missing: nullopt.
template <class E>
std::optional<E> ReadEnum(YamlMap& m, absl::string_view key,
                          std::initializer_list<std::pair<const char*, E>> values) {
  std::vector<std::string> names;
  for (const auto& v : values) names.emplace_back(v.first);
  std::optional<std::string> name = m.Enum(key, names);
  if (!name) return std::nullopt;
  for (const auto& v : values) {
    if (*name == v.first) return v.second;
  }
  return std::nullopt;
}

}  // namespace gpuha::common
