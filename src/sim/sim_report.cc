#include "sim/sim_report.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpuha::sim {
namespace {

std::string Interval(const Figure& f, const char* fmt) {
  if (f.lo == f.hi) return absl::StrFormat(fmt, f.mean);
  return absl::StrCat(absl::StrFormat(fmt, f.mean), " (", absl::StrFormat(fmt, f.lo), " .. ",
                      absl::StrFormat(fmt, f.hi), ")");
}

nlohmann::json Pair(const Figure& f) { return nlohmann::json::array({f.lo, f.hi}); }

}  // namespace

std::string RenderText(const SimResult& r, const std::string& source) {
  const SimInput& in = r.input;
  const Fleet& f = in.fleet;
  std::ostringstream o;
  o << "gpuha sim: " << source << "\n"
    << "fleet: " << f.nodes << " nodes x " << f.gpus_per_node << " GPUs x " << f.streams_per_gpu
    << " streams, N+" << f.redundancy << ", " << f.passive_nodes << " spare node(s), "
    << f.nodes_per_rack << " nodes per rack\n"
    << "runs: " << in.runs << " of " << in.horizon_years << " year(s), seed " << in.seed << "\n"
    << "failures:";
  if (in.failures.empty()) o << " none";
  o << "\n";
  for (const FailureClass& c : in.failures) {
    o << absl::StrFormat(
        "  %-12s per %-7s every %12.0f h, %s %g h   [%s]\n", c.name, ScopeName(c.scope),
        c.mtbf_hours, c.scope == Scope::kPlanned ? "window" : "repair", c.repair_hours, c.source);
  }
  // The name column fits the longest name, so a defined strategy's row lines up.
  int name_width = 12;
  for (const StrategyResult& s : r.strategies)
    name_width = std::max(name_width, static_cast<int>(s.strategy.name.size()));
  o << "\n"
    << absl::StrFormat("%-*s %-38s %16s %9s %10s %9s %9s\n", name_width, "strategy",
                       "availability (95% interval)", "stream-h lost/yr", "overflow", "idle GPUs",
                       "streams", "failures");
  for (const StrategyResult& s : r.strategies) {
    o << absl::StrFormat("%-*s %-38s %16.1f %9.1f %10d %9d %9.1f\n", name_width, s.strategy.name,
                         Interval(s.availability, "%.6f"), s.stream_hours_lost_per_year.mean,
                         s.overflow_events.mean, s.idle_gpus, s.admitted_streams, s.failures.mean);
  }
  o << "\n";
  for (const StrategyResult& s : r.strategies) {
    o << s.strategy.name << ": " << s.strategy.note << "\n";
  }
  o << absl::StrFormat("\nsimulated in %.2f s\n", r.wall_seconds);
  return o.str();
}

nlohmann::json RenderJson(const SimResult& r) {
  using nlohmann::json;
  json out;
  const SimInput& in = r.input;
  out["fleet"] = {{"nodes", in.fleet.nodes},
                  {"gpus_per_node", in.fleet.gpus_per_node},
                  {"streams_per_gpu", in.fleet.streams_per_gpu},
                  {"redundancy", in.fleet.redundancy},
                  {"passive_nodes", in.fleet.passive_nodes},
                  {"nodes_per_rack", in.fleet.nodes_per_rack}};
  out["runs"] = in.runs;
  out["seed"] = in.seed;
  out["horizon_hours"] = in.horizon_hours();
  out["wall_seconds"] = r.wall_seconds;
  json failures = json::array();
  for (const FailureClass& c : in.failures) {
    failures.push_back({{"name", c.name},
                        {"scope", ScopeName(c.scope)},
                        {"mtbf_hours", c.mtbf_hours},
                        {"repair_hours", c.repair_hours},
                        {"source", c.source}});
  }
  out["failures"] = failures;
  json strategies = json::object();
  for (const StrategyResult& s : r.strategies) {
    json j;
    auto put = [&j](const char* name, const Figure& f) {
      j[name] = f.mean;
      j[absl::StrCat(name, "_ci95")] = Pair(f);
    };
    put("availability", s.availability);
    put("stream_hours_lost", s.stream_hours_lost);
    put("stream_hours_lost_per_year", s.stream_hours_lost_per_year);
    put("demand_stream_hours", s.demand_stream_hours);
    put("capacity_availability", s.capacity_availability);
    put("overflow_events", s.overflow_events);
    put("failures", s.failures);
    put("streams_moved", s.streams_moved);
    put("maintenance_deferred", s.maintenance_deferred);
    j["idle_gpus"] = s.idle_gpus;
    j["gpus"] = s.gpus;
    j["admitted_streams"] = s.admitted_streams;
    j["unit"] = UnitName(s.strategy.unit);
    j["spares"] = SparesName(s.strategy.spares);
    j["reserve"] = s.strategy.reserve;
    j["node_gap_s"] = s.strategy.node.detect_s + s.strategy.node.restart_s;
    j["gpu_gap_s"] = s.strategy.gpu.detect_s + s.strategy.gpu.restart_s;
    j["note"] = s.strategy.note;
    strategies[s.strategy.name] = j;
  }
  out["strategies"] = strategies;
  return out;
}

std::vector<int64_t> SweepSizes(const SimInput& in) {
  if (!in.sweep_nodes.empty()) {
    std::set<int64_t> sizes(in.sweep_nodes.begin(), in.sweep_nodes.end());
    return {sizes.begin(), sizes.end()};
  }
  std::set<int64_t> sizes;
  for (int64_t d = 1; d <= 16; d *= 2) {
    int64_t n = in.fleet.nodes / d;
    if (n > in.fleet.redundancy && n > in.fleet.passive_nodes) sizes.insert(n);
  }
  return {sizes.begin(), sizes.end()};
}

namespace {

// Strategy names come from the input: escaped before they go into the SVG.
std::string Xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr const char* kColors[] = {"#d62728", "#1f77b4", "#9467bd", "#ff7f0e",
                                   "#2ca02c", "#8c564b", "#e377c2", "#17becf"};

// "Nines" of availability: 0.999 is 3. Capped at 9 (no loss seen).
double Nines(double availability) {
  return std::min(9.0, -std::log10(std::max(1e-9, 1 - availability)));
}

struct Panel {
  double x0, y0, w, h;  // plot area
  double lo, hi;        // y range
  std::string title, y_label;
};

void DrawPanel(std::ostringstream& o, const Panel& p, const std::vector<int64_t>& sizes,
               const std::vector<std::vector<double>>& series,
               const std::vector<std::string>& names) {
  auto x_of = [&](size_t i) {
    return sizes.size() == 1 ? p.x0 + p.w / 2
                             : p.x0 + p.w * static_cast<double>(i) / (sizes.size() - 1);
  };
  auto y_of = [&](double v) {
    double span = p.hi > p.lo ? p.hi - p.lo : 1;
    return p.y0 + p.h - p.h * (std::clamp(v, p.lo, p.hi) - p.lo) / span;
  };
  o << absl::StrFormat("<text x='%.0f' y='%.0f' font-size='14' font-weight='bold'>%s</text>\n",
                       p.x0, p.y0 - 12, p.title);
  o << absl::StrFormat(
      "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' stroke='#888'/>\n", p.x0,
      p.y0, p.w, p.h);
  for (int t = 0; t <= 4; ++t) {
    double v = p.lo + (p.hi - p.lo) * t / 4;
    double y = y_of(v);
    o << absl::StrFormat(
        "<line x1='%.0f' y1='%.1f' x2='%.0f' y2='%.1f' stroke='#ddd'/>"
        "<text x='%.0f' y='%.1f' font-size='11' text-anchor='end'>%s</text>\n",
        p.x0, y, p.x0 + p.w, y, p.x0 - 6, y + 4, absl::StrFormat("%.4g", v));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    o << absl::StrFormat("<text x='%.1f' y='%.0f' font-size='11' text-anchor='middle'>%d</text>\n",
                         x_of(i), p.y0 + p.h + 16, sizes[i]);
  }
  o << absl::StrFormat(
      "<text x='%.0f' y='%.0f' font-size='12' text-anchor='middle'>nodes in the fleet</text>\n",
      p.x0 + p.w / 2, p.y0 + p.h + 34);
  o << absl::StrFormat(
      "<text x='%.0f' y='%.0f' font-size='12' text-anchor='middle' "
      "transform='rotate(-90 %.0f %.0f)'>%s</text>\n",
      p.x0 - 44, p.y0 + p.h / 2, p.x0 - 44, p.y0 + p.h / 2, p.y_label);
  for (size_t s = 0; s < series.size(); ++s) {
    const char* color = kColors[s % std::size(kColors)];
    std::string points;
    for (size_t i = 0; i < series[s].size(); ++i) {
      absl::StrAppend(&points, absl::StrFormat("%.1f,%.1f ", x_of(i), y_of(series[s][i])));
      o << absl::StrFormat(
          "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'><title>%s %d: %.6g"
          "</title></circle>\n",
          x_of(i), y_of(series[s][i]), color, Xml(names[s]), sizes[i], series[s][i]);
    }
    o << absl::StrFormat("<polyline points='%s' fill='none' stroke='%s' stroke-width='2'/>\n",
                         points, color);
  }
}

}  // namespace

std::string RenderSvg(const std::vector<SimResult>& sweep) {
  std::vector<int64_t> sizes;
  for (const SimResult& r : sweep) sizes.push_back(r.input.fleet.nodes);
  std::vector<std::string> names;
  if (!sweep.empty()) {
    for (const StrategyResult& s : sweep.front().strategies) names.push_back(s.strategy.name);
  }
  std::vector<std::vector<double>> nines(names.size()), idle(names.size());
  double max_nines = 1, max_idle = 1;
  for (const SimResult& r : sweep) {
    for (size_t s = 0; s < r.strategies.size() && s < names.size(); ++s) {
      nines[s].push_back(Nines(r.strategies[s].availability.mean));
      idle[s].push_back(static_cast<double>(r.strategies[s].idle_gpus));
      max_nines = std::max(max_nines, nines[s].back());
      max_idle = std::max(max_idle, idle[s].back());
    }
  }
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='1040' height='440' "
       "font-family='sans-serif'>\n<rect width='1040' height='440' fill='white'/>\n";
  if (!sweep.empty()) {
    const SimInput& in = sweep.front().input;
    o << absl::StrFormat(
        "<text x='20' y='22' font-size='13'>gpuha sim: %d GPUs per node, %d streams per GPU, "
        "N+%d, %d spare node(s), %d run(s) of %g year(s), seed %d</text>\n",
        in.fleet.gpus_per_node, in.fleet.streams_per_gpu, in.fleet.redundancy,
        in.fleet.passive_nodes, in.runs, in.horizon_years, in.seed);
  }
  DrawPanel(o,
            {.x0 = 80,
             .y0 = 60,
             .w = 380,
             .h = 280,
             .lo = 0,
             .hi = std::ceil(max_nines),
             .title = "Availability (stream-hours served / demanded)",
             .y_label = "nines (3 = 99.9%)"},
            sizes, nines, names);
  DrawPanel(o,
            {.x0 = 600,
             .y0 = 60,
             .w = 380,
             .h = 280,
             .lo = 0,
             .hi = max_idle,
             .title = "Idle GPUs (holding no streams)",
             .y_label = "GPUs"},
            sizes, idle, names);
  for (size_t s = 0; s < names.size(); ++s) {
    double x = 80 + 150 * static_cast<double>(s);
    o << absl::StrFormat(
        "<line x1='%.0f' y1='410' x2='%.0f' y2='410' stroke='%s' stroke-width='3'/>"
        "<text x='%.0f' y='414' font-size='12'>%s</text>\n",
        x, x + 24, kColors[s % std::size(kColors)], x + 30, Xml(names[s]));
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace gpuha::sim
