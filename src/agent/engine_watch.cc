#include "agent/engine_watch.h"

#include <cstdlib>
#include <string>

namespace gpuha::agent {
namespace {

// The value of one sample line "name{labels} value [timestamp]" when it
// belongs to family `name`; nullopt otherwise.
std::optional<double> SampleOf(std::string_view line, std::string_view name) {
  if (line.substr(0, name.size()) != name) return std::nullopt;
  std::string_view rest = line.substr(name.size());
  if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) return std::nullopt;  // a longer name
  if (rest[0] == '{') {
    size_t close = rest.rfind('}');
    if (close == std::string_view::npos) return std::nullopt;
    rest = rest.substr(close + 1);
  }
  while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
  std::string value(rest.substr(0, rest.find(' ')));
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str()) return std::nullopt;
  return v;
}

// Whether a failure sample is the engine's. Triton labels its failures
// with a reason (since 24.05): REJECTED (queue full, a timeout in queue),
// CANCELED (by the client) and OTHER (bad input, an unknown output) are
// the load's or the client's, and a client sending bad requests to a quiet
// node must not make it look broken; BACKEND is the engine's. A failure
// without the label (an older Triton) counts.
bool EnginesFailure(std::string_view line) {
  const size_t at = line.find("reason=\"");
  if (at == std::string_view::npos || at > line.find('}') ||
      (line[at - 1] != '{' && line[at - 1] != ',')) {
    return true;
  }
  return line.substr(at + 8, 8) == "BACKEND\"";
}

}  // namespace

std::optional<EngineSample> ParseEngineMetrics(std::string_view text) {
  struct Family {
    std::string_view name;
    bool progress;  // else pending
    bool triton;
    bool generating = false;  // also counted as requests generating tokens
  };
  static constexpr Family kFamilies[] = {
      {"nv_inference_pending_request_count", false, true},
      {"nv_inference_exec_count", true, true},
      {"vllm:num_requests_running", false, false, true},
      {"vllm:num_requests_waiting", false, false},
      {"vllm:generation_tokens_total", true, false},
      {"vllm:prompt_tokens_total", true, false},  // prefill and pooling models
  };
  EngineSample triton, vllm;
  bool triton_progress = false, vllm_progress = false;
  // Triton's request outcomes (the failing rule, FailureWatch).
  static constexpr std::string_view kSuccess = "nv_inference_request_success";
  static constexpr std::string_view kFailure = "nv_inference_request_failure";
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line[0] == '#') continue;
    for (auto [name, into] : {std::pair{kSuccess, &triton.succeeded}, {kFailure, &triton.failed}}) {
      if (std::optional<double> v = SampleOf(line, name)) {
        triton.has_outcomes = true;
        if (into == &triton.failed && !EnginesFailure(line)) continue;
        *into += *v;
      }
    }
    for (const Family& f : kFamilies) {
      std::optional<double> v = SampleOf(line, f.name);
      if (!v) continue;
      EngineSample& s = f.triton ? triton : vllm;
      (f.progress ? s.progress : s.pending) += *v;
      if (f.generating) s.generating += *v;
      (f.triton ? triton_progress : vllm_progress) |= f.progress;
    }
  }
  // An engine that exports both (Triton's vLLM backend, gpuha's worker)
  // is judged on the sum: work pending of either kind and none done of any.
  if (!triton_progress && !vllm_progress) return std::nullopt;
  EngineSample sum;
  if (triton_progress) sum = triton;
  sum.has_outcomes = triton.has_outcomes;
  sum.succeeded = triton.succeeded;
  sum.failed = triton.failed;
  if (vllm_progress) {
    sum.pending += vllm.pending;
    sum.progress += vllm.progress;
    sum.generating = vllm.generating;
  }
  return sum;
}

}  // namespace gpuha::agent
