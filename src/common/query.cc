#include "common/query.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpuha::common {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// '+' is a space and %XX a byte; a '%' not followed by two hex digits is kept.
std::string Decode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 &&
               HexDigit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

absl::string_view TargetPath(absl::string_view target) {
  return target.substr(0, target.find('?'));
}

QueryParams QueryParams::FromTarget(absl::string_view target) {
  size_t q = target.find('?');
  return q == absl::string_view::npos ? QueryParams() : Parse(target.substr(q + 1));
}

QueryParams QueryParams::Parse(absl::string_view query) {
  QueryParams out;
  size_t hash = query.find('#');  // a fragment is not part of the query
  if (hash != absl::string_view::npos) query = query.substr(0, hash);
  for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    out.params_.emplace_back(Decode(p.first), Decode(p.second));
  }
  return out;
}

std::optional<std::string> QueryParams::Get(absl::string_view key) const {
  for (const auto& [k, v] : params_) {
    if (k == key) return v;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<int64_t>> QueryParams::Int(absl::string_view key) const {
  std::optional<std::string> v = Get(key);
  if (!v) return std::optional<int64_t>();
  int64_t n = 0;
  if (!absl::SimpleAtoi(*v, &n)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": '", *v, "' is not an integer"));
  }
  return std::optional<int64_t>(n);
}

}  // namespace gpuha::common
