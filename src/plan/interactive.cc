#include "plan/interactive.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu/gpu_models.h"

namespace gpuha::plan {
namespace {

class Asker {
 public:
  Asker(std::istream& in, std::ostream& out) : in_(in), out_(out) {}

  bool eof() const { return eof_; }

  // Asks until `accept` takes the answer (returns an empty string) or input ends.
  void Ask(const std::string& prompt, const std::string& default_value,
           const std::function<std::string(const std::string&)>& accept) {
    while (!eof_) {
      out_ << prompt << (default_value.empty() ? "" : absl::StrCat(" [", default_value, "]"))
           << ": " << std::flush;
      std::string line;
      if (!std::getline(in_, line)) {
        eof_ = true;
        out_ << "\n";
        return;
      }
      std::string answer(absl::StripAsciiWhitespace(line));
      if (answer.empty()) answer = default_value;
      if (answer.empty()) {
        out_ << "  an answer is required\n";
        continue;
      }
      std::string error = accept(answer);
      if (error.empty()) return;
      out_ << "  " << error << "\n";
    }
  }

  void Bool(const std::string& prompt, bool* value) {
    Ask(prompt, *value ? "yes" : "no", [&](const std::string& a) -> std::string {
      std::string s = absl::AsciiStrToLower(a);
      if (s == "y" || s == "yes" || s == "true")
        *value = true;
      else if (s == "n" || s == "no" || s == "false")
        *value = false;
      else
        return absl::StrCat("'", a, "': answer yes or no");
      return "";
    });
  }

  void Int(const std::string& prompt, int64_t* value, int64_t min, int64_t max,
           bool has_default = true) {
    Ask(prompt, has_default ? absl::StrCat(*value) : "", [&](const std::string& a) -> std::string {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(a.data(), a.data() + a.size(), v);
      if (ec != std::errc() || end != a.data() + a.size()) {
        return absl::StrCat("'", a, "' is not a whole number");
      }
      if (v < min || v > max) return absl::StrCat("must be between ", min, " and ", max);
      *value = v;
      return "";
    });
  }

  void Number(const std::string& prompt, double* value, double min, double max) {
    Ask(prompt, absl::StrCat(*value), [&](const std::string& a) -> std::string {
      char* end = nullptr;
      double v = std::strtod(a.c_str(), &end);
      if (end != a.c_str() + a.size() || !std::isfinite(v)) {
        return absl::StrCat("'", a, "' is not a number");
      }
      if (v < min || v > max) return absl::StrCat("must be between ", min, " and ", max);
      *value = v;
      return "";
    });
  }

  void Choice(const std::string& prompt, const std::vector<std::string>& choices,
              std::string* value) {
    Ask(absl::StrCat(prompt, " (", absl::StrJoin(choices, "/"), ")"), *value,
        [&](const std::string& a) -> std::string {
          std::string s = absl::AsciiStrToLower(a);
          for (const std::string& c : choices) {
            if (c == s) {
              *value = c;
              return "";
            }
          }
          return absl::StrCat("'", a, "': choose one of ", absl::StrJoin(choices, ", "));
        });
  }

 private:
  std::istream& in_;
  std::ostream& out_;
  bool eof_ = false;
};

}  // namespace

absl::StatusOr<PlanInput> AskPlanInput(std::istream& in, std::ostream& out) {
  PlanInput p;
  Asker ask(in, out);
  out << "gpuha plan: answer each question; Enter takes the value in brackets.\n\n";
  ask.Bool("Is the GPU workload stateless (CV inference, analytics, AI inference)?",
           &p.workload.stateless);
  ask.Bool("Is zero or near-zero downtime required (< 1 min, no restart allowed)?",
           &p.workload.zero_downtime);
  ask.Number("How many minutes of restart can the application tolerate?",
             &p.workload.restart_tolerance_minutes, 0, 10080);
  ask.Number("How many minutes does a restart on another node take?",
             &p.workload.expected_restart_minutes, 0.01, 10080);
  ask.Bool("Is VM-level HA mandatory by infra policy?", &p.policy.vm_ha_mandatory);
  ask.Bool("Do you want GPU sharing across workloads?", &p.policy.gpu_sharing);
  if (p.policy.gpu_sharing) {
    ask.Bool("Is the cost of sharing (vGPU license) justified?", &p.policy.sharing_cost_justified);
  }
  ask.Bool("Is the budget constrained?", &p.policy.budget_constrained);
  std::string san(SanTypeName(p.san));
  ask.Choice("Shared storage", {"none", "fc", "iscsi"}, &san);
  p.san = san == "fc" ? SanType::kFc : san == "iscsi" ? SanType::kIscsi : SanType::kNone;
  p.cluster.gpu = "L4";
  ask.Ask("GPU model", p.cluster.gpu, [&](const std::string& a) {
    p.cluster.gpu = a;
    return std::string();
  });
  if (!ask.eof() && gpu::FindGpuModel(p.cluster.gpu) == nullptr) {
    double tdp = 300;
    ask.Number(absl::StrCat("'", p.cluster.gpu, "' is not in the table; its TDP in watts"), &tdp, 1,
               2000);
    p.cluster.tdp_watts = tdp;
  }
  p.cluster.nodes = 3;
  p.cluster.streams_per_gpu = 10;
  ask.Int("GPU nodes", &p.cluster.nodes, 1, 100'000);
  ask.Int("GPUs per node", &p.cluster.gpus_per_node, 1, 64);
  ask.Int("Streams one GPU carries", &p.cluster.streams_per_gpu, 1, 1'000'000);
  ask.Int("Nodes the cluster must survive losing (k of N+k)", &p.cluster.redundancy, 0,
          p.cluster.nodes - 1);
  ask.Int("Target production streams", &p.cluster.target_streams, 0, 100'000'000,
          /*has_default=*/false);
  std::string buffer(BufferNodeName(p.cluster.buffer_node));
  ask.Choice("Buffer node", {"none", "cpu", "gpu"}, &buffer);
  p.cluster.buffer_node = buffer == "cpu"   ? BufferNode::kCpu
                          : buffer == "gpu" ? BufferNode::kGpu
                                            : BufferNode::kNone;
  ask.Number("Host power per node, watts, without GPUs", &p.facilities.host_watts, 0, 20000);
  ask.Number("GPU power surge factor", &p.facilities.surge_factor, 1, 3);
  ask.Number("UPS power factor", &p.facilities.ups_power_factor, 0.01, 1);
  ask.Number("UPS headroom (0.25 = 25%)", &p.facilities.ups_headroom, 0, 2);
  if (ask.eof()) {
    return absl::InvalidArgumentError("interactive input ended before every question was answered");
  }
  // One validation path: the answers go through the same parser as a file.
  return ParsePlanInput(PlanInputToYaml(p), "<interactive>");
}

}  // namespace gpuha::plan
