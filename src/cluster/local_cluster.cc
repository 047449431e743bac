#include "cluster/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cluster/config_builders.h"
#include "common/etcd_argv.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/net_util.h"
#include "common/subprocess.h"
#include "etcd/client.h"
#include "gpu/pci_rebind.h"
#include "gpu/sim_probe.h"

namespace gpuha::cluster {

namespace {

// The workers an agent runs: one per GPU, or per MIG instance; more than
// one (or any MIG) makes each its own placement unit.
int ServersPerNode(const LocalClusterOptions& o) {
  return std::max(1, o.gpus_per_node) * std::max(1, o.mig_per_gpu);
}
bool PerGpu(const LocalClusterOptions& o) { return ServersPerNode(o) > 1 || o.mig_per_gpu > 0; }

// Where sysfs lists the sim backend's GPU `gpu` ("0000:41:00.0").
std::string SimGpuPciAddress(int gpu) {
  return gpu::SysfsPciAddress(gpu::SimPciBusId(static_cast<uint32_t>(gpu)));
}

}  // namespace

using nlohmann::json;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

LocalCluster::LocalCluster(LocalClusterOptions o, std::string dir)
    : o_(std::move(o)), dir_(std::move(dir)) {}

absl::Status LocalCluster::SetLink(bool up) {
  return Ip({"ip", "link", "set", veth_, up ? "up" : "down"});
}

absl::Status LocalCluster::Start() {
  // FreeLoopbackPort can hand out the same free port twice in a row (the
  // controller and an agent once got one port, and the agent could not
  // listen): every port here is distinct.
  std::set<uint16_t> used;
  auto port = [&used] {
    uint16_t p = 0;
    for (int tries = 0; tries < 100; ++tries) {
      p = common::FreeLoopbackPort();
      if (p != 0 && used.insert(p).second) break;
    }
    return p;
  };
  for (int i = 0; i < std::max(1, o_.controllers); ++i) {
    LocalController c;
    c.name = o_.controllers > 1 ? absl::StrCat("controller-", i + 1) : "controller";
    c.grpc_port = port();
    c.http_port = port();
    controllers_.push_back(c);
  }
  if (o_.controllers > 1) {
    for (int i = 0; i < 3; ++i) etcd_.push_back({absl::StrCat("etcd-", i + 1), port(), port()});
  }
  if (o_.routers < 1 || o_.routers > 8) return absl::InvalidArgumentError("routers: 1 to 8");
  char handoff_dir[] = "/tmp/gpuha-rt-XXXXXX";
  if (::mkdtemp(handoff_dir) == nullptr)
    return absl::InternalError("mkdtemp /tmp/gpuha-rt-XXXXXX failed");
  handoff_dir_ = handoff_dir;
  for (int i = 0; i < o_.routers; ++i) {
    LocalRouter r;
    r.name = o_.routers > 1 ? absl::StrCat("router-", i + 1) : "router";
    r.port = port();
    r.admin_port = port();
    r.config = absl::StrCat(dir_, "/", r.name, ".yaml");
    r.handoff = absl::StrCat(handoff_dir_, "/", i + 1, ".sock");
    routers_.push_back(r);
  }
  // A run of free ports: GPU i's worker is on the first + i.
  auto ports = [&](int count) -> uint16_t {
    for (int tries = 0; tries < 100; ++tries) {
      uint16_t p = common::FreeLoopbackPort();
      if (p == 0 || p + count > 65535) continue;
      bool free = true;
      for (int i = 0; i < count && free; ++i) {
        free = used.count(static_cast<uint16_t>(p + i)) == 0 &&
               (i == 0 || common::LoopbackPortFree(static_cast<uint16_t>(p + i)));
      }
      if (!free) continue;
      for (int i = 0; i < count; ++i) used.insert(static_cast<uint16_t>(p + i));
      return p;
    }
    return 0;
  };
  if (PerGpu(o_) && o_.watched_servers) {
    return absl::InvalidArgumentError("a worker per GPU is supervised by its agent, not watched");
  }
  for (int i = 0; i < o_.nodes; ++i) {
    LocalNode n;
    n.name = absl::StrCat("gpu-", i + 1);
    n.worker_port = PerGpu(o_) ? ports(ServersPerNode(o_)) : port();
    n.grpc_port = PerGpu(o_) ? ports(ServersPerNode(o_)) : port();
    n.agent_port = port();
    nodes_.push_back(n);
  }
  if (o_.partition) {
    if (absl::Status s = SetUpPartitionNetns(); !s.ok()) return s;
  }
  if (absl::Status s = WriteConfigs(); !s.ok()) return s;
  for (size_t i = 0; i < etcd_.size(); ++i) {
    if (absl::Status s = StartEtcd(static_cast<int>(i)); !s.ok()) return s;
  }
  if (!etcd_.empty() && !WaitFor([&] { return EtcdLeader() >= 0; }, milliseconds(15000))) {
    return absl::UnavailableError(
        absl::StrCat("etcd elected no leader in 15 s; see ", dir_, "/etcd-*.log"));
  }
  if (absl::Status s = StartController(); !s.ok()) return s;
  for (LocalNode& n : nodes_) {
    if (absl::Status s = StartAgent(n); !s.ok()) return s;
  }
  for (LocalRouter& r : routers_) {
    auto pid =
        Spawn({o_.exe, "router", "--config", r.config, "--handoff-socket", r.handoff}, r.name);
    if (!pid.ok()) return pid.status();
    r.pid = *pid;
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::StartRouter(size_t i) {
  LocalRouter& r = routers_.at(i);
  auto pid = Spawn({o_.exe, "router", "--config", r.config, "--handoff-socket", r.handoff}, r.name);
  if (!pid.ok()) return pid.status();
  r.pid = *pid;
  if (!WaitFor(
          [&] {
            auto h = common::HttpCall("GET", "127.0.0.1", r.admin_port, "/healthz", "",
                                      milliseconds(500));
            return h.ok() && h->status == 200;
          },
          milliseconds(10000))) {
    return absl::UnavailableError(
        absl::StrCat(r.name, " was not ready in 10 s; see ", dir_, "/", r.name, ".log"));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartRouter(size_t i, double* taken_ms) {
  LocalRouter& r = routers_.at(i);
  const pid_t old = r.pid;
  const std::string log = absl::StrCat(dir_, "/", r.name, ".log");
  auto given = [&] {  // the old process's word that the new one took its listeners
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    size_t n = 0;
    for (size_t at = text.str().find("given to the router that replaces this one");
         at != std::string::npos;
         at = text.str().find("given to the router that replaces this one", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t given_before = given();
  const auto start = SteadyClock::now();
  auto pid = Spawn({o_.exe, "router", "--config", r.config, "--handoff-socket", r.handoff}, r.name);
  if (!pid.ok()) return pid.status();
  r.pid = *pid;
  if (!WaitFor([&] { return given() > given_before; }, milliseconds(10000))) {
    return absl::UnavailableError(
        absl::StrCat(r.name, ": the new process did not take the listeners in 10 s; see ", log));
  }
  if (taken_ms != nullptr) {
    *taken_ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
  }
  if (!WaitFor(
          [&] {
            Reap();
            return ::kill(old, 0) != 0;
          },
          milliseconds(30000))) {
    return absl::DeadlineExceededError(
        absl::StrCat(r.name, ": the old process did not drain and exit in 30 s; see ", log));
  }
  return absl::OkStatus();
}

void LocalCluster::KillRouter(size_t i) {
  LocalRouter& r = routers_.at(i);
  if (r.pid > 0) ::kill(r.pid, SIGKILL);
  WaitFor(
      [&] {
        Reap();
        return ::kill(r.pid, 0) != 0;
      },
      milliseconds(5000));
  r.pid = -1;
}

absl::Status LocalCluster::StartController() {
  Reap();
  for (LocalController& c : controllers_) {
    if (c.pid > 0 && ::kill(c.pid, 0) == 0) continue;  // running (leading or standing by)
    auto pid = Spawn({o_.exe, "controller", "--config", c.config}, c.name);
    if (!pid.ok()) return pid.status();
    c.pid = *pid;
  }
  const bool ha = controllers_.size() > 1;
  if (!WaitFor([&] { return Api("GET", "/healthz").ok(); }, milliseconds(ha ? 15000 : 10000))) {
    return absl::UnavailableError(absl::StrCat("no controller answered in ", ha ? 15 : 10,
                                               " s; see ", dir_, "/controller*.log"));
  }
  return absl::OkStatus();
}

const LocalController* LocalCluster::Leader() const {
  for (size_t k = 0; k < controllers_.size(); ++k) {
    const size_t i = (leader_.load() + k) % controllers_.size();
    auto r = common::HttpCall("GET", "127.0.0.1", controllers_[i].http_port, "/healthz", "",
                              milliseconds(500));
    if (r.ok() && r->status == 200) {
      leader_.store(i);
      return &controllers_[i];
    }
  }
  return nullptr;
}

uint16_t LocalCluster::api_port() const {
  const LocalController* c = Leader();
  return c != nullptr ? c->http_port : controllers_.front().http_port;
}

absl::Status LocalCluster::StartEtcd(int i) {
  LocalEtcd& e = etcd_[static_cast<size_t>(i)];
  std::vector<std::string> members;
  for (const LocalEtcd& m : etcd_) {
    members.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
  }
  auto pid = Spawn(common::EtcdArgv({.name = e.name,
                                     .data_dir = dir_ + "/" + e.name,
                                     .client_port = e.client_port,
                                     .peer_port = e.peer_port,
                                     .initial_cluster = absl::StrJoin(members, ",")}),
                   e.name);
  if (!pid.ok()) return pid.status();
  e.pid = *pid;
  return absl::OkStatus();
}

void LocalCluster::KillEtcd(int i) {
  LocalEtcd& e = etcd_[static_cast<size_t>(i)];
  if (e.pid > 0) ::kill(e.pid, SIGKILL);
  Reap();
  e.pid = -1;
}

int LocalCluster::EtcdLeader() const {
  for (size_t i = 0; i < etcd_.size(); ++i) {
    if (etcd_[i].pid <= 0) continue;
    auto client = etcd::EtcdClient::Connect(
        {.endpoints = {absl::StrCat("http://127.0.0.1:", etcd_[i].client_port)},
         .timeout = milliseconds(500)});
    if (!client.ok()) continue;
    auto status = (*client)->Status();
    if (status.ok() && status->leader() != 0 && status->leader() == status->header().member_id()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string LocalCluster::JobProgressDir(const LocalNode& n) const {
  return absl::StrCat(dir_, "/", n.name, "-jobs");
}

uint64_t LocalCluster::JobProgress(const LocalNode& n, const std::string& job,
                                   uint64_t job_epoch) const {
  uint64_t step = 0;
  if (auto text =
          common::ReadFile(absl::StrCat(JobProgressDir(n), "/", job, ".", job_epoch, ".progress"));
      text.ok()) {
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &step);
  }
  return step;
}

std::string LocalCluster::PciDir(const LocalNode& n) const {
  return absl::StrCat(dir_, "/", n.name, "-pci");
}

absl::Status LocalCluster::VanishGpu(const LocalNode& n, int gpu) const {
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(PciDir(n)) / SimGpuPciAddress(gpu), ec);
  if (ec) return absl::InternalError(absl::StrCat("removing GPU ", gpu, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartAgent(LocalNode& n) {
  // The node (re)boots with its GPUs (AgentYaml's sim_count) on the bus.
  for (int g = 0; g < std::max(1, o_.gpus_per_node); ++g) {
    std::filesystem::path f = std::filesystem::path(PciDir(n)) / SimGpuPciAddress(g);
    std::error_code ec;
    std::filesystem::create_directories(f, ec);
    if (ec) return absl::InternalError(absl::StrCat(f.string(), ": ", ec.message()));
    for (auto [name, value] : {std::pair{"vendor", "0x10de\n"}, std::pair{"class", "0x030200\n"}}) {
      if (absl::Status s = common::WriteFileAtomic((f / name).string(), value); !s.ok()) return s;
    }
  }
  if (absl::Status s = StartWorker(n); !s.ok()) return s;
  std::vector<std::string> argv = {o_.exe, "agent", "--config", n.config};
  // `ip netns exec` enters the namespace and execs the agent (same pid).
  if (n.netns) argv.insert(argv.begin(), {"ip", "netns", "exec", netns_});
  auto pid = Spawn(argv, n.name);
  if (!pid.ok()) return pid.status();
  n.agent = *pid;
  return absl::OkStatus();
}

absl::Status LocalCluster::StartWorker(LocalNode& n) {
  if (!o_.watched_servers) return absl::OkStatus();
  Reap();  // a killed worker is no longer running
  if (WorkerPid(n) > 0) return absl::OkStatus();
  std::vector<std::string> argv = WorkerArgv(n);
  if (n.netns) argv.insert(argv.begin(), {"ip", "netns", "exec", netns_});
  auto pid = Spawn(argv, n.name + "-worker");
  if (!pid.ok()) return pid.status();
  n.worker = *pid;
  return absl::OkStatus();
}

std::vector<std::string> LocalCluster::WorkerArgv(const LocalNode& n) const {
  // With a worker per GPU, the agent fills in each one's ports.
  const std::string port = PerGpu(o_) ? "{port}" : absl::StrCat(n.worker_port);
  const std::string grpc = PerGpu(o_) ? "{grpc_port}" : absl::StrCat(n.grpc_port);
  std::vector<std::string> argv = {o_.exe,          "worker",
                                   "--listen",      absl::StrCat(n.host, ":", port),
                                   "--grpc-listen", absl::StrCat(n.host, ":", grpc),
                                   "--node",        n.name,
                                   "--latency",     std::to_string(o_.worker_latency_ms)};
  argv.insert(argv.end(), o_.worker_args.begin(), o_.worker_args.end());
  return argv;
}

void LocalCluster::StopAgent(LocalNode& n) {
  if (n.agent <= 0) return;
  ::kill(n.agent, SIGTERM);
  auto deadline = SteadyClock::now() + milliseconds(10000);
  // 0: still running (-1: already reaped by Reap()).
  while (::waitpid(n.agent, nullptr, WNOHANG) == 0) {
    if (SteadyClock::now() >= deadline) {
      ::kill(n.agent, SIGKILL);
      ::waitpid(n.agent, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  n.agent = -1;
}

void LocalCluster::KillNode(LocalNode& n) {
  // Every worker: a node with a worker per GPU runs several.
  std::vector<pid_t> workers;
  if (o_.watched_servers) {
    workers.push_back(WorkerPid(n));
  } else if (n.agent > 0) {
    workers = common::ChildPids(n.agent);
  }
  for (pid_t w : workers) {
    if (w > 0) ::kill(w, SIGKILL);
  }
  if (n.agent > 0) ::kill(n.agent, SIGKILL);
  Reap();
  n.agent = -1;
  n.worker = -1;
}

std::string LocalCluster::KillController() {
  const LocalController* leader = Leader();
  if (leader == nullptr) return "";
  LocalController& c = controllers_[static_cast<size_t>(leader - controllers_.data())];
  ::kill(c.pid, SIGKILL);
  Reap();
  c.pid = -1;
  return c.name;
}

pid_t LocalCluster::WorkerPid(const LocalNode& n) const {
  if (o_.watched_servers) return n.worker > 0 && ::kill(n.worker, 0) == 0 ? n.worker : -1;
  if (n.agent <= 0) return -1;
  std::vector<pid_t> children = common::ChildPids(n.agent);
  return children.empty() ? -1 : children.front();
}

absl::StatusOr<json> LocalCluster::Api(const std::string& method, const std::string& target,
                                       const std::string& body) const {
  const LocalController* leader = controllers_.size() > 1 ? Leader() : &controllers_.front();
  if (leader == nullptr) return absl::UnavailableError("no controller leads");
  auto r =
      common::HttpCall(method, "127.0.0.1", leader->http_port, target, body, milliseconds(2000));
  if (!r.ok()) return r.status();
  if (r->status / 100 != 2) {
    return absl::UnavailableError(absl::StrCat(method, " ", target, ": ", r->status, " ", r->body));
  }
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return absl::InternalError(target + ": not JSON");
  return j;
}

absl::Status LocalCluster::InjectSimFault(const LocalNode& n, const std::string& spec) const {
  auto r =
      common::HttpCall("POST", n.host, n.agent_port, "/v1/sim/faults", spec, milliseconds(2000));
  if (!r.ok()) return r.status();
  if (r->status != 202) return absl::InternalError(absl::StrCat("inject ", spec, ": ", r->body));
  return absl::OkStatus();
}

absl::Status LocalCluster::SetWorkerFault(const LocalNode& n, const std::string& mode) const {
  auto r = common::HttpCall("POST", n.host, n.worker_port, "/v1/fault?mode=" + mode, "",
                            milliseconds(2000));
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::InternalError(absl::StrCat("worker fault ", mode, ": ", r->body));
  }
  return absl::OkStatus();
}

bool LocalCluster::WaitGraceOver(milliseconds timeout) {
  return WaitFor(
      [&] {
        auto s = Api("GET", "/api/v1/status");
        return s.ok() && s->value("startup_grace_left_ms", int64_t{-1}) == 0;
      },
      timeout);
}

bool LocalCluster::WorkerReady(const LocalNode& n, milliseconds timeout) {
  return WaitFor(
      [&] {
        auto r = common::HttpCall("GET", n.host, n.worker_port, "/v2/health/ready", "",
                                  milliseconds(500));
        return r.ok() && r->status == 200;
      },
      timeout);
}

bool LocalCluster::WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  while (!Stopping()) {
    Reap();
    if (done()) return true;
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

bool LocalCluster::Sleep(milliseconds d) {
  return !WaitFor([] { return false; }, d) && !Stopping();
}

void LocalCluster::Stop() {
  if (stopped_) return;
  stopped_ = true;
  std::vector<pid_t> pids;
  for (const LocalRouter& r : routers_) {
    if (r.pid > 0) pids.push_back(r.pid);
  }
  for (const LocalNode& n : nodes_) {
    pid_t w = WorkerPid(n);
    if (w > 0) pids.push_back(w);
    if (n.agent > 0) pids.push_back(n.agent);
  }
  for (const LocalController& c : controllers_) {
    if (c.pid > 0) pids.push_back(c.pid);
  }
  for (const LocalEtcd& e : etcd_) {
    if (e.pid > 0) pids.push_back(e.pid);
  }
  for (pid_t p : pids) {
    ::kill(p, SIGCONT);
    ::kill(p, SIGTERM);
  }
  auto deadline = SteadyClock::now() + milliseconds(3000);
  auto alive = [&] {
    Reap();
    return std::any_of(pids.begin(), pids.end(), [](pid_t p) { return ::kill(p, 0) == 0; });
  };
  while (alive() && SteadyClock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
  for (pid_t p : pids) ::kill(p, SIGKILL);
  while (alive() && SteadyClock::now() < deadline + milliseconds(2000)) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (netns_made_) (void)Ip({"ip", "netns", "del", netns_});  // takes the veth pair too
  if (!handoff_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(handoff_dir_, ec);
  }
}

void LocalCluster::Reap() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

LocalNode* LocalCluster::FindNode(const std::string& name) {
  for (LocalNode& n : nodes_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::vector<std::string>& argv,
                                          const std::string& name) {
  return common::SpawnProcess(argv, absl::StrCat(dir_, "/", name, ".log"));
}

absl::Status LocalCluster::Ip(const std::vector<std::string>& argv) {
  auto pid = common::SpawnProcess(argv, dir_ + "/netns.log");
  if (!pid.ok()) return pid.status();
  int status = 0;
  ::waitpid(*pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", absl::StrJoin(argv, " "), "' failed; see ", dir_, "/netns.log"));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::SetUpPartitionNetns() {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError(
        "the partition fault needs root (it makes a network namespace and a veth pair)");
  }
  std::string id = std::to_string(::getpid() % 100000);
  netns_ = "gpuha-demo-" + id;
  veth_ = "gpuha" + id;  // 15 characters at most
  std::string peer = "gpuhn" + id;
  const std::string here = "10.213.0.1", there = "10.213.0.2";
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"ip", "netns", "add", netns_},
           {"ip", "link", "add", veth_, "type", "veth", "peer", "name", peer, "netns", netns_},
           {"ip", "addr", "add", here + "/30", "dev", veth_},
           {"ip", "link", "set", veth_, "up"},
           {"ip", "netns", "exec", netns_, "ip", "addr", "add", there + "/30", "dev", peer},
           {"ip", "netns", "exec", netns_, "ip", "link", "set", peer, "up"},
           {"ip", "netns", "exec", netns_, "ip", "link", "set", "lo", "up"}}) {
    if (absl::Status s = Ip(cmd); !s.ok()) return s;
    netns_made_ = true;
  }
  ctl_host_ = here;
  nodes_[0].netns = true;
  nodes_[0].host = there;
  return absl::OkStatus();
}

absl::Status LocalCluster::WriteConfigs() {
  std::vector<std::string> grpc;  // every controller: agents and the router follow the leader
  for (const LocalController& ctl : controllers_) {
    grpc.push_back(absl::StrCat(ctl_host_, ":", ctl.grpc_port));
  }
  ControllerYaml c;
  c.comment = absl::StrCat("written by gpuha: ", o_.nodes - 1, " active nodes and 1 passive (N+1)");
  const int gpus = std::max(1, o_.gpus_per_node);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    NodeEntry e{.name = nodes_[i].name,
                .role = i + 1 < nodes_.size() ? "active" : "passive",
                .capacity = o_.node_capacity,
                .address = absl::StrCat(nodes_[i].host, ":", nodes_[i].worker_port)};
    // The workers' KServe v2 gRPC ports: routers route gRPC calls there.
    if (!PerGpu(o_)) e.grpc_address = absl::StrCat(nodes_[i].host, ":", nodes_[i].grpc_port);
    // The agent's order: GPU 0's (or its instances'), then GPU 1's.
    const int servers = ServersPerNode(o_);
    for (int k = 0; PerGpu(o_) && k < servers; ++k) {
      const int mig = o_.mig_per_gpu;
      e.gpu_servers.push_back(
          {.index = mig > 0 ? k / mig : k,
           .slice = mig > 0 ? std::optional(k % mig) : std::nullopt,
           .address = absl::StrCat(nodes_[i].host, ":", nodes_[i].worker_port + k),
           .grpc_address = absl::StrCat(nodes_[i].host, ":", nodes_[i].grpc_port + k),
           .capacity = (o_.node_capacity + servers - 1) / servers});
    }
    c.nodes.push_back(std::move(e));
  }
  c.tenants = {"acme"};
  c.healthy_for_ms = 1000;
  c.max_failures = o_.max_failures;
  c.window_s = 600;
  c.fence_hook = o_.fence_hook;
  c.fence_timeout_ms = o_.fence_timeout_ms;
  for (const LocalEtcd& e : etcd_)
    c.etcd.push_back(absl::StrCat("http://127.0.0.1:", e.client_port));
  if (etcd_.empty()) c.store_path = dir_ + "/controller.db";
  for (size_t i = 0; i < controllers_.size(); ++i) {
    c.grpc_listen = grpc[i];
    c.http_listen = absl::StrCat("127.0.0.1:", controllers_[i].http_port);
    controllers_[i].config = absl::StrCat(dir_, "/", controllers_[i].name, ".yaml");
    if (absl::Status s = common::WriteFileAtomic(controllers_[i].config, c.Yaml()); !s.ok()) {
      return s;
    }
  }
  for (LocalNode& n : nodes_) {
    n.config = absl::StrCat(dir_, "/", n.name, ".yaml");
    const std::string worker =
        absl::StrCat(n.host, ":", PerGpu(o_) ? "{port}" : absl::StrCat(n.worker_port));
    AgentYaml a;
    a.node = n.name;
    a.sim_count = gpus;
    a.sim_mig = o_.mig_per_gpu;
    if (PerGpu(o_)) {
      a.per_gpu_port_base = n.worker_port;
      a.per_gpu_grpc_port_base = n.grpc_port;
    }
    a.controllers = grpc;
    a.sample_ms = 100;
    a.heartbeat_ms = 50;
    // A GPU probe call stuck for 500 ms fails its GPU; the sim GPUs sit in a
    // PCI tree of the node's own, from which a GPU can vanish.
    a.call_deadline_ms = 500;
    a.pci_devices = PciDir(n);
    a.listen = absl::StrCat(n.host, ":", n.agent_port);
    // Supervised by the agent, or (watched_servers) started beside it.
    if (!o_.watched_servers) a.server_command = WorkerArgv(n);
    a.ready_url = absl::StrCat("http://", worker, "/v2/health/ready");
    // The engine watch: a worker whose inference is stuck while its
    // readiness answers is reported not ready within about 0.75 s.
    a.metrics_url = absl::StrCat("http://", worker, "/metrics");
    a.stall_after_ms = 600;
    // The agent stops a fenced worker it supervises; one it only watches
    // leaves readiness (routers get routes without it).
    a.fence_mode = o_.watched_servers ? "unready" : "stop";
    a.probe_interval_ms = 100;
    a.probe_timeout_ms = 100;
    // Each node's jobs write their progress here (JobProgress reads it).
    a.job_progress_dir = JobProgressDir(n);
    if (absl::Status s = common::WriteFileAtomic(n.config, a.Yaml()); !s.ok()) return s;
  }
  for (const LocalRouter& lr : routers_) {
    RouterYaml r;
    r.listen = absl::StrCat("127.0.0.1:", lr.port);
    r.admin = absl::StrCat("127.0.0.1:", lr.admin_port);
    r.threads = 1;
    r.id = "demo-" + lr.name;
    r.controllers = grpc;
    r.tenants = {{.name = "acme",
                  .api_keys = {o_.api_key},
                  .requests_per_second = 100000,
                  .burst = 100000,
                  .max_concurrent = 4096}};
    if (absl::Status s = common::WriteFileAtomic(lr.config, r.Yaml()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace gpuha::cluster
