#include "demo/faults.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "demo/demo.h"

namespace gpuha::demo {

using cluster::LocalNode;

const std::vector<FaultSpec>& FaultTable() {
  auto restart = [](FaultContext& f, LocalNode& n) { return f.cluster.StartAgent(n); };
  auto reboot = [](FaultContext& f, LocalNode& n) {
    f.cluster.KillNode(n);  // a reboot clears the GPU; the agent comes back with it
    return f.cluster.StartAgent(n);
  };
  auto kill_node = [](FaultContext& f, LocalNode& n) {
    f.cluster.KillNode(n);
    return absl::OkStatus();
  };
  auto sim_fault = [](const char* spec) {
    return [spec](FaultContext& f, LocalNode& n) { return f.cluster.InjectSimFault(n, spec); };
  };
  auto worker_fault = [](const char* mode) {
    return [mode](FaultContext& f, LocalNode& n) { return f.cluster.SetWorkerFault(n, mode); };
  };
  // The worker may have been stopped and restarted meanwhile (a fenced
  // node's server is stopped, and a new one starts without the fault).
  auto clear_worker_fault = [](FaultContext& f, LocalNode& n) {
    (void)f.cluster.SetWorkerFault(n, "none");
    return absl::OkStatus();
  };
  static const std::vector<FaultSpec> kTable = {
      {"crash", Target::kNode, false, false, kill_node, restart},
      // An uncorrectable ECC error on one GPU of a multi-GPU node: that
      // GPU's streams move, the node's other GPUs serve on. Its XID
      // latches until the node reboots: the repair waits for the reboot's
      // failover before the agent comes back.
      {"gpu-xid48", Target::kGpu, false, false, sim_fault("gpu=1,kind=xid,xid=48"),
       [](FaultContext& f, LocalNode& n) {
         f.cluster.KillNode(n);
         (void)f.cluster.WaitFor(
             [&] {
               auto j = f.cluster.Api("GET", "/api/v1/nodes/" + n.name);
               return j.ok() && j->value("fenced", false);
             },
             std::chrono::milliseconds(10000));
         return f.cluster.StartAgent(n);
       }},
      // A MIG instance destroyed under its server (a slice of a split
      // GPU): that slice's streams move; the GPU's other slices, and the
      // node's other GPUs, serve on. The repair resets the sim GPU, which
      // brings the instance back (the sim keeps its UUID).
      {"mig-lost", Target::kSlice, false, false,
       [](FaultContext& f, LocalNode& n) {
         return f.cluster.InjectSimFault(
             n, absl::StrCat("gpu=", f.gpu, ",kind=mig_lost,slice=", f.slice));
       },
       [](FaultContext& f, LocalNode& n) {
         return f.cluster.InjectSimFault(n, absl::StrCat("gpu=", f.gpu, ",kind=clear"));
       }},
      {"train-crash", Target::kJobNode, false, false, kill_node, restart},
      {"xid79", Target::kNode, false, false, sim_fault("gpu=0,kind=xid,xid=79"), reboot},
      // A flood of draining XIDs (74, NVLink) on every node at once, as a
      // bad driver roll-out or a false alarm would send: the quarantine
      // breaker lets half the nodes go and holds the rest serving.
      {"xid-flood", Target::kFleet, false, false, sim_fault("gpu=0,kind=xid,xid=74"), reboot},
      {"thermal", Target::kNode, false, false,
       sim_fault("gpu=0,kind=temp_ramp,to_c=95,over_ms=600"), reboot},
      {"agent-hang", Target::kNode, false, false,
       [](FaultContext&, LocalNode& n) {
         ::kill(n.agent, SIGSTOP);
         return absl::OkStatus();
       },
       [](FaultContext&, LocalNode& n) {
         ::kill(n.agent, SIGCONT);
         return absl::OkStatus();
       }},
      {"server-hang", Target::kNode, false, false,
       [](FaultContext& f, LocalNode& n) {
         f.stopped_worker = f.cluster.WorkerPid(n);
         if (f.stopped_worker <= 0) return absl::InternalError("no worker process found");
         ::kill(f.stopped_worker, SIGSTOP);
         return absl::OkStatus();
       },
       [](FaultContext& f, LocalNode&) {
         ::kill(f.stopped_worker, SIGCONT);
         return absl::OkStatus();
       }},
      // The worker alone killed, mid-answer for the LLM streams on it; the
      // agent's supervisor restarts it (with watched servers, the repair does).
      {"worker-kill", Target::kNode, false, false,
       [](FaultContext& f, LocalNode& n) {
         pid_t w = f.cluster.WorkerPid(n);
         if (w <= 0) return absl::InternalError("no worker process found");
         ::kill(w, SIGKILL);
         return absl::OkStatus();
       },
       [](FaultContext& f, LocalNode& n) { return f.cluster.StartWorker(n); }},
      {"controller-restart", Target::kController, false, false,
       [](FaultContext& f, LocalNode&) {
         f.hit = f.cluster.KillController();
         return absl::OkStatus();
       },
       nullptr},
      // --ha: kill -9 of the leading controller; a standby leads once the
      // lease runs out. The demo restarts the killed one, as a standby.
      {"leader-kill", Target::kController, false, true,
       [](FaultContext& f, LocalNode&) {
         f.hit = f.cluster.KillController();
         return f.hit.empty() ? absl::InternalError("no controller leads") : absl::OkStatus();
       },
       nullptr},
      // --ha: kill -9 of the member leading etcd's raft; the others elect one.
      {"etcd-leader-kill", Target::kController, false, true,
       [](FaultContext& f, LocalNode&) {
         int leader = f.cluster.EtcdLeader();
         if (leader < 0) return absl::InternalError("no etcd member leads");
         f.cluster.KillEtcd(leader);
         f.killed_etcd = {leader};
         f.hit = f.cluster.etcd()[static_cast<size_t>(leader)].name;
         return absl::OkStatus();
       },
       nullptr},
      // --ha: two of the three etcd members stopped (kill -9), then started:
      // no quorum meanwhile. The leading controller stops acting when its
      // lease cannot be renewed; the data plane serves on its last routes.
      {"etcd-quorum-loss", Target::kController, false, true,
       [](FaultContext& f, LocalNode&) {
         int leader = f.cluster.EtcdLeader();
         if (leader < 0) return absl::InternalError("no etcd member leads");
         const int other = (leader + 1) % static_cast<int>(f.cluster.etcd().size());
         f.killed_etcd = {leader, other};
         for (int i : f.killed_etcd) f.cluster.KillEtcd(i);
         f.hit = f.cluster.etcd()[static_cast<size_t>(leader)].name + "+" +
                 f.cluster.etcd()[static_cast<size_t>(other)].name;
         return absl::OkStatus();
       },
       nullptr},
      {"double-crash", Target::kTwoNodes, false, false, kill_node, restart},
      // A rolling upgrade of the agents (a DaemonSet, maxUnavailable 1): each
      // agent stopped with SIGTERM (it says goodbye) and started again, the
      // next once it is back. A watched server serves on through it (the
      // restart grace); a supervised one stops with its agent, its work moved
      // first.
      {"agent-restart", Target::kEveryNode, false, false,
       [](FaultContext& f, LocalNode& n) {
         f.cluster.StopAgent(n);
         return f.cluster.StartAgent(n);
       },
       [](FaultContext&, LocalNode&) { return absl::OkStatus(); }},
      // Inference stuck while health and metrics answer (a deadlocked engine).
      {"half-hang", Target::kNode, false, false, worker_fault("stuck"), clear_worker_fault},
      // Readiness 200, every inference 500 (a broken CUDA context).
      {"error-burst", Target::kNode, false, false, worker_fault("errors"), clear_worker_fault},
      // An NVML call on GPU 0 that never returns (the driver stuck in the
      // kernel): the agent's watchdog fails the GPU, heartbeats go on.
      {"driver-hang", Target::kNode, false, false, sim_fault("gpu=0,kind=driver_hang"), reboot},
      // GPU 0 gone from the PCI bus (fallen off, hot-unplugged).
      {"gpu-vanish", Target::kNode, false, false,
       [](FaultContext& f, LocalNode& n) { return f.cluster.VanishGpu(n, 0); }, reboot},
      // A rolling upgrade of the data plane: each router restarted in turn
      // through its handoff socket. The new process takes the listeners,
      // which never close; the old one drains what it holds and exits.
      {"router-restart", Target::kRouter, false, false,
       [](FaultContext& f, LocalNode&) {
         f.hit = "every router";
         for (size_t i = 0; i < f.cluster.routers().size(); ++i) {
           double ms = 0;
           if (absl::Status s = f.cluster.RestartRouter(i, &ms); !s.ok()) return s;
           f.router_taken_ms.push_back(ms);
         }
         return absl::OkStatus();
       },
       nullptr},
      // kill -9 of the first router (--routers 2+): clients go to the next
      // router on their list. The repair starts it again.
      {"router-kill", Target::kRouter, false, false,
       [](FaultContext& f, LocalNode&) {
         f.hit = f.cluster.routers()[0].name;
         f.cluster.KillRouter(0);
         return absl::OkStatus();
       },
       [](FaultContext& f, LocalNode&) { return f.cluster.StartRouter(0); }},
      {"partition", Target::kNode, true, false,
       [](FaultContext& f, LocalNode&) { return f.cluster.SetLink(false); },
       [](FaultContext& f, LocalNode&) { return f.cluster.SetLink(true); }},
  };
  return kTable;
}

const FaultSpec* FindFault(const std::string& name) {
  for (const FaultSpec& f : FaultTable()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::vector<std::string> FaultNames() {
  std::vector<std::string> out;
  for (const FaultSpec& f : FaultTable()) out.push_back(f.name);
  return out;
}

}  // namespace gpuha::demo
