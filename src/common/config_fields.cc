#include "common/config_fields.h"

#include "absl/strings/ascii.h"

namespace gpuha::common {

std::optional<std::string> ParseSha256Hex(absl::string_view text) {
  if (text.size() != 64) return std::nullopt;
  std::string out(text);
  for (char& c : out) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    c = absl::ascii_tolower(static_cast<unsigned char>(c));
  }
  return out;
}

std::optional<std::string> ReadSha256Hex(YamlMap& m, absl::string_view key) {
  std::optional<std::string> text = m.String(key);
  if (!text) return std::nullopt;
  std::optional<std::string> hex = ParseSha256Hex(*text);
  if (!hex) {
    m.Fail(key, absl::StrCat("'", *text,
                             "' is not a hex SHA-256 (64 hex digits; make one with "
                             "`gpuha ctl hash-token KEY`)"));
  }
  return hex;
}

}  // namespace gpuha::common
