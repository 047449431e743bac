#include "plan/report.h"

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu/gpu_models.h"

namespace gpuha::plan {
namespace {

double Round1(double x) { return std::round(x * 10) / 10; }

// How each question of the flow reads in a report.
std::string QuestionText(absl::string_view id) {
  if (id == "stateless") return "Is the GPU workload stateless?";
  if (id == "zero_downtime") return "Is zero or near-zero downtime required?";
  if (id == "vm_ha_mandatory") return "Is VM-level HA mandatory by infra policy?";
  if (id == "gpu_sharing") return "Is GPU sharing across workloads wanted?";
  if (id == "sharing_cost_justified") return "Is the sharing cost and license justified?";
  if (id == "restart_tolerable") return "Can the application tolerate its restart time?";
  if (id == "shared_storage") return "Does the design need shared storage (SAN)?";
  if (id == "san_type") return "Which SAN transport?";
  return std::string(id);
}

std::string AnswerText(const Decision& d) {
  if (!d.is_bool) return d.answer;
  return d.answer == "true" ? "yes" : "no";
}

std::string GpuLabel(const Plan& p) {
  const gpu::GpuModel* m = gpu::FindGpuModel(p.input.cluster.gpu);
  std::string name = m != nullptr ? std::string(m->name) : p.input.cluster.gpu;
  return absl::StrFormat("%s, %.0f W TDP", name, p.facilities.gpu_tdp_watts);
}

struct CapacityLine {
  std::string label;
  std::string value;
};

std::vector<CapacityLine> CapacityLines(const Plan& p) {
  const Capacity& c = p.capacity;
  const PlanInput::Cluster& cl = p.input.cluster;
  std::string buffer;
  if (cl.buffer_node == BufferNode::kGpu) buffer = " (+1 GPU buffer node)";
  if (cl.buffer_node == BufferNode::kCpu) buffer = " (CPU buffer node adds no GPU capacity)";
  return {
      c.slices_per_gpu > 1
          ? CapacityLine{"nodes x GPUs x slices x streams/slice",
                         absl::StrCat(c.nodes, " x ", c.gpus_per_node, " x ", c.slices_per_gpu,
                                      cl.slice_profile.empty() ? "" : " " + cl.slice_profile, " x ",
                                      c.streams_per_gpu / c.slices_per_gpu, " = ", c.total_streams,
                                      " streams", buffer)}
          : CapacityLine{"nodes x GPUs x streams/GPU",
                         absl::StrCat(c.nodes, " x ", c.gpus_per_node, " x ", c.streams_per_gpu,
                                      " = ", c.total_streams, " streams", buffer)},
      {absl::StrCat("failover reserve (k=", c.redundancy, ")"),
       absl::StrCat(c.failover_reserve_streams, " streams")},
      {"max production load", absl::StrCat(c.max_production_streams, " streams")},
      {"target load", absl::StrCat(c.target_streams, " streams")},
      {"headroom", absl::StrCat(c.headroom_streams, " streams")},
      {absl::StrCat("survives loss of ", c.redundancy, " node(s)"),
       c.survives_node_loss ? "yes" : "NO"},
      {"nodes needed for target", absl::StrCat(c.nodes_needed_for_target)},
      {"GPU losses beyond N+k", c.slices_per_gpu > 1
                                    ? absl::StrCat(c.gpu_failures_absorbed, " GPUs, or ",
                                                   c.slice_failures_absorbed, " slices")
                                    : absl::StrCat(c.gpu_failures_absorbed)},
  };
}

std::vector<CapacityLine> FacilityLines(const Plan& p) {
  const PlanInput::Facilities& f = p.input.facilities;
  return {
      {"IT load",
       absl::StrFormat("%.1f W (%ssurge x%.2g, host %.0f W)", p.facilities.it_load_watts,
                       p.input.cluster.buffer_node == BufferNode::kNone
                           ? ""
                           : absl::StrFormat("%d powered nodes with the %s buffer node; ",
                                             p.facilities.powered_nodes,
                                             BufferNodeName(p.input.cluster.buffer_node)),
                       f.surge_factor, f.host_watts)},
      {"UPS", absl::StrFormat("%.1f VA (%.0f%% headroom, power factor %.2g)", p.facilities.ups_va,
                              f.ups_headroom * 100, f.ups_power_factor)},
      {"cooling", absl::StrFormat("%.1f BTU/h", p.facilities.cooling_btu_per_hour)},
  };
}

std::vector<CapacityLine> DesignLines(const Design& d) {
  return {{"allocation", d.allocation},
          {"san", d.san},
          {"hba", d.hba},
          {"orchestration", d.orchestration},
          {"capacity model", d.capacity_model}};
}

std::vector<CapacityLine> LossLines(const ExpectedLoss& l) {
  if (l.strategy.empty()) return {{"not estimated", l.skipped}};
  return {
      {"modelled as", absl::StrCat("`gpuha sim` strategy ", l.strategy)},
      {"stream-hours lost per year",
       absl::StrFormat("%.1f (95%%: %.1f .. %.1f, %d runs)", l.stream_hours_lost_per_year, l.lo,
                       l.hi, l.runs)},
      {"availability", absl::StrFormat("%.6f", l.availability)},
      {"overflow events per year", absl::StrFormat("%.1f", l.overflow_events_per_year)},
      {"your own rates", "gpuha sim FILE (examples/sim/)"},
  };
}

void TextTable(std::ostringstream& out, const std::vector<CapacityLine>& lines) {
  for (const CapacityLine& l : lines) out << absl::StrFormat("  %-30s %s\n", l.label, l.value);
}

}  // namespace

std::string RenderText(const Plan& p, absl::string_view source) {
  std::ostringstream out;
  out << "gpuha plan: " << source << "\n\n";
  out << "Outcome: " << p.outcome << "\n  " << p.summary << "\n\n";
  out << "Decision path (the decision flow of the GPU HA & Sharing Strategy guide)\n";
  for (size_t i = 0; i < p.path.size(); ++i) {
    out << absl::StrFormat("  %zu. %-48s %s\n", i + 1, QuestionText(p.path[i].question),
                           AnswerText(p.path[i]));
  }
  out << "\nDesign\n";
  TextTable(out, DesignLines(p.design));
  out << "\nCapacity (N+" << p.capacity.redundancy
      << ": the guide's N+1 Capacity Rule, 'non-negotiable')\n";
  TextTable(out, CapacityLines(p));
  out << "\nFacilities (" << p.input.cluster.nodes << " nodes, " << GpuLabel(p) << ")\n";
  TextTable(out, FacilityLines(p));
  out << "\nExpected loss (gpuha sim, Llama 3 failure rates)\n";
  TextTable(out, LossLines(p.expected_loss));
  out << "\nDecision matrix (the guide's, section 6)\n";
  for (const MatrixRow& r : p.matrix) {
    out << absl::StrFormat("  %-30s %s\n", r.requirement, r.best_choice);
  }
  out << "\nWarnings\n";
  if (p.warnings.empty()) out << "  none\n";
  for (const Warning& w : p.warnings) out << "  [" << w.code << "] " << w.message << "\n";
  if (!p.input.defaults_applied.empty()) {
    out << "\nDefaults applied (not in the input)\n";
    for (const std::string& d : p.input.defaults_applied) out << "  " << d << "\n";
  }
  return out.str();
}

std::string RenderMarkdown(const Plan& p, absl::string_view source) {
  std::ostringstream out;
  out << "# gpuha plan: `" << source << "`\n\n";
  out << "**Outcome:** `" << p.outcome << "` — " << p.summary << "\n\n";
  out << "## Decision path\n\n| # | Question | Answer |\n|---|---|---|\n";
  for (size_t i = 0; i < p.path.size(); ++i) {
    out << "| " << i + 1 << " | " << QuestionText(p.path[i].question) << " | "
        << AnswerText(p.path[i]) << " |\n";
  }
  auto table = [&](const char* title, const std::vector<CapacityLine>& lines) {
    out << "\n## " << title << "\n\n| | |\n|---|---|\n";
    for (const CapacityLine& l : lines) out << "| " << l.label << " | " << l.value << " |\n";
  };
  table("Design", DesignLines(p.design));
  table(absl::StrCat("Capacity (N+", p.capacity.redundancy, ")").c_str(), CapacityLines(p));
  table(absl::StrCat("Facilities (", GpuLabel(p), ")").c_str(), FacilityLines(p));
  table("Expected loss (gpuha sim, Llama 3 failure rates)", LossLines(p.expected_loss));
  out << "\n## Decision matrix\n\n| Requirement | Best choice |\n|---|---|\n";
  for (const MatrixRow& r : p.matrix)
    out << "| " << r.requirement << " | " << r.best_choice << " |\n";
  out << "\n## Warnings\n\n";
  if (p.warnings.empty()) out << "None.\n";
  for (const Warning& w : p.warnings) out << "- **" << w.code << "**: " << w.message << "\n";
  if (!p.input.defaults_applied.empty()) {
    out << "\n## Defaults applied\n\n";
    for (const std::string& d : p.input.defaults_applied) out << "- `" << d << "`\n";
  }
  return out.str();
}

nlohmann::json RenderJson(const Plan& p) {
  using nlohmann::json;
  json path = json::array();
  for (const Decision& d : p.path) {
    path.push_back({{"question", d.question},
                    {"answer", d.is_bool ? json(d.answer == "true") : json(d.answer)}});
  }
  const Capacity& c = p.capacity;
  json warnings = json::array();
  for (const Warning& w : p.warnings)
    warnings.push_back({{"code", w.code}, {"message", w.message}});
  json matrix = json::array();
  for (const MatrixRow& r : p.matrix) {
    matrix.push_back({{"requirement", r.requirement}, {"best_choice", r.best_choice}});
  }
  return {
      {"path", path},
      {"outcome", p.outcome},
      {"summary", p.summary},
      {"design",
       {{"allocation", p.design.allocation},
        {"san", p.design.san},
        {"hba", p.design.hba},
        {"orchestration", p.design.orchestration},
        {"capacity_model", p.design.capacity_model}}},
      {"capacity",
       {{"nodes", c.nodes},
        {"gpus_per_node", c.gpus_per_node},
        {"streams_per_gpu", c.streams_per_gpu},
        {"slices_per_gpu", c.slices_per_gpu},
        {"gpu_failures_absorbed", c.gpu_failures_absorbed},
        {"slice_failures_absorbed", c.slice_failures_absorbed},
        {"total_streams", c.total_streams},
        {"redundancy", c.redundancy},
        {"max_production_streams", c.max_production_streams},
        {"failover_reserve_streams", c.failover_reserve_streams},
        {"target_streams", c.target_streams},
        {"headroom_streams", c.headroom_streams},
        {"survives_node_loss", c.survives_node_loss},
        {"nodes_needed_for_target", c.nodes_needed_for_target}}},
      {"facilities",
       {{"gpu_tdp_watts", Round1(p.facilities.gpu_tdp_watts)},
        {"powered_nodes", p.facilities.powered_nodes},
        {"it_load_watts", Round1(p.facilities.it_load_watts)},
        {"ups_va", Round1(p.facilities.ups_va)},
        {"cooling_btu_per_hour", Round1(p.facilities.cooling_btu_per_hour)}}},
      {"warnings", warnings},
      {"matrix", matrix},
      {"expected_loss",
       p.expected_loss.strategy.empty()
           ? json{{"skipped", p.expected_loss.skipped}}
           : json{{"strategy", p.expected_loss.strategy},
                  {"rates", "llama3"},
                  {"runs", p.expected_loss.runs},
                  {"stream_hours_lost_per_year",
                   Round1(p.expected_loss.stream_hours_lost_per_year)},
                  {"stream_hours_lost_per_year_ci95",
                   {Round1(p.expected_loss.lo), Round1(p.expected_loss.hi)}},
                  {"availability", p.expected_loss.availability},
                  {"overflow_events_per_year", p.expected_loss.overflow_events_per_year}}},
      {"defaults_applied", p.input.defaults_applied},
  };
}

}  // namespace gpuha::plan
