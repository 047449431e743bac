// `gpuha demo`: the whole system on loopback in one command. It starts a
// controller (SQLite store in a temporary folder), a router and four agents
// with one simulated L4 each (three active, one passive: N+1), each agent
// supervising a `gpuha worker`; admits streams; runs checked KServe load
// through the router; injects faults one after another; and prints, per
// fault, a timeline (injected, detected, fenced, routes pushed, routers
// acknowledged, first request served by the standby) and the requests lost.
//
// Faults (in this order by default):
//   crash        kill -9 of a node's agent and its worker
//   train-crash  (--train) kill -9 of the node running the training job (its
//                agent, worker and job): the job restarts on another node
//                once the fence hook confirms the node is off, from its
//                last complete checkpoint; the report gives fault to fenced,
//                fenced to started, the steps lost, and at the end whether
//                the job's state equals a run that never failed
//   gpu-xid48    (--gpus-per-node 2+) XID 48, an uncorrectable ECC error, on
//                GPU 1 of the busiest node: that GPU's streams move, the
//                node's other GPUs keep theirs; the report says how many
//                stayed (node_streams_kept). The repair reboots the node.
//   mig-lost     (--mig-per-gpu 1+) the busiest MIG instance of the busiest
//                node is destroyed: that slice's streams move, the node's
//                other slices keep theirs (node_streams_kept); the repair
//                resets the sim GPU, which brings the instance back (on real
//                hardware a recreated instance has a new UUID)
//   xid-flood    XID 74 (NVLink, a drain) on every node at once: the
//                quarantine breaker (fence.quarantine_max_share, 0.5) takes
//                half the nodes out and holds the rest serving; each node
//                is then rebooted in turn, the ones out first
//   xid79        XID 79 (GPU fallen off the bus) on the node's GPU
//   thermal      a temperature ramp to 95 C: a proactive drain
//   agent-hang   SIGSTOP of the agent (its worker keeps running)
//   server-hang  SIGSTOP of the worker alone, its agent healthy
//   worker-kill  kill -9 of the worker alone, mid-answer for the LLM streams
//                on it: the router continues each answer on the standby;
//                the agent restarts the worker
//   controller-restart  kill -9 of the controller and a restart: routes
//                must not change and no request may fail
//   leader-kill  (--ha) kill -9 of the leading controller: a standby leads
//                once its lease runs out; the report gives takeover_ms, from
//                the kill to the new leader's first act
//   etcd-leader-kill  (--ha) kill -9 of the etcd member leading the raft
//   etcd-quorum-loss  (--ha) two of the three etcd members killed, then
//                started: the leading controller stops acting, the data
//                plane serves on its last routes, a controller leads again
//                once etcd has quorum
//   double-crash kill -9 of the two busiest nodes at once: more than N+1
//                covers. Streams beyond what is left get the router's 503
//                (no_capacity) and the controller reports them unplaced.
//   half-hang    the worker's inference stuck while its health and metrics
//                answer (pending grows, nothing executes): the router judges
//                it by progress and re-sends to the standbys; the agent's
//                engine watch reports the server stalled
//   error-burst  the worker answers every inference 500 while ready says
//                200: the router re-sends each to the standby and ejects it;
//                the agent's failure watch (only failures for a second)
//                reports the server not ready, and the node fails over
//   driver-hang  every GPU probe call on GPU 0 blocks (NVML stuck in the
//                kernel): the agent's watchdog fails the GPU after 500 ms
//                while its heartbeats go on; the node fails over
//   gpu-vanish   GPU 0 leaves the node's (fake) sysfs PCI tree, as a GPU that
//                fell off the bus: the agent fails it at its next sample
//   router-restart  each router restarted in turn through its handoff
//                socket (a rolling upgrade of the data plane): the new
//                process takes the listeners, the old one drains and exits;
//                nothing may fail
//   router-kill  (--routers 2+) kill -9 of the first router: the load goes
//                on to the next router on its list, re-sending what got no
//                byte back; only what the killed router had begun answering
//                (an LLM answer, a gRPC call) can fail. The repair starts it.
//   partition    (root only) gpu-1 runs in its own network namespace, linked
//                by a veth pair; its link goes down, so packets vanish both
//                ways with no reset. The controller then listens on the
//                veth's 10.213.0.1: run the demo inside a namespace of its
//                own (`ip netns exec`) to keep the host's network untouched.
// Each fault hits the node serving the most streams; between faults the node
// is repaired (agent restarted, or SIGCONT) and waits to rejoin as the spare.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "demo/timeline.h"
#include "load/load.h"

namespace gpuha::demo {

// The default sequence; "double-crash" (two nodes at once, past N+1) is extra.
inline const std::vector<std::string> kDefaultFaults = {
    "crash", "xid79", "thermal", "agent-hang", "server-hang", "controller-restart"};
// With --train and no --faults: the defaults, then the training job's node.
inline const std::vector<std::string> kTrainFaults = {"train-crash", "crash", "xid79", "agent-hang",
                                                      "controller-restart"};
// With --ha (three controllers on a three-member etcd cluster): the control
// plane's faults, and a node crash under the leader that took over.
inline const std::vector<std::string> kHaFaults = {"leader-kill", "crash", "etcd-leader-kill",
                                                   "etcd-quorum-loss"};
// With --gpus-per-node 2 or more: one GPU's fault, then a whole node's.
inline const std::vector<std::string> kGpuFaults = {"gpu-xid48", "crash"};
// With --mig-per-gpu 1 or more: one MIG instance lost, then a whole node.
inline const std::vector<std::string> kMigFaults = {"mig-lost", "crash"};
// Every fault the demo knows, from its fault table.
std::vector<std::string> FaultNames();

struct DemoOptions {
  std::string exe;  // the gpuha binary, run for every component
  std::vector<std::string> faults = kDefaultFaults;
  int streams = 20;
  double rate = 400;         // requests/s through the router, open loop
  int latency_ms = 5;        // the workers' modelled GPU time
  int observe_ms = 2500;     // after each fault, before the node is repaired
  double slow_fraction = 0;  // share of requests that take 1.5 s of GPU time (healthy work)
  bool keep = false;         // leave everything running until stop
  std::string target;        // the node every fault hits; empty: the busiest node each time
  int max_failures = 20;     // the controller's recovery.max_failures (held out past it)
  // LLM token streams beside the KServe load: this many streamed
  // completions open at all times on the first streams, every answer
  // checked (0: none). A fault mid-answer is continued on the standby.
  int llm_streams = 10;
  // Their model ("gpuha-tiny-bpe": the tokenizer model, continued on token
  // IDs and checked token for token), and with llm_mixed every other answer
  // a chat and every other pair seeded (load::LoadOptions::llm_chat, _seeded).
  std::string llm_model = "gpuha-tiny";
  bool llm_mixed = false;
  bool llm_structured = false;  // load::LoadOptions::llm_structured
  // KServe v2 gRPC beside the HTTP load, on this many of the first streams
  // (0: none): unary ModelInfer calls, and a ModelStreamInfer call per
  // stream carrying its frames as messages, each at an eighth of --rate,
  // every answer checked (one per message, in order, for the streams).
  int grpc_streams = 4;
  // Three controllers on a three-member etcd cluster instead of one on SQLite.
  bool ha = false;
  // Routers serving the same routes; the demo's clients keep the list.
  int routers = 1;
  // Workers run beside the agents, which watch them, instead of under them
  // (LocalClusterOptions::watched_servers).
  bool watched_servers = false;
  // Which engine's metrics the workers export (`gpuha worker
  // --engine-metrics`): "both" (Triton's and vLLM's) or "vllm" (vLLM's
  // alone: the agents then tell an errors-only server by its HTTP counts).
  std::string engine_metrics = "both";
  // One training job (`gpuha worker --train`) beside the streams, its
  // checkpoints in the demo's folder (the shared storage), and the fence
  // hook `true` standing in for a BMC power-off.
  bool train = false;
  // Simulated GPUs per node; 2 or more runs a worker per GPU, each GPU its
  // own placement unit (issue 16).
  int gpus_per_node = 1;
  // MIG instances per simulated GPU (0: off): a worker per instance, each
  // its own placement unit.
  int mig_per_gpu = 0;
  std::string workdir;  // empty: a fresh /tmp/gpuha-demo-XXXXXX, removed unless keep
  const std::atomic<bool>* stop = nullptr;  // Ctrl-C
};

struct DemoReport {
  std::vector<FaultTimeline> faults;
  load::LoadReport load;
  load::LoadReport llm;  // the LLM token streams (DemoOptions::llm_streams)
  // KServe v2 gRPC (DemoOptions::grpc_streams): unary calls, and streams.
  load::LoadReport grpc, grpc_stream;
  // --train: the step the job reached when the demo stopped it (it
  // checkpoints on the way out), and whether its state there equals the
  // state of a run that never failed.
  std::optional<uint64_t> train_step;
  std::optional<bool> train_exact;
  // Failed requests other than the router's clear 503 no_capacity for streams
  // past what the cluster can place (double-crash): expected to be 0.
  uint64_t Lost() const;
  std::string Text() const;
  std::string Json() const;
};

// Errors: a component that would not start (with its log's path).
[[nodiscard]] absl::StatusOr<DemoReport> RunDemo(const DemoOptions& o, std::ostream& out);

}  // namespace gpuha::demo
