#include "sim/sim_input.h"

#include <map>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_fields.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"

namespace gpuha::sim {
namespace {

using common::YamlDocument;
using common::YamlMap;

constexpr int64_t kMaxNodes = 1000000;
constexpr double kMaxHours = 1e9;

}  // namespace

const char* ScopeName(Scope s) {
  switch (s) {
    case Scope::kGpu:
      return "gpu";
    case Scope::kNode:
      return "node";
    case Scope::kRack:
      return "rack";
    case Scope::kPlanned:
      return "planned";
  }
  return "gpu";
}

const char* SparesName(Spares s) {
  switch (s) {
    case Spares::kActive:
      return "active";
    case Spares::kPassive:
      return "passive";
    case Spares::kBuffer:
      return "buffer";
  }
  return "active";
}

const char* UnitName(Unit u) { return u == Unit::kGpu ? "gpu" : "node"; }

const std::vector<Strategy>& BuiltinStrategies() {
  // Kubernetes: kube-controller-manager's --node-monitor-grace-period is 50 s
  // (40 s until kubernetes#121793 raised it); the DefaultTolerationSeconds admission plugin gives
  // every pod 300 s of toleration for node.kubernetes.io/not-ready and
  // unreachable. Pod start with a cached image plus model load: 90 s,
  // an assumption. The device plugin marks a failed GPU unhealthy but
  // Kubernetes never reschedules a bound pod: someone (or a remediation
  // controller) deletes it; 300 s is an assumption.
  static const std::vector<Strategy> kBuiltins = {
      {.name = "no-ha",
       .reserve = false,
       .spares = Spares::kActive,
       .unit = Unit::kGpu,
       .node = {0, 0},
       .gpu = {0, 0},
       .planned_outage_s = 0,
       .note = "every GPU at 100% and nothing to fail over to: a fault's streams wait for "
               "the repair (the N+1 Capacity Rule of the GPU HA & Sharing Strategy guide)"},
      {.name = "scenario-a",
       .reserve = true,
       .spares = Spares::kActive,
       .unit = Unit::kGpu,
       .node = {350, 90},
       .gpu = {300, 90},
       .planned_outage_s = 90,
       .note = "passthrough, Kubernetes restart, N+k spread over every node: node eviction "
               "after 50 s node-monitor-grace-period + 300 s default toleration, then pod "
               "start and model load (90 s, assumed); a GPU fault waits 300 s (assumed) for "
               "the pod to be deleted"},
      {.name = "scenario-b",
       .reserve = true,
       .spares = Spares::kActive,
       .unit = Unit::kGpu,
       .node = {15, 150},
       .gpu = {30, 150},
       .planned_outage_s = 5,
       .note = "vSphere HA with SAN and vGPU: 15 s host failure detection, VM boot (60 s) "
               "and app start with model load (90 s), both assumed; a GPU fault is seen by "
               "VM monitoring's 30 s heartbeat; maintenance by vMotion (5 s stun, assumed)"},
      {.name = "scenario-c",
       .reserve = true,
       .spares = Spares::kBuffer,
       .unit = Unit::kGpu,
       .node = {350, 90},
       .gpu = {300, 90},
       .planned_outage_s = 90,
       .note = "passthrough with a buffer node: Kubernetes' timings as scenario A, the "
               "reserve held on the buffer node(s) instead of spread"},
      {.name = "gpuha",
       .reserve = true,
       .spares = Spares::kPassive,
       .unit = Unit::kGpu,
       .node = {0.2405, 0},
       .gpu = {0.2405, 0},
       .planned_outage_s = 0,
       .note = "hot standby with router failover: 240.5 ms longest gap under a half-hang "
               "(bench/RESULTS.md), a drain loses nothing; a server per GPU as shipped "
               "(server.per_gpu), so one GPU's fault moves that GPU's streams alone (a server "
               "across a node's GPUs, tensor parallel, moves its node: unit node)"},
  };
  return kBuiltins;
}

const Strategy* FindBuiltinStrategy(const std::string& name) {
  for (const Strategy& s : BuiltinStrategies()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<FailureClass> PublishedFailureRates() {
  // Meta, "The Llama 3 Herd of Models" (2024), Table 5: 419 unexpected
  // interruptions in 54 days of pre-training on 16,384 H100 GPUs (2,048
  // nodes of 8). We use the counts: the printed percentages do not match
  // them (148 of 419 is 35%, not the 30.1% printed). Exposure: per GPU,
  // 16,384 x 1,296 h; per node, 2,048 x 1,296 h. Software bugs, NCCL
  // watchdog timeouts and silent data corruption are left out: they are the
  // training job's, not the serving fleet's. Repair times are not in the
  // report; the ones below are assumptions, and a config should set its own.
  constexpr double kGpuHours = 16384.0 * 54 * 24;
  constexpr double kNodeHours = 2048.0 * 54 * 24;
  const std::string src = "Llama 3 report (2024), Table 5: ";
  return {
      {.name = "gpu_off_bus",
       .scope = Scope::kGpu,
       .mtbf_hours = kGpuHours / 148,
       .repair_hours = 48,
       .source = src + "148 faulty GPU in 54 days on 16,384 GPUs; 48 h swap assumed"},
      {.name = "gpu_hbm",
       .scope = Scope::kGpu,
       .mtbf_hours = kGpuHours / 91,
       .repair_hours = 48,
       .source = src + "72 HBM3 + 19 SRAM memory; 48 h swap assumed"},
      {.name = "gpu_gsp",
       .scope = Scope::kGpu,
       .mtbf_hours = kGpuHours / 17,
       .repair_hours = 1,
       .source = src + "17 GPU system processor; 1 h reset assumed"},
      {.name = "gpu_thermal",
       .scope = Scope::kGpu,
       .mtbf_hours = kGpuHours / 6,
       .repair_hours = 24,
       .source = src + "6 thermal interface and sensor; 24 h assumed"},
      {.name = "node_crash",
       .scope = Scope::kNode,
       .mtbf_hours = kNodeHours / 14,
       .repair_hours = 24,
       .source = src + "14 host parts (3 SSD, 3 power supply, 2 chassis, 2 IO board, 2 CPU, "
                       "2 memory); 24 h assumed"},
      {.name = "node_nic",
       .scope = Scope::kNode,
       .mtbf_hours = kNodeHours / 42,
       .repair_hours = 4,
       .source = src + "35 network switch or cable + 7 NIC, counted per node; 4 h assumed"},
      {.name = "maintenance",
       .scope = Scope::kPlanned,
       .mtbf_hours = kNodeHours / 32,
       .repair_hours = 2,
       .fixed_repair = true,
       .source = src + "32 host maintenance; 2 h window assumed"},
  };
}

std::array<double, 24> DefaultDailyLoad() {
  return {0.55, 0.5, 0.5, 0.5, 0.5,  0.55, 0.65, 0.75, 0.85, 0.95, 1.0,  1.0,
          1.0,  1.0, 1.0, 1.0, 0.95, 0.95, 0.9,  0.9,  0.85, 0.75, 0.65, 0.6};
}

std::optional<FleetProblem> CheckFleet(const Fleet& f) {
  if (f.redundancy >= f.nodes) {
    return FleetProblem{
        "redundancy", absl::StrCat("a fleet of ", f.nodes, " node(s) cannot keep N+", f.redundancy,
                                   "; it needs at least ", f.redundancy + 1, " nodes")};
  }
  if (f.passive_nodes >= f.nodes) {
    return FleetProblem{"passive_nodes", absl::StrCat(f.passive_nodes, " of ", f.nodes,
                                                      " nodes leaves no node to serve")};
  }
  return std::nullopt;
}

namespace {

struct ClassName {
  const char* name;
  Scope scope;
};
constexpr ClassName kClassNames[] = {
    {"gpu", Scope::kGpu},
    {"gpu_off_bus", Scope::kGpu},
    {"gpu_hbm", Scope::kGpu},
    {"gpu_gsp", Scope::kGpu},
    {"gpu_thermal", Scope::kGpu},
    {"node", Scope::kNode},
    {"node_crash", Scope::kNode},
    {"node_nic", Scope::kNode},
    {"rack", Scope::kRack},
    {"rack_switch", Scope::kRack},
    {"rack_pdu", Scope::kRack},
    {"rack_cooling", Scope::kRack},
    {"maintenance", Scope::kPlanned},
};

// A positive number of hours, required.
std::optional<double> RequireHours(YamlMap& m, absl::string_view key) {
  if (!m.Require(key)) return std::nullopt;
  std::optional<double> v = m.Number(key);
  if (!v) return std::nullopt;
  if (*v <= 0 || *v > kMaxHours) {
    m.Fail(key, absl::StrCat("must be above 0 and at most ", kMaxHours, " hours, got ", *v));
    return std::nullopt;
  }
  return v;
}

void ReadFailureClass(YamlMap m, FailureClass* c) {
  bool planned = c->scope == Scope::kPlanned;
  const char* every = planned ? "interval_hours" : "mtbf_hours";
  const char* takes = planned ? "duration_hours" : "repair_hours";
  if (auto v = RequireHours(m, every)) c->mtbf_hours = *v;
  if (auto v = RequireHours(m, takes)) c->repair_hours = *v;
  if (auto d = m.Enum("distribution", {"exponential", "weibull"})) {
    c->distribution = *d == "weibull" ? Distribution::kWeibull : Distribution::kExponential;
  }
  if (auto s = m.Number("shape")) {
    if (*s < 0.1 || *s > 10) {
      m.Fail("shape", absl::StrCat("must be between 0.1 and 10, got ", *s));
    } else if (c->distribution != Distribution::kWeibull) {
      m.Fail("shape", "only a weibull distribution has a shape");
    } else {
      c->shape = *s;
    }
  }
  if (auto r = m.Enum("repair", {"exponential", "fixed"})) c->fixed_repair = *r == "fixed";
  if (auto s = m.String("source")) c->source = *s;
  c->source = c->source.empty() ? "config" : c->source;
}

void ReadFailures(YamlMap failures, std::vector<FailureClass>* out) {
  std::map<std::string, FailureClass> by_name;
  if (auto preset = failures.Enum("preset", {"llama3"})) {
    for (FailureClass& c : PublishedFailureRates()) by_name[c.name] = c;
  }
  for (const ClassName& n : kClassNames) {
    failures.Allow(n.name);  // known even when absent, for "did you mean"
    if (!failures.Has(n.name)) continue;
    FailureClass c;
    c.name = n.name;
    c.scope = n.scope;
    ReadFailureClass(failures.Map(n.name), &c);
    by_name[n.name] = c;  // replaces the preset's class of that name
  }
  for (auto& [name, c] : by_name) out->push_back(c);
}

constexpr double kMaxGapSeconds = 1e7;

void ReadGap(YamlMap m, Gap* g) {
  common::ReadNumberIn(m, "detect_s", 0, kMaxGapSeconds, &g->detect_s);
  common::ReadNumberIn(m, "restart_s", 0, kMaxGapSeconds, &g->restart_s);
}

std::vector<std::string> BuiltinNames() {
  std::vector<std::string> names;
  for (const Strategy& s : BuiltinStrategies()) names.push_back(s.name);
  return names;
}

// `strategy_defs:` items: a built-in changed, or a new one based on one.
void ReadStrategyDefs(YamlMap& root, std::map<std::string, Strategy>* known) {
  for (YamlMap d : root.MapList("strategy_defs")) {
    if (!d.Require("name")) return;
    std::optional<std::string> name = d.String("name");
    if (!name) return;
    std::string base_name = d.String("base").value_or(*name);
    auto base = known->find(base_name);
    if (base == known->end()) {
      d.Fail(d.Has("base") ? "base" : "name",
             absl::StrCat("unknown strategy '", base_name, "'; the built-ins are ",
                          absl::StrJoin(BuiltinNames(), ", "),
                          " (a new strategy names one as its base)"));
      return;
    }
    Strategy s = base->second;
    s.name = *name;
    if (auto v = d.Bool("reserve")) s.reserve = *v;
    if (auto v = d.Enum("spares", {"active", "passive", "buffer"})) {
      s.spares = *v == "passive"  ? Spares::kPassive
                 : *v == "buffer" ? Spares::kBuffer
                                  : Spares::kActive;
    }
    if (auto v = d.Enum("unit", {"gpu", "node"})) s.unit = *v == "node" ? Unit::kNode : Unit::kGpu;
    if (d.Has("node")) ReadGap(d.Map("node"), &s.node);
    if (d.Has("gpu")) ReadGap(d.Map("gpu"), &s.gpu);
    common::ReadNumberIn(d, "planned_outage_s", 0, kMaxGapSeconds, &s.planned_outage_s);
    if (auto v = d.String("note")) s.note = *v;
    (*known)[*name] = s;
  }
}

}  // namespace

absl::StatusOr<SimInput> ParseSimInput(absl::string_view yaml, std::string source) {
  absl::StatusOr<YamlDocument> doc = YamlDocument::LoadString(yaml, std::move(source));
  if (!doc.ok()) return doc.status();
  YamlMap root = doc->Root();
  SimInput in;
  in.daily_load = DefaultDailyLoad();

  YamlMap fleet = root.Map("fleet");
  if (root.Require("fleet")) {
    for (const char* key : {"nodes", "gpus_per_node", "streams_per_gpu"}) fleet.Require(key);
    common::ReadIntIn(fleet, "nodes", 1, kMaxNodes, &in.fleet.nodes);
    common::ReadIntIn(fleet, "gpus_per_node", 1, 64, &in.fleet.gpus_per_node);
    common::ReadIntIn(fleet, "streams_per_gpu", 1, 1000, &in.fleet.streams_per_gpu);
    common::ReadIntIn(fleet, "redundancy", 0, kMaxNodes, &in.fleet.redundancy);
    common::ReadIntIn(fleet, "passive_nodes", 0, kMaxNodes, &in.fleet.passive_nodes);
    common::ReadIntIn(fleet, "nodes_per_rack", 1, kMaxNodes, &in.fleet.nodes_per_rack);
    if (std::optional<FleetProblem> p = CheckFleet(in.fleet); p && fleet.ok()) {
      fleet.Fail(p->field, p->message);
    }
  }

  if (root.Require("failures")) ReadFailures(root.Map("failures"), &in.failures);

  YamlMap load = root.Map("load");
  if (auto daily = load.StringList("daily")) {
    if (daily->size() != 1 && daily->size() != 24) {
      load.Fail("daily",
                absl::StrCat("give 1 value (flat) or 24 (one per hour), got ", daily->size()));
    } else {
      for (size_t i = 0; i < daily->size(); ++i) {
        double v = 0;
        if (!absl::SimpleAtod((*daily)[i], &v) || !(v >= 0 && v <= 1)) {
          load.Fail("daily", absl::StrCat("item ", i, ": expected a share between 0 and 1, got '",
                                          (*daily)[i], "'"));
          break;
        }
        if (daily->size() == 1) {
          in.daily_load.fill(v);
        } else {
          in.daily_load[i] = v;
        }
      }
    }
  }

  if (auto h = root.Number("horizon_years")) {
    if (*h <= 0 || *h > 100) {
      root.Fail("horizon_years", absl::StrCat("must be above 0 and at most 100, got ", *h));
    } else {
      in.horizon_years = *h;
    }
  }
  common::ReadIntIn(root, "runs", 1, 10000, &in.runs);
  if (auto s = root.Int("seed")) {
    if (*s < 0) {
      root.Fail("seed", absl::StrCat("must be at least 0, got ", *s));
    } else {
      in.seed = static_cast<uint64_t>(*s);
    }
  }

  std::map<std::string, Strategy> known;
  for (const Strategy& s : BuiltinStrategies()) known[s.name] = s;
  ReadStrategyDefs(root, &known);
  std::vector<std::string> names = BuiltinNames();
  if (auto list = root.StringList("strategies")) names = *list;
  if (names.empty()) root.Fail("strategies", "name at least one strategy");
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (!seen.insert(n).second) {
      root.Fail("strategies", absl::StrCat("'", n, "' is named twice"));
      break;
    }
    auto it = known.find(n);
    if (it == known.end()) {
      std::vector<std::string> all;
      for (const auto& [k, v] : known) all.push_back(k);
      root.Fail("strategies",
                absl::StrCat("unknown strategy '", n, "'; known: ", absl::StrJoin(all, ", ")));
      break;
    }
    in.strategies.push_back(it->second);
  }

  if (auto sweep = root.StringList("sweep_nodes")) {
    for (const std::string& item : *sweep) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(item, &v) || v <= in.fleet.redundancy || v <= in.fleet.passive_nodes ||
          v > kMaxNodes) {
        root.Fail("sweep_nodes", absl::StrCat("each size must be a whole number above redundancy (",
                                              in.fleet.redundancy, ") and passive_nodes (",
                                              in.fleet.passive_nodes, "), got '", item, "'"));
        break;
      }
      in.sweep_nodes.push_back(v);
    }
  }

  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return in;
}

absl::StatusOr<SimInput> LoadSimInputFile(const std::string& path) {
  absl::StatusOr<std::string> text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseSimInput(*text, path);
}

}  // namespace gpuha::sim
