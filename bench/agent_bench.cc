// Agent cost and reaction time, measured on the real `gpuha agent` process
// against an in-process FakeController on loopback:
//   1. CPU used by an agent sampling 8 simulated GPUs at 10 Hz and sending
//      heartbeats every 50 ms, over a fixed window (/proc/<pid>/stat).
//   2. Time from an XID injected into the running agent to the heartbeat that
//      carries it arriving at the controller, over many injections.
//   With MIG > 0, each GPU is MIG MIG instances, each with its own server
//   (an in-process readiness server here) that the agent probes.
//   SAMPLE_MS is the sampling interval (100 by default; the agent's own
//   default is 500). SERVERS 0 leaves the instances without servers (the
//   agent's MIG monitoring alone). PROBE_MS is the servers' readiness probe
//   interval (server.probe_interval_ms, 500 by default).
// Usage: agent_bench GPUHA_BINARY [seconds] [injections] [MIG] [SAMPLE_MS] [SERVERS] [PROBE_MS]
// AGENT_BENCH_LOG=1 also prints the agent's log (reconnects, warnings).
// AGENT_BENCH_GPU=nvml: the agent's NVML backend on the fake library with
// each call's measured cost (FAKE_NVML_COST=1; 8 GPUs with NVML's PCIe byte
// counters; XIDs through its event set). AGENT_BENCH_SLOW_MS sets
// gpu.slow_sample_ms; AGENT_BENCH_SLOW_MS=0 with AGENT_BENCH_NO_PCIE_COUNTERS=1
// makes every call of every sample, as the agent did before issue 38.
// MIG is not modelled in this mode. AGENT_BENCH_GPU=sim-cost: the sim
// backend with gpu.sim.cost_model (each sample costs the NVML calls it
// stands for). AGENT_BENCH_HEARTBEAT_MS sets the heartbeat (50).
// AGENT_BENCH_DATAGRAMS=0: the controller offers no heartbeat datagrams.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/testing/fake_controller.h"
#include "common/http_server.h"
#include "tests/e2e/child_process.h"

using gpuha::agent::testing::FakeController;
using gpuha::e2e::ChildProcess;
using std::chrono::milliseconds;

namespace {

// utime + stime of a process, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stol(f);
    if (i == 15) stime = std::stol(f);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: agent_bench GPUHA_BINARY [seconds] [injections]\n");
    return 2;
  }
  std::string gpuha = argv[1];
  int seconds = argc > 2 ? std::atoi(argv[2]) : 20;
  int injections = argc > 3 ? std::atoi(argv[3]) : 100;
  int mig = argc > 4 ? std::atoi(argv[4]) : 0;
  int sample_ms = argc > 5 ? std::atoi(argv[5]) : 100;
  bool servers_per_instance = argc > 6 ? std::atoi(argv[6]) != 0 : true;
  int probe_ms = argc > 7 ? std::atoi(argv[7]) : 500;

  const char* gpu_env = std::getenv("AGENT_BENCH_GPU");
  const bool nvml = gpu_env != nullptr && std::string(gpu_env) == "nvml";
  const bool sim_cost = gpu_env != nullptr && std::string(gpu_env) == "sim-cost";
  const std::string tag = "/tmp/agent_bench_" + std::to_string(::getpid());
  const std::string state = tag + ".nvml";
  // The fake driver's state: 8 GPUs; an XID is one more xid_seq.
  auto write_state = [&](int seq, int gpu, int xid) {
    std::ostringstream o;
    o << "count 8\ndriver_version 580.159.04\n";
    for (int g = 0; g < 8; ++g) {
      o << "gpu" << g << ".name NVIDIA H200\ngpu" << g << ".mem_total 150754820096\n";
      if (!std::getenv("AGENT_BENCH_NO_PCIE_COUNTERS")) {
        o << "gpu" << g << ".pcie_tx_bytes " << 1000000L * (seq + 1) << "\ngpu" << g
          << ".pcie_rx_bytes " << 2000000L * (seq + 1) << "\n";
      }
    }
    o << "xid_seq " << seq << "\nxid_gpu " << gpu << "\nxid " << xid << "\n";
    const std::string tmp = state + ".tmp";
    std::ofstream(tmp) << o.str();
    std::rename(tmp.c_str(), state.c_str());
  };
  FakeController controller;
  // Heartbeats that say nothing new go as UDP datagrams when the controller
  // offers them, as the real one does; AGENT_BENCH_DATAGRAMS=0 keeps every
  // beat on the gRPC stream (the agent before datagrams).
  const bool datagrams = std::getenv("AGENT_BENCH_DATAGRAMS") == nullptr ||
                         std::string(std::getenv("AGENT_BENCH_DATAGRAMS")) != "0";
  if (datagrams) controller.OfferDatagrams();
  std::vector<std::string> args = {gpuha,
                                   "agent",
                                   "--node",
                                   "bench",
                                   "--controller",
                                   "127.0.0.1:" + std::to_string(controller.port()),
                                   "--sample-ms",
                                   std::to_string(sample_ms),
                                   "--heartbeat-ms",
                                   std::getenv("AGENT_BENCH_HEARTBEAT_MS") != nullptr
                                       ? std::getenv("AGENT_BENCH_HEARTBEAT_MS")
                                       : "50",
                                   "--listen",
                                   "127.0.0.1:0"};
  std::vector<std::string> env;
  if (nvml) {
    if (mig > 0) {
      std::fprintf(stderr, "AGENT_BENCH_GPU=nvml does not model MIG\n");
      return 2;
    }
    write_state(0, 0, 0);
    const char* slow = std::getenv("AGENT_BENCH_SLOW_MS");
    std::ofstream(tag + ".yaml") << "gpu: { backend: nvml, nvml_lib: \"" << FAKE_NVML_COMPLETE
                                 << "\", kernel_log: \"off\", pci_devices: \"off\""
                                 << (slow ? std::string(", slow_sample_ms: ") + slow : "")
                                 << " }\n";
    args.insert(args.end(), {"--config", tag + ".yaml"});
    env = {"FAKE_NVML_STATE=" + state, "FAKE_NVML_COST=1"};
  } else {
    args.insert(args.end(), {"--gpu", "sim", "--sim-gpus", "8"});
    if (sim_cost) {
      std::ofstream(tag + ".sim.yaml") << "gpu: { sim: { cost_model: true } }\n";
      args.insert(args.end(), {"--config", tag + ".sim.yaml"});
    }
  }
  // A readiness server per MIG instance, on consecutive ports.
  std::vector<std::unique_ptr<gpuha::common::HttpServer>> servers;
  if (mig > 0 && !servers_per_instance) args.insert(args.end(), {"--sim-mig", std::to_string(mig)});
  if (probe_ms != 500) {  // only the config file sets it
    const std::string path = "/tmp/agent_bench_" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(path) << "server: { probe_interval_ms: " << probe_ms << " }\n";
    args.insert(args.end(), {"--config", path});
  }
  if (mig > 0 && servers_per_instance) {
    const int want = 8 * mig;
    int base = 0;
    for (int attempt = 0; attempt < 50 && static_cast<int>(servers.size()) < want; ++attempt) {
      servers.clear();
      base = 20000 + static_cast<int>((::getpid() * 7 + attempt * 257) % 30000);
      for (int i = 0; i < want; ++i) {
        auto srv = gpuha::common::HttpServer::Start(
            {.address = "127.0.0.1", .port = static_cast<uint16_t>(base + i)},
            [](const gpuha::common::HttpRequest&) {
              return gpuha::common::HttpResponse{200, "text/plain", "", {}};
            });
        if (!srv.ok()) break;
        servers.push_back(std::move(*srv));
      }
    }
    if (static_cast<int>(servers.size()) < want) {
      std::fprintf(stderr, "no %d free consecutive ports\n", want);
      return 1;
    }
    args.insert(args.end(), {"--sim-mig", std::to_string(mig), "--gpu-port-base",
                             std::to_string(base), "--ready-url",
                             "http://127.0.0.1:{port}/v2/health/ready", "--fence-mode", "unready"});
  }
  ChildProcess agent(args, env);
  auto port = agent.WaitForLine("listening on 127.0.0.1:", milliseconds(10000));
  if (!port || !controller.WaitForHello(milliseconds(10000))) {
    std::fprintf(stderr, "agent did not start: %s\n", agent.err().c_str());
    return 1;
  }
  if (mig > 0 && servers_per_instance) {  // every instance's server probed and ready first
    auto all_ready = controller.WaitForHeartbeat(
        [&](const gpuha::v1::Heartbeat& h) {
          if (h.gpu_health_size() != 8 * mig) return false;
          for (const auto& g : h.gpu_health()) {
            if (!g.server_ready() || !g.has_slice()) return false;
          }
          return true;
        },
        milliseconds(10000));
    if (!all_ready) {
      std::fprintf(stderr, "the agent did not report %d ready MIG servers\n", 8 * mig);
      return 1;
    }
  }
  std::this_thread::sleep_for(milliseconds(1000));  // past start-up

  double cpu0 = CpuSeconds(agent.pid());
  size_t beats0 = controller.heartbeat_count();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  double cpu = CpuSeconds(agent.pid()) - cpu0;
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t beats = controller.heartbeat_count() - beats0;
  double core_pct = 100.0 * cpu / wall;

  std::vector<double> latencies_ms;
  uint16_t http_port = static_cast<uint16_t>(std::stoi(*port));
  // Alert XIDs (an application's, by NVIDIA's catalog): the node stays up,
  // so the same agent can be hit again. Every occurrence is its own event.
  const int kXids[] = {13, 31, 68, 69};
  for (int i = 0; i < injections; ++i) {
    const int pair = i % 32;
    size_t from = controller.heartbeat_count();
    auto sent = std::chrono::steady_clock::now();
    if (nvml) {
      write_state(i + 1, pair % 8, kXids[pair / 8]);
    } else {
      auto r = gpuha::common::HttpCall(
          "POST", "127.0.0.1", http_port, "/v1/sim/faults",
          absl::StrCat("kind=xid,xid=", kXids[pair / 8], ",gpu=", pair % 8), milliseconds(2000));
      if (!r.ok() || r->status != 202) {
        std::fprintf(stderr, "injection failed\n");
        return 1;
      }
    }
    auto got = controller.WaitForHeartbeat(
        [](const gpuha::v1::Heartbeat& h) { return h.xids_size() > 0; }, milliseconds(2000), from);
    if (!got) {
      std::fprintf(stderr, "no heartbeat carried XID %d of %d; the agent's log:\n%s\n", i + 1,
                   injections, agent.err().c_str());
      return 1;
    }
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(got->at - sent).count());
    std::this_thread::sleep_for(milliseconds(20));
  }
  agent.Signal(SIGTERM);
  agent.Wait(milliseconds(5000));

  std::printf("| measure | value | target | ratio to target |\n|---|---|---|---|\n");
  std::printf(
      "| agent CPU, 8 %s GPUs%s sampled every %d ms + heartbeats @20 Hz, %.0f s | %.3f%% of one "
      "core | 1%% | %.2f |\n",
      nvml ? (std::getenv("AGENT_BENCH_SLOW_MS") != nullptr &&
                      std::string(std::getenv("AGENT_BENCH_SLOW_MS")) == "0"
                  ? "cost-modelled NVML (every call every sample)"
                  : "cost-modelled NVML")
           : (sim_cost ? "sim (cost-modelled)" : "sim"),
      mig == 0 ? ""
      : servers_per_instance
          ? (" x " + std::to_string(mig) + " MIG, a server per instance probed every " +
             std::to_string(probe_ms) + " ms")
                .c_str()
          : (" x " + std::to_string(mig) + " MIG, no servers").c_str(),
      sample_ms, wall, core_pct, core_pct / 1.0);
  std::printf("| heartbeats received per second | %.1f | 20 | %.2f |\n", double(beats) / wall,
              double(beats) / wall / 20.0);
  std::printf("| heartbeats received as UDP datagrams | %zu of %zu (offered: %s) | - | - |\n",
              controller.datagram_count(), controller.heartbeat_count(), datagrams ? "yes" : "no");
  std::printf(
      "| XID injected -> heartbeat at controller, median (n=%d) | %.2f ms | 50 ms | %.3f |\n",
      injections, Percentile(latencies_ms, 0.5), Percentile(latencies_ms, 0.5) / 50.0);
  std::printf("| same, p99 | %.2f ms | - | - |\n", Percentile(latencies_ms, 0.99));
  std::printf("| same, max | %.2f ms | - | - |\n", Percentile(latencies_ms, 1.0));
  if (std::getenv("AGENT_BENCH_LOG")) std::fprintf(stderr, "%s", agent.err().c_str());
  if (nvml) {
    std::remove(state.c_str());
    std::remove((tag + ".yaml").c_str());
  }
  if (sim_cost) std::remove((tag + ".sim.yaml").c_str());
  return 0;
}
