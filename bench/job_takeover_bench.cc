// Training-job takeover after a node crash, for bench/RESULTS.md: real
// processes on loopback (LocalCluster: a controller on SQLite, three agents
// with sim GPUs, `gpuha worker --train` as the job, a directory as the
// shared storage). Each run adds a 300-step job (10 ms a step, a checkpoint
// every 20), kills its node with SIGKILL (agent, worker and job) once it has
// checkpointed step 60, and times, from the controller's job record:
//   fault (the node's last heartbeat) -> fence confirmed (the hook) ->
//   started on another node -> running there;
// then lets it finish and checks its final state against a run that was
// never interrupted. Steps lost: the step the killed job last wrote to its
// progress file minus the checkpoint its successor resumed from.
//
//   build/bench/job_takeover_bench build/gpuha 10
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "cluster/local_cluster.h"
#include "worker/checkpoint.h"
#include "worker/trainer.h"

using gpuha::cluster::LocalCluster;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

constexpr int kSteps = 300;
constexpr int kEvery = 20;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

json Job(LocalCluster& c, const std::string& id) {
  auto j = c.Api("GET", "/api/v1/jobs/" + id);
  return j.ok() ? *j : json::object();
}

bool Serving(LocalCluster& c) {
  return c.WaitFor(
      [&] {
        auto nodes = c.Api("GET", "/api/v1/nodes");
        if (!nodes.ok() || nodes->empty()) return false;
        for (const json& n : *nodes) {
          if (!n.value("connected", false) || n.value("state", "") != "alive") return false;
        }
        return true;
      },
      milliseconds(60000));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s GPUHA_BINARY [runs]\n", argv[0]);
    return 2;
  }
  const std::string exe = std::filesystem::absolute(argv[1]).string();
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 10;
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const std::string root = "/tmp/gpuha-job-bench-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/cluster");
  std::filesystem::create_directories(root + "/san");

  const std::string expected = gpuha::worker::TrainStateAfter(kSteps);

  // The hook stands in for a BMC power-off of a node already dead.
  LocalCluster c({.exe = exe, .nodes = 3, .fence_hook = "true"}, root + "/cluster");
  if (absl::Status s = c.Start(); !s.ok()) {
    std::fprintf(stderr, "cluster: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::vector<double> to_fenced, to_started, to_running;
  std::vector<double> lost;
  int exact = 0;
  for (int run = 0; run < runs; ++run) {
    if (!Serving(c) || !c.WaitGraceOver(milliseconds(30000))) {
      std::fprintf(stderr, "run %d: the cluster did not settle\n", run);
      break;
    }
    const std::string id = absl::StrCat("train-", run);
    const std::string dir = absl::StrCat(root, "/san/", id);
    json body = {{"id", id},
                 {"command",
                  {exe, "worker", "--train", "--checkpoint-dir", "{checkpoint_dir}", "--epoch",
                   "{epoch}", "--steps", std::to_string(kSteps), "--checkpoint-every",
                   "{checkpoint_every}", "--step-ms", "10", "--progress-file", "{progress_file}"}},
                 {"checkpoint_dir", dir},
                 {"checkpoint_every", kEvery}};
    auto added = c.Api("POST", "/api/v1/jobs", body.dump());
    if (!added.ok()) {
      std::fprintf(stderr, "run %d: %s\n", run, std::string(added.status().message()).c_str());
      break;
    }
    const std::string node = (*added).value("node", "");
    if (!c.WaitFor([&] { return Job(c, id).value("checkpoint_step", 0) >= 3 * kEvery; },
                   milliseconds(20000))) {
      std::fprintf(stderr, "run %d: no checkpoint\n", run);
      break;
    }
    const uint64_t epoch = Job(c, id).value("job_epoch", uint64_t{0});
    gpuha::cluster::LocalNode* n = c.FindNode(node);
    c.KillNode(*n);
    const uint64_t reached = c.JobProgress(*n, id, epoch);
    if (!c.WaitFor([&] { return Job(c, id).value("phase", "") == "done"; }, milliseconds(30000))) {
      std::fprintf(stderr, "run %d: the job did not finish: %s\n", run, Job(c, id).dump().c_str());
      break;
    }
    const json t = Job(c, id)["last_takeover"];
    const double fault = t.value("fault_unix_ms", 0.0);
    to_fenced.push_back(t.value("fenced_unix_ms", 0.0) - fault);
    to_started.push_back(t.value("started_unix_ms", 0.0) - fault);
    to_running.push_back(t.value("running_unix_ms", 0.0) - fault);
    lost.push_back(double(reached) - double(t.value("resumed_from", uint64_t{0})));
    auto ck = gpuha::worker::CheckpointDir::Open(dir);
    auto latest = ck.ok() ? ck->Latest()
                          : absl::StatusOr<std::optional<gpuha::worker::Checkpoint>>(ck.status());
    if (latest.ok() && latest->has_value() && (*latest)->step == kSteps &&
        (*latest)->state == expected) {
      ++exact;
    }
    (void)c.Api("DELETE", "/api/v1/jobs/" + id);
    LocalCluster::Reap();
    if (absl::Status s = c.StartAgent(*n); !s.ok()) {
      std::fprintf(stderr, "run %d: restart: %s\n", run, std::string(s.message()).c_str());
      break;
    }
    std::fprintf(stderr, "run %d: fault -> running %.0f ms, steps lost %.0f\n", run,
                 to_running.back(), lost.back());
  }
  std::printf("\n| measure | runs | median | max | peer | ratio (peer / gpuha) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto row = [](const char* what, const std::vector<double>& v, const char* peer, double peer_ms) {
    const double m = Median(v);
    std::printf(
        "| %s | %zu | %.0f ms | %.0f ms | %s | %s |\n", what, v.size(), m,
        v.empty() ? 0 : *std::max_element(v.begin(), v.end()), peer,
        peer_ms > 0 && m > 0 ? absl::StrCat(static_cast<int>(peer_ms / m), "x").c_str() : "-");
  };
  row("fault -> fence confirmed", to_fenced, "-", 0);
  row("fault -> started on another node", to_started, "-", 0);
  // Kubernetes: a pod on a dead node is replaced after the node monitor's
  // 50 s grace plus the default 300 s not-ready toleration. vSphere HA:
  // 15 s to declare a host dead, before the VM even boots.
  row("fault -> job running on another node", to_running, "Kubernetes defaults 350000 ms", 350000);
  row("same, against vSphere HA detection alone", to_running, "15000 ms", 15000);
  std::printf("| steps lost (checkpoint every %d) | %zu | %.0f | %.0f | at most %d | - |\n", kEvery,
              lost.size(), Median(lost),
              lost.empty() ? 0 : *std::max_element(lost.begin(), lost.end()), kEvery);
  std::printf("| runs whose final state equals the uninterrupted run | %d of %zu | | | | |\n",
              exact, to_running.size());
  c.Stop();
  std::filesystem::remove_all(root);
  return to_running.size() == size_t(runs) && exact == runs ? 0 : 1;
}
