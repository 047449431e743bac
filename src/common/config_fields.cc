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

void ReadNumberIn(YamlMap& m, absl::string_view key, double min, double max, double* out,
                  bool zero_ok) {
  std::optional<double> v = m.Number(key);
  if (!v) return;
  if (!(*v >= min && *v <= max) && !(zero_ok && *v == 0)) {
    m.Fail(key, absl::StrCat("must be ", zero_ok ? "0 (off) or " : "", "between ", min, " and ",
                             max, ", got ", *v));
    return;
  }
  *out = *v;
}

TlsFiles ReadTlsFiles(YamlMap tls, TlsRule rule) {
  TlsFiles f;
  if (rule.allow_ca) {
    if (auto v = tls.String("ca")) f.ca = *v;
  }
  if (auto v = tls.String("cert")) f.cert = *v;
  if (auto v = tls.String("key")) f.key = *v;
  if (!tls.ok()) return f;
  if (f.cert.empty() != f.key.empty()) {
    tls.Fail(f.cert.empty() ? "cert" : "key", "cert and key come together");
  } else if (rule.ca_required && f.ca.empty()) {
    tls.Fail("ca", "needs the CA that signed the peers' certificates");
  } else if (rule.ca_needs_cert && !f.ca.empty() && f.cert.empty()) {
    tls.Fail("cert", "a ca (verifying peers) needs this side's own cert and key");
  }
  return f;
}

}  // namespace gpuha::common
