#include "controller/controller_config.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config_fields.h"
#include "common/file_util.h"
#include "common/names.h"
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

std::optional<ExposureProblem> CheckExposure(const ControllerConfig& c) {
  // Without tokens the API gives admin rights to whoever reaches it, so it
  // may only listen on loopback.
  if (absl::StatusOr<common::HostPort> http = common::ParseHostPort(c.http_listen, "http");
      c.tokens.empty() && http.ok() && !common::IsLoopbackHost(http->host)) {
    return ExposureProblem{"listen.http",
                           absl::StrCat("serving the API on ", c.http_listen,
                                        " without tokens would give admin rights to anyone who "
                                        "reaches it; add tokens (gpuha ctl hash-token KEY prints "
                                        "the sha256 to list) or listen on 127.0.0.1")};
  }
  // Registration lets whoever reaches the gRPC port add a node that then
  // gets streams: beyond loopback it needs a join token or mTLS.
  if (absl::StatusOr<common::HostPort> grpc = common::ParseHostPort(c.grpc_listen, "grpc");
      c.registration.enabled && c.registration.join_token_sha256.empty() && c.tls_ca.empty() &&
      grpc.ok() && !common::IsLoopbackHost(grpc->host)) {
    return ExposureProblem{
        "registration.join_token_sha256",
        absl::StrCat("registering nodes on ", c.grpc_listen,
                     " without a join token or mTLS (tls.ca) would let anyone who reaches it "
                     "add a node that gets streams; add join_token_sha256 (gpuha ctl "
                     "hash-token TOKEN) or listen on 127.0.0.1")};
  }
  return std::nullopt;
}

absl::StatusOr<ControllerConfig> ParseControllerConfig(absl::string_view yaml,
                                                       const std::string& source) {
  auto doc = common::YamlDocument::LoadString(yaml, source);
  if (!doc.ok()) return doc.status();
  common::YamlMap root = doc->Root();
  ControllerConfig c;
  common::YamlMap cluster = root.Map("cluster");
  common::ReadIntIn(cluster, "redundancy", 0, 64, &c.redundancy);
  common::YamlMap reg = root.Map("registration");
  if (auto b = reg.Bool("enabled")) c.registration.enabled = *b;
  if (reg.Has("join_token_sha256")) {
    if (std::optional<std::string> hex = common::ReadSha256Hex(reg, "join_token_sha256")) {
      c.registration.join_token_sha256 = *hex;
    }
  }
  if (auto v = reg.String("role_label")) c.registration.role_label = *v;
  if (auto v = reg.StringList("domain_labels")) c.registration.domain_labels = *v;
  if (auto r = common::ReadEnum<Role>(
          reg, "default_role",
          {{"active", Role::kActive}, {"passive", Role::kPassive}, {"buffer", Role::kBuffer}})) {
    c.registration.default_role = *r;
  }
  common::ReadIntIn(reg, "max_nodes", 1, 1'000'000, &c.registration.max_nodes);
  // Without registration the config is the inventory.
  if (!c.registration.enabled) root.Require("nodes");
  std::set<std::string> names;
  std::vector<common::YamlMap> nodes = root.MapList("nodes");
  for (common::YamlMap& n : nodes) {
    NodeConfig nc;
    if (n.Require("name")) nc.spec.id = n.String("name").value_or("");
    if (n.ok() && !common::ValidName(nc.spec.id)) {
      n.Fail("name", absl::StrCat("'", absl::CHexEscape(nc.spec.id), "' must be ",
                                  common::kNameRule, " (an agent's --node)"));
    }
    if (!nc.spec.id.empty() && !names.insert(nc.spec.id).second) {
      n.Fail("name", absl::StrCat("node '", nc.spec.id, "' is listed twice"));
    }
    if (auto r = common::ReadEnum<Role>(
            n, "role",
            {{"active", Role::kActive}, {"passive", Role::kPassive}, {"buffer", Role::kBuffer}})) {
      nc.spec.role = *r;
    }
    if (auto d = n.String("domain")) {
      nc.spec.domain = *d;
      if (!common::ValidName(*d)) {
        n.Fail("domain", absl::StrCat("'", absl::CHexEscape(*d), "' must be ", common::kNameRule));
      }
    }
    for (common::YamlMap& g : n.MapList("gpu_servers")) {
      GpuServerConfig gs;
      int64_t index = 0;
      if (g.Require("index")) common::ReadIntIn(g, "index", 0, 1023, &index);
      gs.index = static_cast<uint32_t>(index);
      if (g.Require("address")) gs.address = g.String("address").value_or("");
      if (g.Require("capacity")) common::ReadIntIn(g, "capacity", 1, 1'000'000, &gs.capacity);
      if (g.Has("slice")) {
        int64_t slice = 0;
        common::ReadIntIn(g, "slice", 0, 63, &slice);
        gs.slice = static_cast<uint32_t>(slice);
      }
      if (auto p = g.String("profile")) gs.profile = *p;
      if (auto a = g.String("grpc_address")) gs.grpc_address = *a;
      nc.gpu_servers.push_back(gs);
    }
    if (n.ok() && !nc.gpu_servers.empty()) {
      if (absl::Status s = CheckGpuServers(nc.gpu_servers); !s.ok()) {
        n.Fail("gpu_servers", s.message());
      }
      for (const GpuServerConfig& g : nc.gpu_servers) nc.spec.capacity += g.capacity;
      if (n.Has("capacity")) {
        n.Fail("capacity", "a node with gpu_servers has their capacities' sum; drop capacity");
      }
    } else if (n.Require("capacity")) {
      // Stream units; INT64_MAX once made the 409 text's total -4.
      common::ReadIntIn(n, "capacity", 1, 1'000'000, &nc.spec.capacity);
    }
    if (auto b = n.Bool("cpu_only")) nc.spec.cpu_only = *b;
    if (auto a = n.String("address")) {
      if (absl::StatusOr<common::HostPort> hp = common::ParseHostPort(*a, "address"); !hp.ok()) {
        n.Fail("address", absl::StrCat("'", *a, "' is not HOST:PORT"));
      }
      nc.address = *a;
    }
    if (auto a = n.String("grpc_address")) {
      if (!common::ParseHostPort(*a, "grpc_address").ok()) {
        n.Fail("grpc_address", absl::StrCat("'", *a, "' is not HOST:PORT"));
      }
      nc.grpc_address = *a;
    }
    c.nodes.push_back(nc);
  }
  if (root.ok() && !c.registration.enabled &&
      c.redundancy >= static_cast<int64_t>(c.nodes.size())) {
    cluster.Fail("redundancy", absl::StrCat("k=", c.redundancy, " is impossible with ",
                                            c.nodes.size(), " node(s): nodes must exceed k"));
  }
  if (auto t = root.StringList("tenants")) {
    c.tenants = *t;
    for (const std::string& name : c.tenants) {
      if (!common::ValidName(name)) {
        root.Fail("tenants",
                  absl::StrCat("'", absl::CHexEscape(name), "' must be ", common::kNameRule));
        break;
      }
    }
  }
  common::YamlMap listen = root.Map("listen");
  for (auto [key, out] : {std::pair{"grpc", &c.grpc_listen}, std::pair{"http", &c.http_listen}}) {
    if (auto v = listen.String(key)) {
      if (!common::ParseHostPort(*v, key).ok()) {
        listen.Fail(key, absl::StrCat("'", *v, "' is not HOST:PORT"));
      }
      *out = *v;
    }
  }
  if (auto v = listen.Bool("heartbeat_datagrams")) c.heartbeat_datagrams = *v;
  common::YamlMap store = root.Map("store");
  for (const char* key : {"sqlite", "path"}) {
    if (auto p = store.String(key)) {
      if (!c.store_path.empty()) store.Fail(key, "give store.sqlite or store.path, not both");
      c.store_path = *p;
    }
  }
  if (auto urls = store.StringList("etcd")) {
    if (urls->empty()) store.Fail("etcd", "list at least one endpoint (http://HOST:PORT)");
    if (!c.store_path.empty()) {
      store.Fail("etcd", "one store: either etcd or sqlite (store.sqlite or store.path)");
    }
    for (size_t i = 0; i < urls->size(); ++i) {
      const std::string& url = (*urls)[i];
      const bool https = absl::StartsWith(url, "https://");
      std::string hostport = url.substr(https ? 8 : absl::StartsWith(url, "http://") ? 7 : 0);
      if (hostport.size() == url.size() || !common::ParseHostPort(hostport, "").ok()) {
        store.Fail("etcd", absl::StrCat("[", i, "] '", url,
                                        "' is not http://HOST:PORT or https://HOST:PORT"));
      }
    }
    c.etcd.endpoints = *urls;
  }
  if (auto p = store.String("prefix")) {
    if (p->empty() || p->back() != '/') store.Fail("prefix", "must end with '/'");
    c.etcd.prefix = *p;
  }
  common::ReadMillis(store, "lease_ttl_ms", &c.etcd.lease_ttl, {.min = 1000, .max = 60000});
  if (auto v = store.Int("max_txn_ops")) {
    if (*v < 1 || *v > 1000000) store.Fail("max_txn_ops", "must be between 1 and 1000000");
    c.etcd.max_txn_ops = *v;
  }
  if (auto a = store.String("advertise")) {
    if (!common::ParseHostPort(*a, "advertise").ok()) {
      store.Fail("advertise", absl::StrCat("'", *a, "' is not HOST:PORT"));
    }
    c.etcd.advertise = *a;
  }
  if (store.Has("tls")) {
    common::TlsFiles etcd_tls = common::ReadTlsFiles(store.Map("tls"));
    c.etcd.tls_ca = etcd_tls.ca;
    c.etcd.tls_cert = etcd_tls.cert;
    c.etcd.tls_key = etcd_tls.key;
  }
  if (c.etcd.endpoints.empty()) {
    for (const char* key : {"prefix", "lease_ttl_ms", "max_txn_ops", "advertise", "tls"}) {
      if (store.Has(key)) store.Fail(key, "is for an etcd store (store.etcd)");
    }
  }
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
      if (std::optional<std::string> hex = common::ReadSha256Hex(t, "sha256")) {
        // Regression: a hash listed twice with two roles silently took the
        // last one (and became admin).
        if (!c.tokens.emplace(*hex, token).second) {
          t.Fail("sha256", absl::StrCat("this token hash is already listed (as '",
                                        c.tokens[*hex].name, "'); one token, one role"));
        }
      }
    }
  }
  if (root.ok()) {
    if (std::optional<ExposureProblem> p = CheckExposure(c)) {
      (p->field == "listen.http" ? listen : reg)
          .Fail(p->field.substr(p->field.find('.') + 1), p->message);
    }
  }
  common::YamlMap fence = root.Map("fence");
  if (auto h = fence.String("hook")) c.fence_hook = *h;
  common::ReadMillis(fence, "timeout_ms", &c.fence_timeout);
  if (auto v = fence.Number("quarantine_max_share")) {
    if (*v <= 0 || *v > 1) fence.Fail("quarantine_max_share", "must be above 0 and at most 1");
    c.quarantine_max_share = *v;
  }
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
  common::ReadMillis(rec, "restart_grace_ms", &c.restart_grace, {.min = 0, .max = 600'000});
  common::ReadIntIn(rec, "max_failures", 1, 1000, &c.max_failures);
  int64_t window_s = -1;
  common::ReadIntIn(rec, "window_s", 1, 30 * 24 * 3600, &window_s);
  if (window_s > 0) c.failure_window = std::chrono::seconds(window_s);
  common::ReadMillis(
      root, "startup_grace_ms", &c.startup_grace,
      {.min = common::ToMillis(common::ReconnectPolicy::LongestWait()), .max = 600'000});
  // On etcd a new leader's agents first find the others not listening: one
  // refused connect each, and the scheduling of a loaded host. A second more.
  if (!c.etcd.endpoints.empty()) {
    c.startup_grace = std::max<common::Duration>(
        c.startup_grace, ControllerConfig().startup_grace + std::chrono::seconds(1));
  }
  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return c;
}

absl::StatusOr<ControllerConfig> LoadControllerConfig(const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseControllerConfig(*text, path);
}

std::string GpuServerName(uint32_t index, std::optional<uint32_t> slice) {
  return slice ? absl::StrCat("gpu", index, "/mig", *slice) : absl::StrCat("gpu", index);
}

std::string GpuUnitId(const std::string& node, const GpuServerConfig& g) {
  return absl::StrCat(node, "/", g.Name());
}

const GpuServerConfig* GpuServerOfUnit(const NodeConfig& n, const std::string& unit) {
  const size_t slash = unit.find('/');
  if (slash == std::string::npos) return nullptr;
  const absl::string_view name = absl::string_view(unit).substr(slash + 1);
  for (const GpuServerConfig& g : n.gpu_servers) {
    if (g.Name() == name) return &g;
  }
  return nullptr;
}

std::vector<NodeSpec> UnitSpecs(const NodeConfig& n) {
  if (n.gpu_servers.empty()) return {n.spec};
  std::vector<NodeSpec> units;
  for (const GpuServerConfig& g : n.gpu_servers) {
    NodeSpec u = n.spec;
    u.id = GpuUnitId(n.spec.id, g);
    u.capacity = g.capacity;
    u.host = n.spec.id;
    units.push_back(std::move(u));
  }
  return units;
}

std::string UnitAddress(const NodeConfig& n, const std::string& unit) {
  if (unit.find('/') == std::string::npos) return n.address;
  const GpuServerConfig* g = GpuServerOfUnit(n, unit);
  return g != nullptr ? g->address : "";
}

std::string UnitGrpcAddress(const NodeConfig& n, const std::string& unit) {
  if (unit.find('/') == std::string::npos) return n.grpc_address;
  const GpuServerConfig* g = GpuServerOfUnit(n, unit);
  return g != nullptr ? g->grpc_address : "";
}

absl::Status CheckGpuServers(const std::vector<GpuServerConfig>& servers) {
  std::set<std::string> seen;
  std::set<uint32_t> whole, sliced;
  for (size_t i = 0; i < servers.size(); ++i) {
    const GpuServerConfig& g = servers[i];
    std::string at = absl::StrCat("gpu_servers[", i, "]");
    if (g.index > 1023) return absl::InvalidArgumentError(absl::StrCat(at, ".index: over 1023"));
    if (g.slice && *g.slice > 63) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".slice: over 63"));
    }
    if (!seen.insert(g.Name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, g.slice ? ".slice: " : ".index: ", g.Name(), " is listed twice"));
    }
    (g.slice ? sliced : whole).insert(g.index);
    if (whole.count(g.index) != 0 && sliced.count(g.index) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".slice: GPU ", g.index, " is listed both whole and by slices"));
    }
    // MIG profiles carry '+' ("1g.10gb+me"); vGPU ones are plain ("L4-4Q").
    if (!g.profile.empty() &&
        (g.profile.size() > 63 ||
         g.profile.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789._+-") != std::string::npos)) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".profile: '", absl::CHexEscape(g.profile),
                                                     "' must be 1-63 of [A-Za-z0-9._+-]"));
    }
    if (!common::ParseHostPort(g.address, "address").ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".address: '", absl::CHexEscape(g.address), "' is not HOST:PORT"));
    }
    if (!g.grpc_address.empty() && !common::ParseHostPort(g.grpc_address, "grpc_address").ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".grpc_address: '", absl::CHexEscape(g.grpc_address), "' is not HOST:PORT"));
    }
    if (g.capacity < 1 || g.capacity > 1'000'000) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".capacity: must be in 1..1000000"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gpuha::controller
