// The demo's report: the summary table, requests lost, and the JSON that
// `--json` writes and the chaos tests read.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "demo/demo.h"

namespace gpuha::demo {

using nlohmann::json;

std::string DemoReport::Text() const {
  std::string out = absl::StrFormat("%-19s %-14s %7s %9s %7s %8s %8s %9s %7s %8s %7s\n", "fault",
                                    "node", "streams", "detected", "fenced", "routes", "acked",
                                    "standby", "failed", "gap", "grpc");
  for (const FaultTimeline& t : faults) {
    absl::StrAppend(&out, absl::StrFormat("%-19s %-14s %7d %9s %7s %8s %8s %9s %7d %8.1f %7d\n",
                                          t.fault, t.node, t.streams_hit, Ms(t.detected_ms),
                                          Ms(t.fenced_ms), Ms(t.routes_pushed_ms),
                                          Ms(t.routers_acked_ms), Ms(t.first_standby_ms), t.failed,
                                          t.max_gap_ms, t.grpc_failed + t.grpc_stream_failed));
  }
  absl::StrAppend(&out,
                  "(milliseconds after the fault; standby = first request served by the "
                  "standby; gap = longest stretch with no answer on a stream the fault hit; "
                  "grpc = gRPC calls and stream messages failed)\n");
  for (const FaultTimeline& t : faults) {
    if (t.node_streams_kept) {
      absl::StrAppend(&out, absl::StrFormat("%s (%s): %d of the node's %d other streams kept "
                                            "their GPU (node_streams_kept); %d node(s) taken out\n",
                                            t.fault, t.node, *t.node_streams_kept,
                                            t.node_streams.value_or(0), t.taken_out));
    }
    if (t.takeover_ms) {
      absl::StrAppend(&out, absl::StrFormat("%s (%s): takeover_ms %.1f (to the first act of the "
                                            "controller that leads after it)\n",
                                            t.fault, t.node, *t.takeover_ms));
    }
  }
  if (train_step) {
    absl::StrAppend(&out, absl::StrFormat("training job: stopped at step %d; its state %s a run "
                                          "that never failed\n",
                                          *train_step,
                                          train_exact.value_or(false) ? "equals" : "DIFFERS FROM"));
  }
  absl::StrAppend(&out, load.Text());
  if (llm.sent > 0) {
    uint64_t continued = 0;
    for (const FaultTimeline& t : faults) continued += t.llm_continued;
    absl::StrAppend(&out,
                    absl::StrFormat("LLM token streams: %d answers checked whole, %d failed; %d "
                                    "continued on the standby mid-answer\n",
                                    llm.ok, llm.failed, continued),
                    llm.Text());
  }
  if (grpc.sent > 0) {
    absl::StrAppend(&out, "KServe v2 gRPC, unary ModelInfer calls:\n", grpc.Text());
  }
  if (grpc_stream.sent > 0) {
    absl::StrAppend(&out,
                    "KServe v2 gRPC streams, ModelStreamInfer messages (one answer each, in "
                    "order):\n",
                    grpc_stream.Text());
  }
  absl::StrAppend(&out, absl::StrFormat("requests lost: %d", Lost()));
  const uint64_t failed = load.failed + llm.failed + grpc.failed + grpc_stream.failed;
  if (uint64_t by_design = failed - Lost(); by_design > 0) {
    absl::StrAppend(&out, absl::StrFormat(" (%d more answered no_capacity: streams past "
                                          "what N+1 covers, by design)",
                                          by_design));
  }
  absl::StrAppend(&out, "\n");
  return out;
}

uint64_t DemoReport::Lost() const {
  // The router's clear refusal (no_capacity) of a stream past what the
  // cluster can place is by design; anything else that failed is lost.
  auto lost = [](const load::LoadReport& r, const char* by_design) {
    uint64_t n = r.failed;
    for (const auto& [reason, count] : r.failures) {
      if (reason.rfind(by_design, 0) == 0) n -= count;
    }
    return n;
  };
  return lost(load, "http_503 no_capacity") + lost(llm, "http_503 no_capacity") +
         lost(grpc, "grpc UNAVAILABLE no_capacity") +
         lost(grpc_stream, "grpc stream UNAVAILABLE no_capacity");
}

std::string DemoReport::Json() const {
  json faults_json = json::array();
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  for (const FaultTimeline& t : faults) {
    faults_json.push_back(
        {{"fault", t.fault},
         {"node", t.node},
         {"streams_hit", t.streams_hit},
         {"node_streams", t.node_streams ? json(*t.node_streams) : json(nullptr)},
         {"node_streams_kept", t.node_streams_kept ? json(*t.node_streams_kept) : json(nullptr)},
         {"detected_ms", opt(t.detected_ms)},
         {"fenced_ms", opt(t.fenced_ms)},
         {"routes_pushed_ms", opt(t.routes_pushed_ms)},
         {"routers_acked_ms", opt(t.routers_acked_ms)},
         {"first_standby_ms", opt(t.first_standby_ms)},
         {"answered", t.answered},
         {"failed", t.failed},
         {"max_gap_ms", t.max_gap_ms},
         {"routes_unchanged", t.routes_unchanged},
         {"taken_out", t.taken_out},
         {"quarantine_held", t.quarantine_held},
         {"moved_back", t.moved_back},
         {"unplaced_streams", t.unplaced_streams},
         {"routes_before_fence",
          t.routes_before_fence ? json(*t.routes_before_fence) : json(nullptr)},
         {"held_out", t.held_out},
         {"routers_reacked", t.routers_reacked},
         {"takeover_ms", opt(t.takeover_ms)},
         {"leader_stopped_ms", opt(t.leader_stopped_ms)},
         {"llm_answered", t.llm_answered},
         {"llm_failed", t.llm_failed},
         {"llm_continued", t.llm_continued},
         {"grpc_answered", t.grpc_answered},
         {"grpc_failed", t.grpc_failed},
         {"grpc_stream_answered", t.grpc_stream_answered},
         {"grpc_stream_failed", t.grpc_stream_failed},
         {"job_fenced_ms", opt(t.job_fenced_ms)},
         {"job_started_ms", opt(t.job_started_ms)},
         {"steps_lost", t.steps_lost ? json(*t.steps_lost) : json(nullptr)},
         {"router_taken_ms", t.router_taken_ms},
         {"note", t.note}});
  }
  return json{{"faults", faults_json},
              {"load", json::parse(load.Json(), nullptr, false)},
              {"llm", llm.sent > 0 ? json::parse(llm.Json(), nullptr, false) : json(nullptr)},
              {"grpc", grpc.sent > 0 ? json::parse(grpc.Json(), nullptr, false) : json(nullptr)},
              {"grpc_stream", grpc_stream.sent > 0 ? json::parse(grpc_stream.Json(), nullptr, false)
                                                   : json(nullptr)},
              {"lost", Lost()},
              {"train_step", train_step ? json(*train_step) : json(nullptr)},
              {"train_exact", train_exact ? json(*train_exact) : json(nullptr)}}
      .dump(2);
}

}  // namespace gpuha::demo
