#include "controller/controller_config.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/config_fields.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"

namespace gpuha::controller {

const char* ApiRoleName(ApiRole r) {
  switch (r) {
    case ApiRole::kViewer:
      return "viewer";
    case ApiRole::kOperator:
      return "operator";
    case ApiRole::kAdmin:
      return "admin";
  }
  return "viewer";
}

absl::StatusOr<ControllerConfig> ParseControllerConfig(absl::string_view yaml,
                                                       const std::string& source) {
  auto doc = common::YamlDocument::LoadString(yaml, source);
  if (!doc.ok()) return doc.status();
  common::YamlMap root = doc->Root();
  ControllerConfig c;
  common::YamlMap cluster = root.Map("cluster");
  if (auto k = cluster.Int("redundancy")) {
    if (*k < 0) cluster.Fail("redundancy", "must not be negative");
    c.redundancy = *k;
  }
  root.Require("nodes");
  std::set<std::string> names;
  std::vector<common::YamlMap> nodes = root.MapList("nodes");
  for (common::YamlMap& n : nodes) {
    NodeConfig nc;
    if (n.Require("name")) nc.spec.id = n.String("name").value_or("");
    if (!nc.spec.id.empty() && !names.insert(nc.spec.id).second) {
      n.Fail("name", absl::StrCat("node '", nc.spec.id, "' is listed twice"));
    }
    if (auto r = common::ReadEnum<Role>(
            n, "role",
            {{"active", Role::kActive}, {"passive", Role::kPassive}, {"buffer", Role::kBuffer}})) {
      nc.spec.role = *r;
    }
    if (n.Require("capacity")) {
      int64_t cap = n.Int("capacity").value_or(0);
      if (cap < 1 && n.ok()) n.Fail("capacity", "must be at least 1 stream unit");
      nc.spec.capacity = cap;
    }
    if (auto b = n.Bool("cpu_only")) nc.spec.cpu_only = *b;
    if (auto a = n.String("address")) nc.address = *a;
    c.nodes.push_back(nc);
  }
  if (root.ok() && c.redundancy >= static_cast<int64_t>(c.nodes.size())) {
    cluster.Fail("redundancy", absl::StrCat("k=", c.redundancy, " is impossible with ",
                                            c.nodes.size(), " node(s): nodes must exceed k"));
  }
  if (auto t = root.StringList("tenants")) c.tenants = *t;
  common::YamlMap listen = root.Map("listen");
  if (auto g = listen.String("grpc")) c.grpc_listen = *g;
  if (auto h = listen.String("http")) c.http_listen = *h;
  common::YamlMap store = root.Map("store");
  if (auto p = store.String("path")) c.store_path = *p;
  common::TlsFiles tls = common::ReadTlsFiles(root.Map("tls"), {.ca_needs_cert = true});
  c.tls_ca = tls.ca;
  c.tls_cert = tls.cert;
  c.tls_key = tls.key;
  for (common::YamlMap& t : root.MapList("tokens")) {
    ApiToken token;
    if (t.Require("name")) token.name = t.String("name").value_or("");
    if (t.Require("role")) {
      token.role = common::ReadEnum<ApiRole>(t, "role",
                                             {{"viewer", ApiRole::kViewer},
                                              {"operator", ApiRole::kOperator},
                                              {"admin", ApiRole::kAdmin}})
                       .value_or(ApiRole::kViewer);
    }
    if (t.Require("sha256")) {
      if (std::optional<std::string> hex = common::ReadSha256Hex(t, "sha256"))
        c.tokens[*hex] = token;
    }
  }
  common::YamlMap fence = root.Map("fence");
  if (auto h = fence.String("hook")) c.fence_hook = *h;
  common::ReadMillis(fence, "timeout_ms", &c.fence_timeout);
  common::YamlMap det = root.Map("detector");
  common::ReadMillis(det, "floor_ms", &c.detector.floor);
  common::ReadMillis(det, "ceiling_ms", &c.detector.ceiling);
  common::ReadMillis(det, "broken_grace_ms", &c.detector.broken_grace, {.min = 0});
  common::ReadMillis(det, "suspect_after_ms", &c.detector.suspect_after);
  if (auto k = det.Number("k")) {
    if (*k < 0) det.Fail("k", "must not be negative");
    c.detector.k = *k;
  }
  if (det.ok() && c.detector.ceiling < c.detector.floor) {
    det.Fail("ceiling_ms", "must not be below floor_ms");
  }
  common::YamlMap rec = root.Map("recovery");
  common::ReadMillis(rec, "healthy_for_ms", &c.healthy_for, {.min = 0});
  if (auto n = rec.Int("max_failures")) {
    if (*n < 1) rec.Fail("max_failures", "must be at least 1");
    c.max_failures = static_cast<int>(*n);
  }
  if (auto s = rec.Int("window_s")) {
    if (*s < 1) rec.Fail("window_s", "must be at least 1");
    c.failure_window = std::chrono::seconds(*s);
  }
  common::ReadMillis(root, "startup_grace_ms", &c.startup_grace, {.min = 0});
  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return c;
}

absl::StatusOr<ControllerConfig> LoadControllerConfig(const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseControllerConfig(*text, path);
}

}  // namespace gpuha::controller
