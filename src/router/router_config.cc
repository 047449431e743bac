#include "router/router_config.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/config_fields.h"
#include "common/file_util.h"
#include "common/names.h"
#include "common/yaml_reader.h"

namespace gpuha::router {
namespace {

constexpr int64_t kHourMs = 3'600'000;
constexpr int64_t kDayMs = 24 * kHourMs;

// Durations here are positive unless `allow_zero` (0 turns a feature off),
// and at most `max_ms`.
void ReadMillis(common::YamlMap& m, absl::string_view key, std::chrono::milliseconds* out,
                bool allow_zero = false, int64_t max_ms = kHourMs) {
  common::ReadMillis(m, key, out, {.min = allow_zero ? 0 : 1, .max = max_ms});
}

void ReadAddress(common::YamlMap& m, absl::string_view key, common::HostPort* out) {
  if (auto s = m.String(key)) {
    auto hp = common::ParseHostPort(*s, m.FieldPath(key));
    if (!hp.ok()) {
      m.Fail(key, absl::StrCat("'", *s, "' is not HOST:PORT"));
      return;
    }
    *out = *hp;
  }
}

}  // namespace

absl::StatusOr<RouterConfig> ParseRouterConfig(absl::string_view yaml, const std::string& source) {
  auto doc = common::YamlDocument::LoadString(yaml, source);
  if (!doc.ok()) return doc.status();
  common::YamlMap root = doc->Root();
  RouterConfig c;
  ReadAddress(root, "listen", &c.listen);
  ReadAddress(root, "admin", &c.admin);
  if (auto t = root.Int("threads")) {
    if (*t < 0 || *t > 256) root.Fail("threads", "must be 0 (one per core) to 256");
    c.threads = static_cast<int>(*t);
  }
  if (auto id = root.String("id")) c.router_id = *id;
  if (auto h = root.String("handoff_socket")) c.handoff_socket = *h;
  if (auto list = root.StringList("controllers")) {
    for (size_t i = 0; i < list->size(); ++i) {
      auto hp = common::ParseHostPort((*list)[i], absl::StrCat("controllers[", i, "]"));
      if (!hp.ok()) {
        root.Fail("controllers", hp.status().message());
        break;
      }
      c.controllers.push_back(*hp);
    }
  }
  std::set<std::string> streams;
  for (common::YamlMap& r : root.MapList("routes")) {
    StaticRoute s;
    if (r.Require("stream")) s.stream = r.String("stream").value_or("");
    if (r.ok() && !common::ValidStreamId(s.stream)) {
      r.Fail("stream", absl::StrCat("'", s.stream, "' must be ", common::kStreamIdRule));
    }
    if (!s.stream.empty() && !streams.insert(s.stream).second) {
      r.Fail("stream", absl::StrCat("stream '", s.stream, "' is listed twice"));
    }
    s.tenant = r.String("tenant").value_or("");
    common::HostPort hp;
    if (r.Require("primary")) {
      ReadAddress(r, "primary", &hp);
      s.primary = hp.str();
    }
    if (r.Has("standby")) {
      ReadAddress(r, "standby", &hp);
      s.standby = hp.str();
    }
    if (r.Has("primary_grpc")) {
      ReadAddress(r, "primary_grpc", &hp);
      s.primary_grpc = hp.str();
    }
    if (r.Has("standby_grpc")) {
      if (s.standby.empty()) r.Fail("standby_grpc", "given without a standby");
      ReadAddress(r, "standby_grpc", &hp);
      s.standby_grpc = hp.str();
    }
    c.routes.push_back(s);
  }
  common::TlsFiles tls = common::ReadTlsFiles(root.Map("tls"), {.allow_ca = false});
  c.tls_cert = tls.cert;
  c.tls_key = tls.key;
  common::TlsFiles ctls = common::ReadTlsFiles(root.Map("controller_tls"));
  c.controller_ca = ctls.ca;
  c.controller_cert = ctls.cert;
  c.controller_key = ctls.key;
  if (root.Has("upstream_tls")) {
    common::YamlMap utls = root.Map("upstream_tls");
    if (auto v = utls.String("server_name")) c.upstream_server_name = *v;
    if (auto v = utls.Bool("grpc")) c.upstream_tls_grpc = *v;
    common::TlsFiles files = common::ReadTlsFiles(utls, {.ca_required = true});
    c.upstream_ca = files.ca;
    c.upstream_cert = files.cert;
    c.upstream_key = files.key;
  }

  std::set<std::string> names, hashes;
  for (common::YamlMap& t : root.MapList("tenants")) {
    TenantConfig tc;
    if (t.Require("name")) tc.name = t.String("name").value_or("");
    if (!tc.name.empty() && !names.insert(tc.name).second) {
      t.Fail("name", absl::StrCat("tenant '", tc.name, "' is listed twice"));
    }
    if (t.Require("api_keys_sha256")) {
      auto keys = t.StringList("api_keys_sha256").value_or(std::vector<std::string>{});
      if (keys.empty() && t.ok()) t.Fail("api_keys_sha256", "needs at least one key hash");
      for (const std::string& k : keys) {
        std::optional<std::string> hex = common::ParseSha256Hex(k);
        if (!hex) {
          t.Fail("api_keys_sha256", absl::StrCat("'", k,
                                                 "' is not a hex SHA-256 (64 hex digits; make one "
                                                 "with `gpuha ctl hash-token KEY`)"));
          break;
        }
        if (!hashes.insert(*hex).second) {
          t.Fail("api_keys_sha256", "the same key hash is given to two tenants");
          break;
        }
        tc.key_hashes.push_back(*hex);
      }
    }
    // 0 is unlimited; a tiny rate such as 1e-12 would look like a limit
    // and act as none, so the smallest is one request per 1000 s.
    common::ReadNumberIn(t, "requests_per_second", 0.001, 1e9, &tc.requests_per_second,
                         /*zero_ok=*/true);
    common::ReadNumberIn(t, "burst", 1, 1e9, &tc.burst);
    common::ReadIntIn(t, "max_concurrent", 0, 1'000'000'000, &tc.max_concurrent);
    if (auto d = t.String("default_stream")) {
      if (!common::ValidStreamId(*d)) {
        t.Fail("default_stream", absl::StrCat("must be ", common::kStreamIdRule));
      }
      tc.default_stream = *d;
    }
    c.tenants.push_back(tc);
  }
  for (const StaticRoute& r : c.routes) {
    if (!c.tenants.empty() && !names.count(r.tenant)) {
      root.Fail("routes", absl::StrCat("stream '", r.stream, "' names tenant '", r.tenant,
                                       "', which is not in tenants"));
      break;
    }
  }

  common::YamlMap limits = root.Map("limits");
  // The parser's header limit is 32 bits; 1 MiB is already generous.
  common::ReadIntIn(limits, "max_header_bytes", 1024, 1 << 20, &c.limits.max_header_bytes);
  common::ReadIntIn(limits, "max_headers", 1, 10'000, &c.limits.max_headers);
  common::ReadIntIn(limits, "max_body_bytes", 1, int64_t{1} << 40, &c.limits.max_body_bytes);
  common::ReadIntIn(limits, "retry_buffer_bytes", 0, int64_t{1} << 30,
                    &c.limits.retry_buffer_bytes);
  ReadMillis(limits, "header_timeout_ms", &c.limits.header_timeout);
  ReadMillis(limits, "idle_timeout_ms", &c.limits.idle_timeout, false, kDayMs);
  ReadMillis(limits, "upstream_idle_timeout_ms", &c.limits.upstream_idle_timeout, false, kDayMs);
  ReadMillis(limits, "body_timeout_ms", &c.limits.body_timeout);
  ReadMillis(limits, "connect_timeout_ms", &c.limits.connect_timeout);
  ReadMillis(limits, "response_timeout_ms", &c.limits.response_timeout, false, kDayMs);
  ReadMillis(limits, "drain_timeout_ms", &c.limits.drain_timeout, false, kDayMs);
  common::ReadIntIn(limits, "h2_max_concurrent_streams", 1, 10'000,
                    &c.limits.h2_max_concurrent_streams);

  common::YamlMap failover = root.Map("failover");
  common::ReadNumberIn(failover, "retry_budget_percent", 0, 100, &c.retry_budget_percent);
  common::ReadNumberIn(failover, "retry_min_per_second", 0, 1e6, &c.retry_min_per_second);
  common::ReadNumberIn(failover, "retry_burst", 1, 1e9, &c.retry_burst);
  ReadMillis(failover, "ejection_base_ms", &c.ejection_base);
  ReadMillis(failover, "ejection_max_ms", &c.ejection_max);
  ReadMillis(failover, "sticky_ms", &c.sticky);
  if (auto p = failover.String("probe_path")) {
    if (p->empty() || (*p)[0] != '/') failover.Fail("probe_path", "must start with '/'");
    c.probe_path = *p;
  }
  if (failover.Has("probe")) {
    common::YamlMap probe = failover.Map("probe");
    if (auto m = probe.Enum("method", {"GET", "POST", "HEAD"})) c.probe_method = *m;
    if (auto p = probe.String("path")) {
      if (p->empty() || (*p)[0] != '/') probe.Fail("path", "must start with '/'");
      c.probe_path = *p;
    }
    if (auto t = probe.String("content_type")) c.probe_content_type = *t;
    if (auto b = probe.String("body")) c.probe_body = *b;
    common::ReadIntIn(probe, "expect_status", 100, 599, &c.probe_expect_status);
    for (const std::string* v : {&c.probe_path, &c.probe_content_type}) {
      if (v->find_first_of("\r\n") != std::string::npos) probe.Fail("", "no CR or LF in a probe");
    }
  }
  ReadMillis(failover, "probe_interval_ms", &c.probe_interval, /*allow_zero=*/true);
  common::YamlMap dns = root.Map("dns");
  ReadMillis(dns, "refresh_ms", &c.dns_refresh, /*allow_zero=*/false, kDayMs);
  ReadMillis(failover, "hang_after_ms", &c.hang_after);
  if (auto v = failover.Bool("stall_detection")) c.stall_detection = *v;
  common::ReadMillis(failover, "stall_floor_ms", &c.progress.floor, {.min = 10, .max = kHourMs});
  common::ReadMillis(failover, "stall_ceiling_ms", &c.progress.ceiling,
                     {.min = 10, .max = kHourMs});
  common::ReadIntIn(failover, "stall_min_waiting", 1, 1000, &c.progress.min_waiting);
  if (failover.ok() && c.progress.ceiling < c.progress.floor) {
    failover.Fail("stall_ceiling_ms", "must not be below stall_floor_ms");
  }
  common::ReadIntIn(failover, "consecutive_5xx", 0, 1000, &c.consecutive_5xx);
  if (auto v = failover.Bool("retry_5xx")) c.retry_5xx = *v;
  if (c.probe_interval.count() > 0 && c.hang_after < c.probe_interval && failover.ok()) {
    failover.Fail("hang_after_ms", "must be at least probe_interval_ms");
  }
  if (root.Has("llm")) {
    common::YamlMap llm = root.Map("llm");
    if (auto v = llm.Bool("continuation")) c.llm.continuation = *v;
    common::ReadIntIn(llm, "max_text_bytes", 0, int64_t{1} << 30, &c.llm.max_text_bytes);
    common::ReadIntIn(llm, "max_continuations", 0, 100, &c.llm.max_continuations);
    if (auto v = llm.Bool("token_ids")) c.llm.token_ids = *v;
    if (llm.Has("routes")) {
      c.llm.routes.clear();
      std::set<std::string> paths;
      for (common::YamlMap& r : llm.MapList("routes")) {
        LlmRoute lr;
        if (r.Require("path")) {
          lr.path = r.String("path").value_or("");
          if (lr.path.empty() || lr.path[0] != '/' ||
              lr.path.find_first_of("?# \r\n") != std::string::npos) {
            r.Fail("path", "must be a path starting with '/', without query or spaces");
          } else if (!paths.insert(lr.path).second) {
            r.Fail("path", absl::StrCat("'", lr.path, "' is listed twice"));
          }
        }
        if (r.Require("api")) {
          lr.api = r.Enum("api", {"completions", "chat"}) == "chat" ? LlmApi::kChat
                                                                    : LlmApi::kCompletions;
        }
        if (auto v = r.Bool("continuation")) lr.continuation = *v;
        c.llm.routes.push_back(lr);
      }
    }
  }
  c.auth_none = root.Enum("auth", {"api_key", "none"}) == "none";
  if (absl::Status s = root.Finish(); !s.ok()) return s;
  // After every other check, so that any other error is the one reported.
  if (c.auth_none && !c.tenants.empty()) {
    root.Fail("auth", "is none, but tenants are listed: keep one or the other");
    return root.status();
  }
  if (!c.auth_none && c.tenants.empty()) {
    root.Fail("tenants",
              "none listed: every request would pass without an API key. List the tenants, or "
              "say `auth: none` to run the router open");
    return root.status();
  }
  if (c.limits.retry_buffer_bytes > c.limits.max_body_bytes) {
    c.limits.retry_buffer_bytes = c.limits.max_body_bytes;
  }
  return c;
}

absl::StatusOr<RouterConfig> LoadRouterConfig(const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseRouterConfig(*text, path);
}

}  // namespace gpuha::router
