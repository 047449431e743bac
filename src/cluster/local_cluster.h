// LocalCluster: a whole gpuha cluster as real processes on loopback, for the
// demo (and through it the chaos tests): one controller (SQLite store in the
// cluster's folder), or with `controllers: 3` three on a three-member etcd
// cluster (Debian's etcd-server), one router, and N agents with a simulated L4 each, every
// agent supervising a `gpuha worker`. The last node is passive (N+1); the
// configs are written with config_builders.h. With `partition`, node 1 runs
// in a network namespace of its own, joined by a veth pair whose link
// SetLink cuts (root only).
//
//   LocalCluster c({.exe = "/usr/bin/gpuha"}, "/tmp/c");
//   if (absl::Status s = c.Start(); !s.ok()) ...
//   c.KillNode(c.nodes()[0]);  // SIGKILL to its agent and worker
//   c.StartAgent(c.nodes()[0]);
//
// Every process gets its log at DIR/NAME.log. Stop() (and the destructor)
// ends them all: SIGCONT, SIGTERM, then SIGKILL after 3 s. The calling
// process should be a child subreaper (PR_SET_CHILD_SUBREAPER) so that
// workers orphaned by a killed agent are reaped.
//
// Thread-safety: one thread drives it; Api() and WaitFor() may be called from
// others while no process is being started or stopped.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuha::cluster {

struct LocalClusterOptions {
  std::string exe{};  // the gpuha binary, run for every component
  int nodes = 4;      // the last one passive
  int node_capacity = 10;
  // Simulated GPUs per node. More than 1: a worker per GPU (issue 16), GPU
  // i's on worker_port + i, each its own placement unit with
  // ceil(node_capacity / gpus_per_node) stream units.
  int gpus_per_node = 1;
  // MIG instances per GPU (0: off): a worker per instance instead, in order
  // from worker_port, each its own unit of ceil(node_capacity / servers).
  int mig_per_gpu = 0;
  int worker_latency_ms = 5;  // the workers' modelled GPU time
  // More arguments for each worker, e.g. {"--engine-metrics", "vllm"}.
  std::vector<std::string> worker_args{};
  int max_failures = 20;   // the controller's recovery.max_failures
  bool partition = false;  // node 1 in its own network namespace (root)
  // 1: one controller on SQLite. More: that many on a three-member etcd
  // cluster; they elect a leader, and agents and the router know them all.
  int controllers = 1;
  // Workers started by the cluster beside the agents (as an inference pod
  // beside the agent's DaemonSet pod), which the agents watch and fence by
  // readiness, instead of each agent supervising its worker. An agent's
  // restart then leaves its worker serving.
  bool watched_servers = false;
  // The controller's fence hook ({node} is replaced), and how long it waits
  // for an agent to confirm a fence before it runs the hook.
  std::string fence_hook{};
  int fence_timeout_ms = 5000;
  // Routers serving the same routes from the controllers' watch (a client
  // keeps the list: `gpuha load` with several --target).
  int routers = 1;
  std::string api_key = "demo-acme-key";    // tenant acme's key at the router
  const std::atomic<bool>* stop = nullptr;  // WaitFor gives up when set
};

struct LocalController {
  std::string name;
  uint16_t grpc_port = 0, http_port = 0;
  std::string config;
  pid_t pid = -1;
};

struct LocalEtcd {
  std::string name;
  uint16_t client_port = 0, peer_port = 0;
  pid_t pid = -1;
};

struct LocalRouter {
  std::string name;
  uint16_t port = 0, admin_port = 0;
  std::string config;
  std::string handoff;  // its handoff socket: a restart's new process takes its listeners there
  pid_t pid = -1;
};

struct LocalNode {
  std::string name;
  std::string host = "127.0.0.1";  // its worker's and agent's address
  bool netns = false;              // runs in the partition namespace
  uint16_t worker_port = 0;        // GPU 0's worker; GPU i's is on worker_port + i
  uint16_t grpc_port = 0;          // its KServe v2 gRPC port; GPU i's is on grpc_port + i
  uint16_t agent_port = 0;
  std::string config;
  pid_t agent = -1;
  pid_t worker = -1;  // with watched_servers; else the agent's child
};

class LocalCluster {
 public:
  LocalCluster(LocalClusterOptions o, std::string dir);
  ~LocalCluster() { Stop(); }
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Picks distinct free ports, writes the configs and starts every process.
  [[nodiscard]] absl::Status Start();
  // (Re)starts every controller that is not running and waits until one
  // leads and answers its API (10 s; on etcd, 15 s).
  [[nodiscard]] absl::Status StartController();
  // Starts the node's agent (with watched_servers, its worker first if it
  // is not running: a node that boots).
  [[nodiscard]] absl::Status StartAgent(LocalNode& n);
  // With watched_servers, starts the node's worker if it is not running;
  // otherwise nothing (the agent's supervisor starts it).
  [[nodiscard]] absl::Status StartWorker(LocalNode& n);
  // SIGTERM to a node's agent (a planned stop: a DaemonSet upgrade), and the
  // wait for it to exit (SIGKILL after 10 s).
  void StopAgent(LocalNode& n);
  // SIGKILL to a node's agent and its worker (a crashed or rebooted host).
  void KillNode(LocalNode& n);
  // SIGKILL to the controller that leads (the only one on SQLite); its name.
  std::string KillController();
  // The controller that answers the API now (the leader), or null.
  const LocalController* Leader() const;
  // etcd members (HA only): the index of the member that leads etcd's raft
  // (-1: none answers), and kill -9 or a restart of one.
  int EtcdLeader() const;
  void KillEtcd(int i);
  [[nodiscard]] absl::Status StartEtcd(int i);
  std::vector<LocalEtcd>& etcd() { return etcd_; }
  std::vector<LocalController>& controllers() { return controllers_; }
  // Cuts (or restores) the partitioned node's only link: packets are dropped
  // both ways, with no reset, as when a switch port or cable fails.
  [[nodiscard]] absl::Status SetLink(bool up);
  // Starts router `i` afresh (it binds its ports; a killed one's handoff
  // socket is stale) and waits until its readiness says it serves (10 s).
  [[nodiscard]] absl::Status StartRouter(size_t i);
  // Restarts router `i` as a rolling upgrade does: a new process takes the
  // running one's listeners through the handoff socket, and the old one
  // drains and exits (waited for, up to 30 s). `*taken_ms`: from the new
  // process's start to the old one's log saying its listeners were given.
  [[nodiscard]] absl::Status RestartRouter(size_t i, double* taken_ms = nullptr);
  // SIGKILL to router `i` (a crashed router host).
  void KillRouter(size_t i);
  std::vector<LocalRouter>& routers() { return routers_; }
  // The worker: the agent's child, in its own session, or with
  // watched_servers the cluster's own; -1 when none runs.
  pid_t WorkerPid(const LocalNode& n) const;
  void Stop();

  // The controller's API; a non-2xx answer is an error with its body.
  absl::StatusOr<nlohmann::json> Api(const std::string& method, const std::string& target,
                                     const std::string& body = "") const;
  // POST /v1/sim/faults on the node's agent.
  [[nodiscard]] absl::Status InjectSimFault(const LocalNode& n, const std::string& spec) const;
  // Removes the node's sim GPU `gpu` from its PCI tree (StartAgent puts it back).
  [[nodiscard]] absl::Status VanishGpu(const LocalNode& n, int gpu) const;
  // POST /v1/fault?mode=MODE on the node's worker (stuck, errors, slow, none).
  [[nodiscard]] absl::Status SetWorkerFault(const LocalNode& n, const std::string& mode) const;
  // Whether the controller's startup grace (no failover while agents
  // reconnect) is over within `timeout`; faults injected before it would
  // find a controller that fails nothing over.
  bool WaitGraceOver(std::chrono::milliseconds timeout);
  // Whether the node's worker answers ready within `timeout`.
  bool WorkerReady(const LocalNode& n, std::chrono::milliseconds timeout);

  // Waits for `done` (polled every 20 ms) or a stop; false on timeout or stop.
  bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout);
  // Sleeps unless stopped; false when stopped.
  bool Sleep(std::chrono::milliseconds d);
  bool Stopping() const { return o_.stop != nullptr && o_.stop->load(); }
  // Collects exited children, including orphaned workers.
  static void Reap();

  std::vector<LocalNode>& nodes() { return nodes_; }
  LocalNode* FindNode(const std::string& name);
  uint16_t router_port() const { return routers_[0].port; }
  uint16_t router_admin_port() const { return routers_[0].admin_port; }
  // The leading controller's HTTP port (the first controller's when none leads).
  uint16_t api_port() const;
  const std::string& dir() const { return dir_; }
  // Where the node's agent has its jobs write their progress files
  // (JOB.JOB_EPOCH.progress: the step reached).
  std::string JobProgressDir(const LocalNode& n) const;
  // The step the job's placement `job_epoch` on the node last wrote to its
  // progress file (0: none yet). The file outlives a killed node.
  uint64_t JobProgress(const LocalNode& n, const std::string& job, uint64_t job_epoch) const;
  const LocalClusterOptions& options() const { return o_; }

 private:
  // The node's fake sysfs PCI tree (its agent's gpu.pci_devices).
  std::string PciDir(const LocalNode& n) const;
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& name);
  std::vector<std::string> WorkerArgv(const LocalNode& n) const;
  absl::Status Ip(const std::vector<std::string>& argv);
  absl::Status SetUpPartitionNetns();
  absl::Status WriteConfigs();

  const LocalClusterOptions o_;
  const std::string dir_;
  std::vector<LocalRouter> routers_;
  std::string handoff_dir_;  // short (a Unix socket's path has 107 bytes): /tmp/gpuha-rt-XXXXXX
  std::vector<LocalController> controllers_;
  std::vector<LocalEtcd> etcd_;
  mutable std::atomic<size_t> leader_{0};  // the controller Api() tries first
  // The partition: node 1 runs in its own network namespace, joined to this
  // one by a veth pair; the controller listens on this side's address.
  std::string ctl_host_ = "127.0.0.1";
  std::string netns_, veth_;
  bool netns_made_ = false;
  std::vector<LocalNode> nodes_;
  bool stopped_ = false;
};

}  // namespace gpuha::cluster
