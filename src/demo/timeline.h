// The demo's per-fault timeline, and the pure function that reads the
// controller's steps of it from the controller's events.
//
//   FaultTimeline t;
//   ControllerSteps(events, "gpu-2", injected_unix_ns, &t);   // detected, fenced, ...
//
// The walk over the events is the controller's own (FailoverTimings), so the
// demo and the API's /failovers agree on what each step is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/events.h"

namespace gpuha::demo {

// Milliseconds after the fault was injected; nullopt when it did not happen
// inside the observation window.
struct FaultTimeline {
  std::string fault;
  std::string node;        // the node hit
  size_t streams_hit = 0;  // streams it was primary for
  // A GPU's fault: the streams on the node's other GPUs, and how many of
  // them kept their GPU while the fault lasted.
  std::optional<size_t> node_streams, node_streams_kept;
  std::optional<double> detected_ms, fenced_ms, routes_pushed_ms, routers_acked_ms,
      first_standby_ms;
  uint64_t answered = 0;         // answers from injection until the next fault
  uint64_t failed = 0;           // failed answers in the same span
  double max_gap_ms = 0;         // longest stretch with no answer on a hit stream
  bool routes_unchanged = true;  // control-plane faults, agent-restart: same primaries after
  size_t taken_out = 0;          // nodes the controller took out (`detected`) meanwhile
  size_t quarantine_held = 0;    // verdicts the quarantine breaker held (`quarantine_held`)
  size_t moved_back = 0;         // hit streams whose primary is the node again after it rejoined
  int64_t unplaced_streams = 0;  // the controller's count while the fault lasted
  // The controller pushed the new routes before it fenced the node
  // (make-before-break, as a drain does); nullopt when either step is missing.
  std::optional<bool> routes_before_fence;
  bool held_out = false;         // the node stayed out after its repair (flapped too often)
  bool routers_reacked = false;  // controller-restart: every router acknowledged the new one
  // Control-plane faults: from the fault to the first act (its
  // controller_started event) of the controller that leads after it.
  std::optional<double> takeover_ms;
  // etcd-quorum-loss: when the leading controller stopped acting (its lease
  // could not be renewed), after the fault.
  std::optional<double> leader_stopped_ms;
  // LLM token streams in the same span: answers, failed ones, and answers
  // the router continued on the standby mid-answer.
  uint64_t llm_answered = 0, llm_failed = 0, llm_continued = 0;
  // KServe v2 gRPC in the same span: unary calls, and stream messages.
  uint64_t grpc_answered = 0, grpc_failed = 0;
  uint64_t grpc_stream_answered = 0, grpc_stream_failed = 0;
  // train-crash: from the fault to the job's fence confirmed, from there to
  // its start on another node, and the steps its last placement had done
  // past the checkpoint the next one resumed from.
  std::optional<double> job_fenced_ms, job_started_ms;
  std::optional<int64_t> steps_lost;
  // router-restart: per router, from its new process's start to its
  // listeners taken (the old one then drained).
  std::vector<double> router_taken_ms;
  std::string note;
};

// "12.3" milliseconds, or "-" for a step that did not happen.
std::string Ms(const std::optional<double>& v);

// Fills detected, fenced, routes pushed and routers acknowledged from the
// first failover of `node` in `events`, in milliseconds after `t0_unix_ns`
// (the injection), by the events' wall clock.
void ControllerSteps(const std::vector<api::Event>& events, const std::string& node,
                     int64_t t0_unix_ns, FaultTimeline* t);
// The same for a GPU taken out alone (its `gpu_out` event): detected, routes
// pushed and acknowledged; no fence, the node serves on.
void GpuSteps(const std::vector<api::Event>& events, const std::string& node, int64_t t0_unix_ns,
              FaultTimeline* t);

}  // namespace gpuha::demo
