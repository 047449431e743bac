// The etcd control plane's figures (issue 15), printed as tables for
// bench/RESULTS.md. Real processes on loopback (LocalCluster: etcd-server,
// controllers, agents with workers, a router):
//   1. takeover after kill -9 of the leading controller, and after a planned
//      stop (SIGTERM): from the signal to the first act of the controller
//      that leads next (its controller_started event), `runs` of each;
//   2. the peer: etcd's own re-election after kill -9 of its raft leader, on
//      the same machine, until a member reports a leader again;
//   3. a node failover's controller steps (detected -> fenced -> routes
//      pushed -> routers acknowledged) with the store on a three-member etcd
//      and on SQLite, `runs` crashes each: what etcd adds.
// Usage: controller_ha_bench GPUHA_BINARY [runs]
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "cluster/local_cluster.h"
#include "common/clock.h"

using gpuha::cluster::LocalCluster;
using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

double NowUnixMs() { return double(gpuha::common::RealClock::Get()->UnixNanos()) / 1e6; }

struct Summary {
  double median = 0, p99 = 0, max = 0;
  size_t n = 0;
};

Summary Summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(0.99 * double(v.size())))];
  s.max = v.back();
  return s;
}

std::string DirPath(const std::string& name) {
  return "/tmp/gpuha-ha-bench-" + std::to_string(::getpid()) + "-" + name;
}

std::string Dir(const std::string& name) {
  std::string d = DirPath(name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The first controller_started event at or after `since_unix_ms`: when the
// controller that leads after a fault first acted. Waits up to 20 s.
std::optional<double> TakeoverAt(LocalCluster& c, double since_unix_ms) {
  std::optional<double> at;
  c.WaitFor(
      [&] {
        auto ev = c.Api("GET", "/api/v1/events");
        if (!ev.ok() || !ev->is_array()) return false;
        for (const json& e : *ev) {
          if (e.value("type", "") == "controller_started" &&
              e.value("unix_ms", 0.0) >= since_unix_ms) {
            at = e.value("unix_ms", 0.0);
            return true;
          }
        }
        return false;
      },
      milliseconds(20000));
  return at;
}

// Every agent connected to the leader, and its startup grace over.
bool Settled(LocalCluster& c) {
  bool agents = c.WaitFor(
      [&] {
        auto nodes = c.Api("GET", "/api/v1/nodes");
        if (!nodes.ok() || !nodes->is_array() || nodes->empty()) return false;
        for (const json& n : *nodes) {
          if (!n.value("connected", false) || n.value("state", "") != "alive") return false;
        }
        return true;
      },
      milliseconds(30000));
  return agents && c.WaitGraceOver(milliseconds(30000));
}

// kill -9 (or SIGTERM) of the leader, `runs` times; the killed one is
// started again as a standby before the next.
std::vector<double> Takeovers(LocalCluster& c, int signo, int runs) {
  std::vector<double> out;
  for (int i = 0; i < runs; ++i) {
    if (!Settled(c)) {
      std::fprintf(stderr, "cluster did not settle before run %d\n", i);
      break;
    }
    const gpuha::cluster::LocalController* leader = c.Leader();
    if (leader == nullptr) break;
    const pid_t pid = leader->pid;
    const double t0 = NowUnixMs();
    ::kill(pid, signo);
    std::optional<double> at = TakeoverAt(c, t0);
    if (!at) {
      std::fprintf(stderr, "no takeover after signal %d (run %d)\n", signo, i);
      break;
    }
    out.push_back(*at - t0);
    // The old leader has exited (kill -9) or is exiting (SIGTERM).
    for (int k = 0; k < 500 && ::kill(pid, 0) == 0; ++k) {
      LocalCluster::Reap();
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (absl::Status s = c.StartController(); !s.ok()) {
      std::fprintf(stderr, "restart: %s\n", std::string(s.message()).c_str());
      break;
    }
  }
  return out;
}

// etcd's own re-election: kill -9 of its raft leader until a member says it
// leads, polled every 5 ms.
std::vector<double> EtcdElections(LocalCluster& c, int runs) {
  std::vector<double> out;
  for (int i = 0; i < runs; ++i) {
    int leader = c.EtcdLeader();
    if (leader < 0) break;
    auto t0 = Clock::now();
    c.KillEtcd(leader);
    bool elected = c.WaitFor([&] { return c.EtcdLeader() >= 0; }, milliseconds(15000));
    if (!elected) break;
    out.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!c.StartEtcd(leader).ok()) break;
    std::this_thread::sleep_for(milliseconds(1500));  // the member rejoins
  }
  return out;
}

struct Steps {
  std::vector<double> fenced, routes, acked;
};

// `runs` crashes of a node, each restarted and back in service before the
// next; the controller's own timings of each failover. 20 streams are placed
// first, as in the demo, so that each failover moves work.
Steps Failovers(LocalCluster& c, int runs) {
  Steps s;
  if (!Settled(c)) return s;
  for (int i = 0; i < 20; ++i) {
    (void)c.Api("POST", "/api/v1/streams",
                json{{"id", "cam-" + std::to_string(i)}, {"tenant", "acme"}}.dump());
  }
  for (int i = 0; i < runs; ++i) {
    if (!Settled(c)) break;
    gpuha::cluster::LocalNode& n = c.nodes()[static_cast<size_t>(i) % 3];  // an active one
    const double t0 = NowUnixMs();
    c.KillNode(n);
    std::optional<json> f;
    c.WaitFor(
        [&] {
          auto all = c.Api("GET", "/api/v1/failovers");
          if (!all.ok() || !all->is_array()) return false;
          for (const json& x : *all) {
            if (x.value("node", "") == n.name && x.value("detected_unix_ms", 0.0) >= t0 &&
                x.contains("detected_to_routers_acked_ms")) {
              f = x;
              return true;
            }
          }
          return false;
        },
        milliseconds(10000));
    if (!f) {
      std::fprintf(stderr, "no failover of %s (run %d)\n", n.name.c_str(), i);
      break;
    }
    s.fenced.push_back((*f)["detected_to_fenced_ms"].get<double>());
    s.routes.push_back((*f)["detected_to_routes_pushed_ms"].get<double>());
    s.acked.push_back((*f)["detected_to_routers_acked_ms"].get<double>());
    if (!c.StartAgent(n).ok()) break;
  }
  return s;
}

void Row(const char* what, const Summary& s, const std::string& peer, double peer_value) {
  const std::string ratio = peer_value > 0 ? absl::StrFormat("%.2f", s.median / peer_value) : "-";
  std::printf("| %s | %zu | %.1f | %.1f | %.1f | %s | %s |\n", what, s.n, s.median, s.p99, s.max,
              peer.c_str(), ratio.c_str());
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

  std::vector<double> kill9, term, elections;
  Steps on_etcd, on_sqlite;
  {
    LocalCluster ha({.exe = exe, .controllers = 3}, Dir("etcd"));
    if (absl::Status s = ha.Start(); !s.ok()) {
      std::fprintf(stderr, "etcd cluster: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    kill9 = Takeovers(ha, SIGKILL, runs);
    term = Takeovers(ha, SIGTERM, runs);
    on_etcd = Failovers(ha, runs);
    elections = EtcdElections(ha, runs);
  }
  {
    LocalCluster one({.exe = exe}, Dir("sqlite"));
    if (absl::Status s = one.Start(); !s.ok()) {
      std::fprintf(stderr, "sqlite cluster: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    on_sqlite = Failovers(one, runs);
  }

  const Summary k9 = Summarize(kill9), tm = Summarize(term), el = Summarize(elections);
  std::printf("\n| measure (ms) | runs | median | p99 | max | peer or target | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  // Kubernetes' leader election with its defaults (leaseDuration 15 s,
  // retryPeriod 2 s): a standby takes over up to 15 s after the last renewal
  // of a killed leader, and tries every 2 s; 15 s is its best worst case.
  Row("takeover after kill -9 of the leader", k9, "Kubernetes lease defaults: 15000", 15000);
  Row("same, against the issue's target", k9, "target 2500", 2500);
  Row("takeover after SIGTERM of the leader", tm, "target 300", 300);
  Row("etcd's own re-election after kill -9 of its leader", el, "-", 0);
  Row("takeover after kill -9, against etcd's re-election", k9, "etcd median", el.median);
  const Summary fe = Summarize(on_etcd.fenced), fs = Summarize(on_sqlite.fenced);
  const Summary re = Summarize(on_etcd.routes), rs = Summarize(on_sqlite.routes);
  const Summary ae = Summarize(on_etcd.acked), as = Summarize(on_sqlite.acked);
  Row("failover on etcd: detected -> fenced", fe, "SQLite", fs.median);
  Row("failover on etcd: detected -> routes pushed", re, "SQLite", rs.median);
  Row("failover on etcd: detected -> routers acked", ae, "SQLite", as.median);
  Row("failover on SQLite: detected -> fenced", fs, "-", 0);
  Row("failover on SQLite: detected -> routes pushed", rs, "-", 0);
  Row("failover on SQLite: detected -> routers acked", as, "-", 0);
  const bool complete = k9.n == size_t(runs) && tm.n == size_t(runs) && el.n == size_t(runs) &&
                        re.n == size_t(runs) && rs.n == size_t(runs);
  if (!complete) std::fprintf(stderr, "some runs did not complete; see the messages above\n");
  // The clusters' directories (etcd's write-ahead logs are 64 MB each)
  // stay only when a run failed, for its logs.
  if (complete) {
    for (const char* name : {"etcd", "sqlite"}) {
      std::filesystem::remove_all(DirPath(name));
    }
  }
  return complete ? 0 : 1;
}
