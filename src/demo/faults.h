// The demo's fault catalogue: one row per fault, with what it hits, how it is
// injected and how the node is repaired. A node fault's repair is followed by
// the demo's wait for the node to rejoin as the spare; the controller's
// repair (a restart) is the demo's own, since it waits for its clients.
// Adding a fault is adding a row.
//
// Thread-safety: the table is immutable; a FaultContext belongs to one run.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cluster/local_cluster.h"

namespace gpuha::demo {

// What a fault hits.
enum class Target {
  kNode,        // the busiest node (or --node)
  kTwoNodes,    // the two busiest at once, past what N+1 covers
  kController,  // the controller process (with --ha: the leader), or etcd
  kEveryNode,   // every node in turn, each back before the next (a rolling upgrade)
  kJobNode,     // the node running the demo's training job (--train)
  kGpu,         // GPU 1 of the busiest node (--gpus-per-node 2 or more)
  kSlice,       // the busiest MIG instance of the busiest node (--mig-per-gpu 1 or more)
  kFleet,       // every node at once; each repaired in turn afterwards
  kRouter,      // the routers (--routers): each in turn, or the first
};

// What a fault's inject leaves for its repair.
struct FaultContext {
  cluster::LocalCluster& cluster;
  pid_t stopped_worker = -1;       // server-hang's SIGSTOPped worker
  std::vector<int> killed_etcd{};  // etcd members the repair starts again
  std::string hit{};               // what a control-plane fault hit ("controller-2", "etcd-1")
  uint32_t gpu = 0, slice = 0;     // the MIG instance a kSlice fault hits
  // router-restart: per router, from the new process's start to its old
  // one's word that it took the listeners.
  std::vector<double> router_taken_ms{};
};

using FaultAction = std::function<absl::Status(FaultContext&, cluster::LocalNode&)>;

struct FaultSpec {
  const char* name;
  Target target;
  bool partition;  // needs node 1 in its own network namespace
  bool ha;         // needs --ha (three controllers on etcd)
  FaultAction inject;
  FaultAction repair;  // null for the controller (the demo restarts it) and router-restart
};

const std::vector<FaultSpec>& FaultTable();
// nullptr for an unknown name.
const FaultSpec* FindFault(const std::string& name);

}  // namespace gpuha::demo
