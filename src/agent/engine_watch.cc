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

// The value of label `key` in a sample line's label set, if it has one.
std::optional<std::string_view> LabelOf(std::string_view line, std::string_view key) {
  const size_t open = line.find('{');
  const size_t close = line.rfind('}');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return std::nullopt;
  }
  std::string_view labels = line.substr(open + 1, close - open - 1);
  for (size_t at = 0; (at = labels.find(key, at)) != std::string_view::npos; at += key.size()) {
    const bool starts = at == 0 || labels[at - 1] == ',';
    std::string_view rest = labels.substr(at + key.size());
    if (!starts || rest.substr(0, 2) != "=\"") continue;
    rest.remove_prefix(2);
    return rest.substr(0, rest.find('"'));
  }
  return std::nullopt;
}

// What a sample line tells of request outcomes.
enum class Outcome { kNone, kSuccess, kFailure };

// Triton labels its failures with a reason (since 24.05): REJECTED (queue
// full, a timeout in queue), CANCELED (by the client) and OTHER (bad input,
// an unknown output) are the load's or the client's, and a client sending
// bad requests to a quiet node must not make it look broken; BACKEND is the
// engine's. A failure without the label (an older Triton) counts.
Outcome TritonOutcome(std::string_view line, bool failure) {
  if (!failure) return Outcome::kSuccess;
  std::optional<std::string_view> reason = LabelOf(line, "reason");
  return !reason || *reason == "BACKEND" ? Outcome::kFailure : Outcome::kNone;
}
// TGI's tgi_request_failure{err}: "generation" (its shards failed) and
// "incomplete" (an answer ended before its end) are the engine's;
// validation, overloaded, dropped, cancelled and timeout are the client's
// or the load's.
Outcome TgiOutcome(std::string_view line, bool failure) {
  if (!failure) return Outcome::kSuccess;
  std::optional<std::string_view> err = LabelOf(line, "err");
  return err && (*err == "generation" || *err == "incomplete") ? Outcome::kFailure : Outcome::kNone;
}
// An API server's answers by status (vLLM's, through
// prometheus-fastapi-instrumentator): "2xx" (or "200") a success, "5xx" (or
// "500") a failure. Grouped classes cannot tell a 503 of load from a 500 of
// the engine; a server that is only overloaded still succeeds, and the
// failing rule needs a second with no success at all. Only POSTs count:
// inference is posted, and a probe's GET /v1/models answering 200 must not
// pass for a success.
Outcome HttpOutcome(std::string_view line, bool) {
  if (std::optional<std::string_view> m = LabelOf(line, "method"); m && *m != "POST") {
    return Outcome::kNone;
  }
  std::optional<std::string_view> status = LabelOf(line, "status");
  if (!status || status->empty()) return Outcome::kNone;
  return (*status)[0] == '2'   ? Outcome::kSuccess
         : (*status)[0] == '5' ? Outcome::kFailure
                               : Outcome::kNone;
}

}  // namespace

std::optional<EngineSample> ParseEngineMetrics(std::string_view text) {
  enum Role { kPending, kGenerating, kProgress };
  struct Family {
    std::string_view name;
    Role role;  // kGenerating counts as pending too
  };
  static constexpr Family kFamilies[] = {
      {"nv_inference_pending_request_count", kPending},  // Triton
      {"nv_inference_exec_count", kProgress},
      {"vllm:num_requests_running", kGenerating},  // vLLM
      {"vllm:num_requests_waiting", kPending},
      {"vllm:generation_tokens_total", kProgress},
      {"vllm:prompt_tokens_total", kProgress},   // prefill and pooling models
      {"sglang:num_running_reqs", kGenerating},  // SGLang
      {"sglang:num_queue_reqs", kPending},
      {"sglang:generation_tokens_total", kProgress},
      {"sglang:prompt_tokens_total", kProgress},
      {"tgi_batch_current_size", kGenerating},  // TGI
      {"tgi_queue_size", kPending},
      {"tgi_batch_inference_success", kProgress},  // forward passes, prefill and decode
  };
  // Request outcomes (the failing rule, FailureWatch), by source: the
  // first source an engine exports is the one read (an engine's own count
  // tells its failures from its clients' better than HTTP status classes).
  struct OutcomeFamily {
    std::string_view name;
    int source;  // 0 Triton, 1 TGI, 2 HTTP
    bool failure;
    Outcome (*read)(std::string_view line, bool failure);
  };
  static constexpr OutcomeFamily kOutcomes[] = {
      {"nv_inference_request_success", 0, false, TritonOutcome},
      {"nv_inference_request_failure", 0, true, TritonOutcome},
      {"tgi_request_success", 1, false, TgiOutcome},
      {"tgi_request_failure", 1, true, TgiOutcome},
      {"http_requests_total", 2, false, HttpOutcome},
  };
  EngineSample sum;
  bool progress = false;
  struct Outcomes {
    bool seen = false;
    double succeeded = 0, failed = 0;
  } outcomes[3];
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line[0] == '#') continue;
    for (const OutcomeFamily& f : kOutcomes) {
      std::optional<double> v = SampleOf(line, f.name);
      if (!v) continue;
      Outcomes& o = outcomes[f.source];
      o.seen = true;
      switch (f.read(line, f.failure)) {
        case Outcome::kSuccess:
          o.succeeded += *v;
          break;
        case Outcome::kFailure:
          o.failed += *v;
          break;
        case Outcome::kNone:
          break;
      }
    }
    for (const Family& f : kFamilies) {
      std::optional<double> v = SampleOf(line, f.name);
      if (!v) continue;
      (f.role == kProgress ? sum.progress : sum.pending) += *v;
      if (f.role == kGenerating) sum.generating += *v;
      progress |= f.role == kProgress;
    }
  }
  // An engine that exports several kinds (Triton's vLLM backend, gpuha's
  // worker) is judged on the sum: work pending of any kind and none done.
  sum.has_progress = progress;
  for (const Outcomes& o : outcomes) {
    if (!o.seen) continue;
    sum.has_outcomes = true;
    sum.succeeded = o.succeeded;
    sum.failed = o.failed;
    break;
  }
  if (!sum.has_progress && !sum.has_outcomes) return std::nullopt;
  return sum;
}

}  // namespace gpuha::agent
