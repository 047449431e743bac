#include "gpu/fault_script.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/yaml_reader.h"
#include "gpu/xid_catalog.h"

namespace gpuha::gpu {
namespace {

using common::YamlMap;

struct KindName {
  FaultKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {FaultKind::kTempRamp, "temp_ramp"},
    {FaultKind::kXid, "xid"},
    {FaultKind::kEccBurst, "ecc_burst"},
    {FaultKind::kPowerExcursion, "power_excursion"},
    {FaultKind::kLost, "lost"},
    {FaultKind::kAgentHang, "agent_hang"},
    {FaultKind::kDriverHang, "driver_hang"},
    {FaultKind::kClear, "clear"},
    {FaultKind::kMigLost, "mig_lost"},
};

std::vector<std::string> KindNames() {
  std::vector<std::string> out;
  for (const KindName& k : kKinds) out.push_back(k.name);
  return out;
}

std::string KnownXids() {
  std::vector<uint32_t> ids;
  for (const XidInfo& x : XidCatalog()) ids.push_back(x.xid);
  return absl::StrJoin(ids, ", ");
}

// Reads one fault mapping; errors land in the map's document.
Fault ReadFault(YamlMap m) {
  Fault f;
  auto non_negative = [&](const char* key, int64_t* out) {
    if (std::optional<int64_t> v = m.Int(key)) {
      if (*v < 0) m.Fail(key, absl::StrCat("must not be negative, got ", *v));
      *out = *v;
    }
  };
  m.Require("kind");
  std::optional<std::string> kind = m.Enum("kind", KindNames());
  if (kind) {
    for (const KindName& k : kKinds) {
      if (*kind == k.name) f.kind = k.kind;
    }
  }
  non_negative("at_ms", &f.at_ms);
  int64_t gpu = 0;
  non_negative("gpu", &gpu);
  f.gpu = static_cast<uint32_t>(gpu);
  if (!kind) return f;
  switch (f.kind) {
    case FaultKind::kTempRamp:
      if (m.Require("to_c")) f.to_c = m.Number("to_c").value_or(0);
      if (f.to_c < -40 || f.to_c > 150) m.Fail("to_c", "must be between -40 and 150 C");
      non_negative("over_ms", &f.over_ms);
      break;
    case FaultKind::kXid: {
      if (!m.Require("xid")) break;
      std::optional<int64_t> xid = m.Int("xid");
      if (xid && (*xid < 0 || FindXid(static_cast<uint32_t>(*xid)) == nullptr)) {
        m.Fail("xid", absl::StrCat(*xid, " is not a known XID (known: ", KnownXids(), ")"));
      } else if (xid) {
        f.xid = static_cast<uint32_t>(*xid);
      }
      break;
    }
    case FaultKind::kEccBurst: {
      int64_t c = 0, u = 0;
      non_negative("corrected", &c);
      non_negative("uncorrected", &u);
      if (c == 0 && u == 0 && m.ok()) m.Fail("", "ecc_burst needs corrected or uncorrected > 0");
      f.corrected = static_cast<uint64_t>(c);
      f.uncorrected = static_cast<uint64_t>(u);
      break;
    }
    case FaultKind::kPowerExcursion:
      if (m.Require("watts")) f.watts = m.Number("watts").value_or(0);
      if (f.watts <= 0 || f.watts > 5000) m.Fail("watts", "must be above 0 and at most 5000");
      if (m.Require("for_ms")) non_negative("for_ms", &f.for_ms);
      break;
    case FaultKind::kAgentHang:
      if (m.Require("for_ms")) non_negative("for_ms", &f.for_ms);
      break;
    case FaultKind::kDriverHang:
      non_negative("for_ms", &f.for_ms);
      break;
    case FaultKind::kMigLost: {
      int64_t slice = 0;
      if (m.Require("slice")) non_negative("slice", &slice);
      if (slice > 63) m.Fail("slice", absl::StrCat("must be a MIG slot 0..63, got ", slice));
      f.slice = static_cast<uint32_t>(slice);
      break;
    }
    case FaultKind::kLost:
    case FaultKind::kClear:
      break;
  }
  return f;
}

}  // namespace

absl::string_view FaultKindName(FaultKind k) {
  for (const KindName& n : kKinds) {
    if (n.kind == k) return n.name;
  }
  return "unknown";
}

absl::StatusOr<std::vector<Fault>> ParseFaultScript(absl::string_view yaml, std::string source) {
  absl::StatusOr<common::YamlDocument> doc =
      common::YamlDocument::LoadString(yaml, std::move(source));
  if (!doc.ok()) return doc.status();
  YamlMap root = doc->Root();
  std::vector<Fault> faults;
  for (YamlMap item : root.MapList("faults")) faults.push_back(ReadFault(item));
  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return faults;
}

absl::StatusOr<std::vector<Fault>> LoadFaultScriptFile(const std::string& path) {
  absl::StatusOr<std::string> text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseFaultScript(*text, path);
}

absl::StatusOr<Fault> ParseFaultSpec(absl::string_view spec) {
  std::vector<std::string> pairs;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '=');
    if (kv.first.empty() || kv.second.empty() ||
        kv.first.find_first_of("{}[]:#") != absl::string_view::npos ||
        kv.second.find_first_of("{}[]:#") != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--fault '", spec, "': '", part, "' is not key=value"));
    }
    pairs.push_back(absl::StrCat(kv.first, ": ", kv.second));
  }
  std::string yaml = absl::StrCat("faults: [{", absl::StrJoin(pairs, ", "), "}]");
  absl::StatusOr<std::vector<Fault>> faults =
      ParseFaultScript(yaml, absl::StrCat("--fault '", spec, "'"));
  if (!faults.ok()) return faults.status();
  if (faults->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--fault '", spec, "': empty fault"));
  }
  return faults->front();
}

}  // namespace gpuha::gpu
