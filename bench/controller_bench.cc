// Controller benchmarks, printed as a table for bench/RESULTS.md:
//   1. placing 100,000 streams on 10,000 nodes, against a naive linear-scan
//      placer measured in the same run (the peer);
//   2. moving a failed node's streams in a 10,000-node cluster;
//   3. CPU of a real `gpuha controller` process while 2,000 simulated agents
//      (gRPC streams from this process) heartbeat at 10 Hz.
// Usage: controller_bench GPUHA_BINARY [agents] [seconds]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "cluster/config_builders.h"
#include "common/http_server.h"
#include "gpuha/v1/agent.grpc.pb.h"
#include "placement/placement.h"
#include "tests/e2e/child_process.h"

using gpuha::placement::NodeSpec;
using gpuha::placement::Placement;
using gpuha::placement::Role;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stol(f);
  }
  return double(ticks) / double(sysconf(_SC_CLK_TCK));
}

// The peer: least-loaded placement by scanning every node for every stream.
double NaivePlacementMs(int nodes, int streams, int capacity) {
  std::vector<int> load(nodes, 0);
  auto t0 = Clock::now();
  for (int s = 0; s < streams; ++s) {
    int best = -1;
    for (int n = 0; n < nodes; ++n) {
      if (load[n] < capacity && (best < 0 || load[n] < load[best])) best = n;
    }
    load[best]++;
  }
  return Ms(Clock::now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: controller_bench GPUHA_BINARY [agents] [seconds]\n");
    return 2;
  }
  std::string gpuha = argv[1];
  int agents = argc > 2 ? std::atoi(argv[2]) : 2000;
  int seconds = argc > 3 ? std::atoi(argv[3]) : 15;
  constexpr int kNodes = 10000, kStreams = 100000, kCapacity = 20;

  // 1. Placement.
  Placement p(1);
  for (int n = 0; n < kNodes; ++n) {
    if (!p.AddNode({"n" + std::to_string(n), Role::kActive, kCapacity}).ok()) return 1;
  }
  auto t0 = Clock::now();
  for (int s = 0; s < kStreams; ++s) {
    if (!p.Admit({"s" + std::to_string(s), "t", 1}).ok()) return 1;
  }
  double place_ms = Ms(Clock::now() - t0);
  double naive_ms = NaivePlacementMs(kNodes, kStreams, kCapacity);

  // 2. Failover moves: fail 100 different nodes one at a time.
  std::vector<double> move_us;
  for (int i = 0; i < 100; ++i) {
    auto t = Clock::now();
    auto plan = p.FailNode("n" + std::to_string(i * 97));
    move_us.push_back(Ms(Clock::now() - t) * 1000);
    if (plan.moved.empty()) return 1;
  }
  std::sort(move_us.begin(), move_us.end());

  // 3. The same on GPU units (issue 16): 10,000 nodes of 8 GPUs, each GPU
  // its own unit on its node's host; N+1 reserves a whole node.
  // With racks (failure domains) of 100 nodes, N+1 reserves a rack and
  // each standby is in another rack.
  constexpr int kGpus = 8, kGpuCapacity = 3, kRack = 100;
  auto gpu_placement = [&](bool racks, Placement& g) -> double {
    for (int n = 0; n < kNodes; ++n) {
      std::string host = "n" + std::to_string(n);
      std::string rack = racks ? "rack-" + std::to_string(n / kRack) : "";
      for (int u = 0; u < kGpus; ++u) {
        if (!g.AddNode({host + "/gpu" + std::to_string(u), Role::kActive, kGpuCapacity, false, host,
                        rack})
                 .ok()) {
          return -1;
        }
      }
    }
    auto start = Clock::now();
    for (int s = 0; s < kStreams; ++s) {
      if (!g.Admit({"s" + std::to_string(s), "t", 1}).ok()) return -1;
    }
    return Ms(Clock::now() - start);
  };
  Placement g(1), racked(1);
  double gpu_place_ms = gpu_placement(false, g);
  double rack_place_ms = gpu_placement(true, racked);
  if (gpu_place_ms < 0 || rack_place_ms < 0) return 1;
  std::vector<double> gpu_move_us;
  for (int i = 0; i < 100; ++i) {
    auto t = Clock::now();
    auto plan = g.FailNode("n" + std::to_string(i * 97) + "/gpu" + std::to_string(i % kGpus));
    gpu_move_us.push_back(Ms(Clock::now() - t) * 1000);
    if (plan.moved.empty()) return 1;
  }
  std::sort(gpu_move_us.begin(), gpu_move_us.end());

  std::printf("| measure | gpuha | peer | ratio (gpuha / peer) |\n|---|---|---|---|\n");
  std::printf("| place %d streams on %d nodes | %.1f ms | %.1f ms (linear-scan placer) | %.3f |\n",
              kStreams, kNodes, place_ms, naive_ms, place_ms / naive_ms);
  std::printf(
      "| move a failed node's ~10 streams, %d-node cluster, median of 100 | %.1f us | 1 ms target "
      "| %.3f |\n",
      kNodes, move_us[50], move_us[50] / 1000.0);
  std::printf("| same, max of 100 | %.1f us | - | - |\n", move_us.back());
  std::printf(
      "| place %d streams on %d nodes x %d GPUs (GPU units, standby on another node) | %.1f ms "
      "| 200 ms target | %.3f |\n",
      kStreams, kNodes, kGpus, gpu_place_ms, gpu_place_ms / 200.0);
  std::printf(
      "| move one failed GPU's streams, %d GPUs, median of 100 | %.1f us | 1 ms target | %.3f "
      "|\n",
      kNodes * kGpus, gpu_move_us[50], gpu_move_us[50] / 1000.0);
  std::printf("| same, max of 100 | %.1f us | - | - |\n", gpu_move_us.back());
  std::printf(
      "| same placement in %d racks of %d nodes (standby in another rack, N+1 reserves a rack) | "
      "%.1f ms | 200 ms target | %.3f |\n",
      kNodes / kRack, kRack, rack_place_ms, rack_place_ms / 200.0);

  // 4. Heartbeat load against a real controller process.
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gpuha_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    gpuha::cluster::ControllerYaml cfg;
    for (int i = 0; i < agents; ++i) cfg.nodes.push_back({.name = "a" + std::to_string(i)});
    cfg.grpc_listen = "127.0.0.1:0";
    cfg.http_listen = "127.0.0.1:0";
    std::ofstream(dir / "c.yaml") << cfg.Yaml();
  }
  gpuha::e2e::ChildProcess controller({gpuha, "controller", "--config", (dir / "c.yaml").string()});
  auto line = controller.WaitForLine("gpuha controller grpc 127.0.0.1:", milliseconds(20000));
  if (!line) {
    std::fprintf(stderr, "controller did not start: %s\n", controller.err().c_str());
    return 1;
  }
  int grpc_port = std::stoi(*line);
  std::atomic<bool> stop{false};
  std::atomic<long> sent{0};
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < 20; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("gpuha.channel", c);  // distinct channels, distinct connections
    channels.push_back(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(grpc_port),
                                                 grpc::InsecureChannelCredentials(), args));
  }
  // 20 sender threads, each driving its share of the agent streams, so the
  // load generator itself stays light next to the controller it measures.
  constexpr int kThreads = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      struct Agent {
        std::unique_ptr<gpuha::v1::AgentService::Stub> stub;
        grpc::ClientContext ctx;
        std::unique_ptr<
            grpc::ClientReaderWriter<gpuha::v1::AgentMessage, gpuha::v1::ControllerMessage>>
            stream;
        uint64_t seq = 0;
      };
      std::vector<std::unique_ptr<Agent>> mine;
      for (int i = t; i < agents; i += kThreads) {
        auto a = std::make_unique<Agent>();
        a->stub = gpuha::v1::AgentService::NewStub(channels[i % channels.size()]);
        a->stream = a->stub->Connect(&a->ctx);
        gpuha::v1::AgentMessage hello;
        hello.mutable_hello()->set_node("a" + std::to_string(i));
        if (a->stream->Write(hello)) mine.push_back(std::move(a));
      }
      auto next = Clock::now() + milliseconds(t * 5);
      while (!stop) {
        std::this_thread::sleep_until(next);
        next += milliseconds(100);
        for (auto& a : mine) {
          gpuha::v1::AgentMessage hb;
          hb.mutable_heartbeat()->set_seq(++a->seq);
          hb.mutable_heartbeat()->set_health(gpuha::v1::NODE_HEALTH_HEALTHY);
          if (a->stream->Write(hb)) sent++;
        }
      }
      for (auto& a : mine) a->ctx.TryCancel();
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));  // connections settle
  double cpu0 = CpuSeconds(controller.pid());
  long sent0 = sent;
  auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  double cpu = CpuSeconds(controller.pid()) - cpu0;
  double wall = Ms(Clock::now() - w0) / 1000;
  long beats = sent - sent0;
  stop = true;
  for (auto& t : threads) t.join();
  std::string http = controller.out();
  controller.Signal(SIGTERM);
  controller.Wait(milliseconds(10000));
  std::printf(
      "| controller CPU, %d agents at 10 Hz, %.0f s | %.1f%% of one core | 100%% (one core) | %.3f "
      "|\n",
      agents, wall, 100 * cpu / wall, cpu / wall);
  std::printf("| heartbeats delivered per second | %.0f | %d expected | %.3f |\n", beats / wall,
              agents * 10, beats / wall / (agents * 10.0));
  std::filesystem::remove_all(dir);
  return 0;
}
