#include "router/request.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/names.h"

namespace gpuha::router {
namespace {

struct ReasonInfo {
  int status;
  const char* label;
};
constexpr std::array<ReasonInfo, static_cast<size_t>(Reason::kCount)> kReasons = {{
    {400, "bad_request"},
    {431, "header_too_large"},
    {431, "too_many_headers"},
    {413, "body_too_large"},
    {400, "bad_stream_id"},
    {401, "unauthorized"},
    {404, "unknown_stream"},
    {503, "no_capacity"},
    {429, "rate_limited"},
    {429, "over_quota"},
    {502, "upstream_failed"},
    {504, "upstream_timeout"},
    {502, "not_replayable"},
    {503, "retry_budget_exhausted"},
    {503, "no_healthy_upstream"},
    {400, "no_stream"},
    {501, "transfer_coding_not_implemented"},
    {405, "method_not_allowed"},
    {502, "upstream_unresolved"},
    {408, "stream_idle"},
    {503, "draining"},
}};

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

void AppendField(std::string_view name, std::string_view value, std::string* out) {
  out->append(name);
  out->append(": ");
  out->append(value);
  out->append("\r\n");
}

void AppendFraming(Framing framing, uint64_t length, std::string* out) {
  if (framing == Framing::kLength) {
    AppendField("Content-Length", std::to_string(length), out);
  } else if (framing == Framing::kChunked) {
    AppendField("Transfer-Encoding", "chunked", out);
  }
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Unreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

}  // namespace

std::optional<HeadProblem> CheckHead(const RequestHeader& h) {
  if (h.method() == http::verb::connect) {
    return HeadProblem{Reason::kMethodNotAllowed, "CONNECT is not served"};
  }
  if (h.method() == http::verb::options && h.target() == "*") {
    return HeadProblem{Reason::kMethodNotAllowed, "OPTIONS * is not served"};
  }
  size_t hosts = h.count(http::field::host);
  if (hosts > 1) return HeadProblem{Reason::kBadRequest, "more than one Host header"};
  if (hosts == 0 && h.version() >= 11) {
    return HeadProblem{Reason::kBadRequest, "an HTTP/1.1 request needs a Host header"};
  }
  if (h.count(http::field::transfer_encoding) == 0) return std::nullopt;
  // RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing.
  if (h.version() < 11) {
    return HeadProblem{Reason::kBadRequest, "Transfer-Encoding in an HTTP/1.0 request"};
  }
  // Every coding of every Transfer-Encoding field, in order.
  std::vector<std::string_view> codings;
  for (const auto& f : h) {
    if (f.name() != http::field::transfer_encoding) continue;
    std::string_view v(f.value().data(), f.value().size());
    while (!v.empty()) {
      size_t comma = v.find(',');
      std::string_view item = Trim(v.substr(0, comma));
      item = Trim(item.substr(0, item.find(';')));  // a coding's parameters
      if (!item.empty()) codings.push_back(item);
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
    }
  }
  if (codings.empty()) return HeadProblem{Reason::kBadRequest, "an empty Transfer-Encoding"};
  for (std::string_view c : codings) {
    bool known = false;
    for (std::string_view k : {"chunked", "gzip", "x-gzip", "deflate", "compress", "x-compress"}) {
      known = known || IEquals(c, k);
    }
    if (!known) {
      return HeadProblem{Reason::kNotImplemented, "transfer coding '" + std::string(c) +
                                                      "' is not supported (only chunked)"};
    }
  }
  if (!IEquals(codings.back(), "chunked")) {
    return HeadProblem{Reason::kBadRequest,
                       "the final transfer coding must be chunked (RFC 9112 6.3)"};
  }
  if (codings.size() > 1) {
    return HeadProblem{Reason::kNotImplemented, "transfer coding '" + std::string(codings.front()) +
                                                    "' is not supported (only chunked)"};
  }
  if (h.count(http::field::content_length) > 0) {
    return HeadProblem{Reason::kBadRequest, "both Transfer-Encoding and Content-Length"};
  }
  return std::nullopt;
}

std::optional<HeadProblem> ReadExpectation(const RequestHeader& h, std::chrono::milliseconds* out) {
  *out = std::chrono::milliseconds(0);
  auto it = h.find(kExpectHeader);
  if (it == h.end()) return std::nullopt;
  if (h.count(kExpectHeader) > 1) {
    return HeadProblem{Reason::kBadRequest, "X-Gpuha-Expect-Ms given more than once"};
  }
  std::string_view v = Trim(std::string_view(it->value().data(), it->value().size()));
  int64_t ms = 0;
  bool digits = !v.empty() && v.size() <= 7;
  for (char c : v) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) ms = ms * 10 + (c - '0');
  }
  if (!digits || ms < 1 || ms > 3600000) {
    return HeadProblem{Reason::kBadRequest,
                       "X-Gpuha-Expect-Ms: expected whole milliseconds, 1 to 3600000"};
  }
  *out = std::chrono::milliseconds(ms);
  return std::nullopt;
}

std::optional<std::string> NormalizeTarget(std::string_view target) {
  if (target.empty()) return std::nullopt;
  if (target[0] != '/') {
    // absolute-form: scheme "://" authority [path-abempty] ["?" query]
    size_t scheme = target.find("://");
    if (scheme == std::string_view::npos || scheme == 0) return std::nullopt;
    for (char c : target.substr(0, scheme)) {
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '+' || c == '-' || c == '.')) {
        return std::nullopt;
      }
    }
    std::string_view rest = target.substr(scheme + 3);
    size_t path = rest.find_first_of("/?#");
    if (path == std::string_view::npos) return std::string("/");
    if (rest[path] == '#') return std::nullopt;
    std::optional<std::string> out = NormalizeTarget(rest[path] == '?' ? "/" : rest.substr(path));
    if (out && rest[path] == '?') out->append(rest.substr(path));
    return out;
  }
  size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  // Decode unreserved %-escapes; keep (upper-cased) the others.
  std::string decoded;
  decoded.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      decoded.push_back(path[i]);
      continue;
    }
    if (i + 2 >= path.size()) return std::nullopt;  // "%" or "%A" at the end
    int hi = HexDigit(path[i + 1]), lo = HexDigit(path[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    char c = static_cast<char>(hi * 16 + lo);
    if (Unreserved(c)) {
      decoded.push_back(c);
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      decoded.push_back('%');
      decoded.push_back(kHex[hi]);
      decoded.push_back(kHex[lo]);
    }
    i += 2;
  }
  // Segments without empty and dot ones (inline: no allocation on the
  // request path for a path of up to 16).
  absl::InlinedVector<std::string_view, 16> segments;
  std::string_view rest(decoded);
  bool trailing_slash = false;
  while (!rest.empty()) {
    rest.remove_prefix(1);  // the '/'
    size_t end = rest.find('/');
    std::string_view seg = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
    trailing_slash = seg.empty() || seg == "." || seg == "..";
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      if (segments.empty()) return std::nullopt;  // above the root
      segments.pop_back();
      continue;
    }
    segments.push_back(seg);
  }
  std::string out;
  out.reserve(target.size());
  for (std::string_view seg : segments) {
    out.push_back('/');
    out.append(seg);
  }
  if (out.empty() || trailing_slash) out.push_back('/');
  if (q != std::string_view::npos) out.append(target.substr(q));
  return out;
}

int ReasonStatus(Reason r) { return kReasons[static_cast<size_t>(r)].status; }
const char* ReasonLabel(Reason r) { return kReasons[static_cast<size_t>(r)].label; }

StreamRef ExtractStream(std::string_view header_value, std::string_view target) {
  StreamRef r;
  constexpr std::string_view kPrefix = "/streams/";
  if (target.substr(0, kPrefix.size()) == kPrefix) {
    std::string_view rest = target.substr(kPrefix.size());
    size_t end = rest.find_first_of("/?");
    std::string_view id = rest.substr(0, end);
    if (!common::ValidStreamId(id)) {
      r.bad = true;
      return r;
    }
    r.stream = std::string(id);
    std::string_view tail = end == std::string_view::npos ? "" : rest.substr(end);
    if (tail.empty() || tail[0] == '?') r.target.push_back('/');
    r.target.append(tail);
  } else {
    r.target = std::string(target);
  }
  if (!header_value.empty()) {
    if (!common::ValidStreamId(header_value) || (!r.stream.empty() && r.stream != header_value)) {
      r.bad = true;
      return r;
    }
    r.stream = std::string(header_value);
  }
  return r;
}

std::string_view ApiKeyOf(std::string_view authorization, std::string_view x_api_key) {
  if (authorization.size() > 7 && IEquals(authorization.substr(0, 7), "bearer ")) {
    return authorization.substr(7);
  }
  return x_api_key;
}

std::string_view ApiKey(const RequestHeader& h) {
  auto auth = h.find(http::field::authorization);
  auto key = h.find("x-api-key");
  return ApiKeyOf(auth == h.end() ? std::string_view()
                                  : std::string_view(auth->value().data(), auth->value().size()),
                  key == h.end() ? std::string_view()
                                 : std::string_view(key->value().data(), key->value().size()));
}

bool IsHopByHop(std::string_view n) {
  for (std::string_view h :
       {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
        "te", "trailer", "transfer-encoding", "upgrade", "content-length"}) {
    if (IEquals(n, h)) return true;
  }
  return false;
}

void AppendUpstreamHead(const RequestHeader& h, std::string_view target, std::string_view host,
                        std::string_view tenant, std::string_view stream,
                        std::string_view client_ip, Framing framing, uint64_t length,
                        std::string* out) {
  auto method = h.method_string();
  out->append(method.data(), method.size());
  out->push_back(' ');
  out->append(target);
  out->append(" HTTP/1.1\r\n");
  AppendField("Host", host, out);
  std::string forwarded(client_ip);
  for (const auto& f : h) {
    std::string_view name(f.name_string().data(), f.name_string().size());
    if (IsHopByHop(name) || name.find('_') != std::string_view::npos || IEquals(name, "host") ||
        IEquals(name, "expect") || IEquals(name, "authorization") || IEquals(name, "x-api-key") ||
        IEquals(name, "x-gpuha-tenant") || IEquals(name, "x-gpuha-stream")) {
      continue;
    }
    std::string_view value(f.value().data(), f.value().size());
    if (IEquals(name, "x-forwarded-for")) {
      forwarded = std::string(value) + ", " + std::string(client_ip);
      continue;
    }
    AppendField(name, value, out);
  }
  AppendField("X-Forwarded-For", forwarded, out);
  if (!tenant.empty()) AppendField("X-Gpuha-Tenant", tenant, out);
  if (!stream.empty()) AppendField("X-Gpuha-Stream", stream, out);
  AppendFraming(framing, length, out);
  out->append("\r\n");
}

void AppendClientHead(const ResponseHeader& h, Framing framing, uint64_t length, bool keep_alive,
                      int keep_alive_s, std::string* out) {
  out->append("HTTP/1.1 ");
  out->append(std::to_string(h.result_int()));
  out->push_back(' ');
  auto reason = h.reason();
  if (reason.empty()) reason = http::obsolete_reason(h.result());
  out->append(reason.data(), reason.size());
  out->append("\r\n");
  for (const auto& f : h) {
    std::string_view name(f.name_string().data(), f.name_string().size());
    if (IsHopByHop(name)) continue;
    AppendField(name, std::string_view(f.value().data(), f.value().size()), out);
  }
  AppendFraming(framing, length, out);
  if (!keep_alive) {
    AppendField("Connection", "close", out);
  } else if (keep_alive_s > 0) {
    out->append("Keep-Alive: timeout=");
    out->append(std::to_string(keep_alive_s));
    out->append("\r\n");
  }
  out->append("\r\n");
}

int AdvertisedKeepAlive(std::chrono::milliseconds idle) {
  return static_cast<int>(std::max<int64_t>(0, idle.count() / 1000 - 1));
}

std::string ErrorBody(Reason r, std::string_view detail, std::string_view stream) {
  std::string body = "{\"error\":";
  AppendJsonString(ReasonLabel(r), &body);
  body += ",\"reason\":";
  AppendJsonString(detail, &body);
  if (!stream.empty()) {
    body += ",\"stream\":";
    AppendJsonString(stream, &body);
  }
  body += "}\n";
  return body;
}

std::string ErrorResponse(Reason r, std::string_view detail, std::string_view stream,
                          int retry_after_s, bool keep_alive) {
  std::string body = ErrorBody(r, detail, stream);
  int status = ReasonStatus(r);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
  auto text = http::obsolete_reason(static_cast<http::status>(status));
  out.append(text.data(), text.size());
  out += "\r\nContent-Type: application/json\r\n";
  AppendField("Content-Length", std::to_string(body.size()), &out);
  AppendField("X-Gpuha-Error", ReasonLabel(r), &out);
  if (retry_after_s > 0) AppendField("Retry-After", std::to_string(retry_after_s), &out);
  if (!keep_alive) AppendField("Connection", "close", &out);
  out += "\r\n";
  out += body;
  return out;
}

void AppendChunkHeader(uint64_t size, std::string* out) {
  char buf[24];
  int n = std::snprintf(buf, sizeof buf, "%llx\r\n", static_cast<unsigned long long>(size));
  out->append(buf, static_cast<size_t>(n));
}

}  // namespace gpuha::router
