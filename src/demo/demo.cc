#include "demo/demo.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "api/events.h"
#include "api/units.h"
#include "cluster/local_cluster.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "demo/faults.h"
#include "worker/checkpoint.h"
#include "worker/trainer.h"

namespace gpuha::demo {

using nlohmann::json;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

using cluster::LocalCluster;
using cluster::LocalNode;
using cluster::LocalRouter;

int64_t UnixNanos() { return common::RealClock::Get()->UnixNanos(); }

// The demo's training job (--train).
constexpr char kJob[] = "train-demo";
constexpr int kJobEvery = 50;  // steps between checkpoints, 10 ms each

// Every answer the load saw, for timelines after the fact.
struct AnswerLog {
  struct Rec {
    int64_t ns;
    std::string stream;
    std::string node;
    bool ok;
  };
  std::mutex mu;
  std::vector<Rec> recs;
  std::atomic<uint64_t> ok{0}, failed{0};
  void Add(const load::Answer& a) {
    (a.ok ? ok : failed)++;
    std::lock_guard<std::mutex> lock(mu);
    recs.push_back({a.unix_nanos, *a.stream, a.node, a.ok});
  }
  std::vector<Rec> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return recs;
  }
  // Answers between t0 and t_end (unix ns), and the failed ones among them.
  void CountIn(int64_t t0, int64_t t_end, uint64_t* answered, uint64_t* failed) {
    std::lock_guard<std::mutex> lock(mu);
    for (const Rec& r : recs) {
      if (r.ns < t0 || r.ns > t_end) continue;
      ++*answered;
      if (!r.ok) ++*failed;
    }
  }
};

// A load beside the main one (LLM token streams, gRPC), its answers logged.
struct SideLoad {
  load::LoadOptions o;
  AnswerLog answers;
  std::thread thread;
};

// Stream -> the placement unit it is on: a node, or with a worker per GPU
// "NODE/gpuI".
std::map<std::string, std::string> Units(const json& streams) {
  std::map<std::string, std::string> out;
  if (!streams.is_array()) return out;
  for (const json& s : streams) out[s.value("id", "")] = s.value("primary", "");
  return out;
}

// "NODE/gpuG/migS": G and S.
bool ParseSliceUnit(const std::string& unit, uint32_t* gpu, uint32_t* slice) {
  const size_t at = unit.find("/gpu");
  if (at == std::string::npos) return false;
  std::vector<std::string> parts = absl::StrSplit(unit.substr(at + 4), "/mig");
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], gpu) && absl::SimpleAtoi(parts[1], slice);
}

// The MIG instance of `node` with the most streams (its first one when none has any).
std::string BusiestSlice(const LocalNode& node, const std::map<std::string, std::string>& units) {
  std::map<std::string, int> load;
  for (const auto& [s, unit] : units) {
    if (api::NodeOfUnit(unit) == node.name && unit.find("/mig") != std::string::npos) {
      load[unit]++;
    }
  }
  std::string best = node.name + "/gpu0/mig0";
  int most = 0;
  for (const auto& [unit, n] : load) {
    if (n > most) std::tie(best, most) = std::tie(unit, n);
  }
  return best;
}

// Stream -> the node it is on.
std::map<std::string, std::string> Primaries(const json& streams) {
  std::map<std::string, std::string> out = Units(streams);
  for (auto& [s, p] : out) p = api::NodeOfUnit(p);
  return out;
}

class Demo {
 public:
  Demo(const DemoOptions& o, LocalCluster& c, std::ostream& out)
      : o_(o), c_(c), out_(out), faults_{c} {}

  absl::Status WaitReady() {
    // Every node connected and in service, then every stream answering.
    bool nodes_up = c_.WaitFor(
        [&] {
          auto nodes = c_.Api("GET", "/api/v1/nodes");
          if (!nodes.ok() || !nodes->is_array() || nodes->size() != c_.nodes().size()) {
            return false;
          }
          for (const json& n : *nodes) {
            if (n.value("state", "") != "alive") return false;
          }
          return true;
        },
        milliseconds(20000));
    if (!nodes_up) {
      return absl::UnavailableError(
          absl::StrCat("the agents did not all connect in 20 s; see ", c_.dir(), "/gpu-*.log"));
    }
    // Every worker up before any stream is placed: a stream whose first
    // request finds its primary still starting fails over in the router and
    // stays on its standby for failover.sticky_ms, which would blur the
    // first fault's timeline.
    for (const LocalNode& n : c_.nodes()) {
      if (!c_.WorkerReady(n, milliseconds(20000))) {
        return absl::UnavailableError(absl::StrCat(
            n.name, "'s worker did not become ready in 20 s; see ", c_.dir(), "/", n.name, ".log"));
      }
    }
    for (int i = 0; i < o_.streams; ++i) {
      auto r = c_.Api("POST", "/api/v1/streams",
                      json{{"id", absl::StrCat("cam-", i)}, {"tenant", "acme"}}.dump());
      if (!r.ok())
        return absl::InternalError(absl::StrCat("admitting cam-", i, ": ", r.status().message()));
    }
    // Through each router: each stream's worker answers a real inference,
    // and over gRPC, through the routes' gRPC addresses: calls, then streams.
    bool ready = true;
    for (const LocalRouter& router : c_.routers()) {
      load::LoadOptions probe = Load(200, milliseconds(300), milliseconds(2000));
      probe.port = router.port;
      probe.more_routers.clear();
      for (int kind = 0; kind < (o_.grpc_streams > 0 ? 3 : 1) && ready; ++kind) {
        probe.infer = kind == 0;
        probe.grpc = kind == 1;
        probe.grpc_stream = kind == 2;
        if (kind > 0) probe.streams = std::min(o_.grpc_streams, o_.streams);
        ready = c_.WaitFor(
            [&] {
              auto r = load::RunLoad(probe);
              return r.ok() && r->failed == 0 && r->ok > 0;
            },
            milliseconds(20000));
      }
    }
    if (!ready) {
      return absl::UnavailableError(
          absl::StrCat("streams did not answer through the router in 20 s; see ", c_.dir(),
                       "/router.log and gpu-*.log"));
    }
    if (!c_.WaitGraceOver(milliseconds(20000))) {
      return absl::UnavailableError("the controller's startup grace did not end in 20 s");
    }
    return absl::OkStatus();
  }

  // Checked KServe inference on every stream through the router.
  load::LoadOptions Load(double rate, milliseconds duration, milliseconds timeout) const {
    load::LoadOptions l;
    l.port = c_.router_port();
    for (size_t i = 1; i < c_.routers().size(); ++i) {
      l.more_routers.push_back({"127.0.0.1", c_.routers()[i].port});
    }
    l.streams = o_.streams;
    l.rate = rate;
    l.duration = duration;
    l.timeout = timeout;
    l.api_key = c_.options().api_key;
    l.infer = true;
    l.path = "/v2/models/cv/infer";
    l.progress = false;
    return l;
  }

  void StartLoad() {
    lo_ = Load(o_.rate, std::chrono::hours(24), milliseconds(10000));  // runs until stop_load_
    lo_.stop = &stop_load_;
    lo_.slow_fraction = o_.slow_fraction;
    lo_.slow_query = "delay_ms=1500";
    lo_.on_answer = [this](const load::Answer& a) { answers_.Add(a); };
    load_thread_ = std::thread([this] {
      auto r = load::RunLoad(lo_);
      if (r.ok()) report_.load = *r;
    });
    status_thread_ = std::thread([this] { StatusLine(); });
    if (o_.llm_streams > 0) {
      load::LoadOptions l = Load(0, std::chrono::hours(24), milliseconds(10000));
      l.sse = true;
      l.infer = false;
      l.path = "/v1/completions";
      l.streams = std::min(o_.llm_streams, o_.streams);
      l.concurrency = o_.llm_streams;
      l.max_tokens = 64;
      l.llm_model = o_.llm_model;
      l.llm_chat = o_.llm_mixed;
      l.llm_seeded = o_.llm_mixed;
      l.llm_structured = o_.llm_structured;
      Start(llm_, l, &report_.llm);
    }
    if (o_.grpc_streams > 0) {
      load::LoadOptions g = Load(o_.rate / 8, std::chrono::hours(24), milliseconds(10000));
      g.infer = false;
      g.streams = std::min(o_.grpc_streams, o_.streams);
      g.grpc = true;
      Start(grpc_, g, &report_.grpc);
      g.grpc = false;
      g.grpc_stream = true;
      Start(grpc_stream_, g, &report_.grpc_stream);
    }
  }
  // A load beside the main one, until stop_load_, its answers logged.
  void Start(SideLoad& side, const load::LoadOptions& o, load::LoadReport* out) {
    side.o = o;
    side.o.stop = &stop_load_;
    side.o.on_answer = [&side](const load::Answer& a) { side.answers.Add(a); };
    side.thread = std::thread([&side, out] {
      auto r = load::RunLoad(side.o);
      if (r.ok()) {
        *out = *r;
      } else {
        std::fprintf(stderr, "demo: a side load did not run: %s\n",
                     std::string(r.status().message()).c_str());
      }
    });
  }

  // The routers' count of answers continued on the standby mid-answer (a
  // router restarted since counts from 0 again).
  double Continuations() const {
    double sum = 0;
    for (const LocalRouter& router : c_.routers()) {
      auto r = common::HttpCall("GET", "127.0.0.1", router.admin_port, "/metrics", "",
                                milliseconds(2000));
      if (!r.ok()) continue;
      const std::string name = "\ngpuha_router_sse_continuations_total ";
      size_t at = r->body.find(name);
      if (at != std::string::npos) sum += std::stod(r->body.substr(at + name.size()));
    }
    return sum;
  }
  void StopLoad() {
    stop_load_ = true;
    if (load_thread_.joinable()) load_thread_.join();
    for (SideLoad* side : {&llm_, &grpc_, &grpc_stream_}) {
      if (side->thread.joinable()) side->thread.join();
    }
    status_done_ = true;
    if (status_thread_.joinable()) status_thread_.join();
  }

  // --train: the job, 10 ms a step for longer than any demo runs, its
  // checkpoints in the demo's folder (the storage every node mounts).
  absl::Status StartJob() {
    const std::string san = c_.dir() + "/san";
    std::error_code ec;
    std::filesystem::create_directories(san, ec);
    json body = {{"id", kJob},
                 {"command",
                  {o_.exe, "worker", "--train", "--checkpoint-dir", "{checkpoint_dir}", "--epoch",
                   "{epoch}", "--steps", "100000000", "--checkpoint-every", "{checkpoint_every}",
                   "--step-ms", "10", "--progress-file", "{progress_file}"}},
                 {"checkpoint_dir", san + "/" + kJob},
                 {"checkpoint_every", kJobEvery}};
    auto added = c_.Api("POST", "/api/v1/jobs", body.dump());
    if (!added.ok()) return added.status();
    if (!c_.WaitFor([&] { return Job().value("checkpoint_step", 0) >= kJobEvery; },
                    milliseconds(20000))) {
      return absl::UnavailableError(
          absl::StrCat("the training job did not checkpoint in 20 s: ", Job().dump()));
    }
    return absl::OkStatus();
  }
  json Job() {
    auto j = c_.Api("GET", absl::StrCat("/api/v1/jobs/", kJob));
    return j.ok() ? *j : json::object();
  }
  // Stops the job (it checkpoints the step it reached) and compares its
  // state there with a run that never failed.
  void StopJob() {
    const json j = Job();
    LocalNode* node = c_.FindNode(j.value("node", ""));
    const uint64_t epoch = j.value("job_epoch", uint64_t{0});
    (void)c_.Api("DELETE", absl::StrCat("/api/v1/jobs/", kJob));
    auto dir = worker::CheckpointDir::Open(c_.dir() + "/san/" + kJob);
    if (!dir.ok() || node == nullptr) return;
    std::optional<worker::Checkpoint> last;
    // Its last checkpoint is the step its progress file shows, once it ended.
    c_.WaitFor(
        [&] {
          auto latest = dir->Latest();
          if (!latest.ok() || !latest->has_value()) return false;
          last = **latest;
          return last->step == c_.JobProgress(*node, kJob, epoch);
        },
        milliseconds(10000));
    if (!last) return;
    report_.train_step = last->step;
    report_.train_exact = worker::TrainStateAfter(last->step) == last->state;
  }

  // One fault: inject, watch, repair, wait for the node to rejoin as spare.
  FaultTimeline Run(const std::string& fault) {
    const FaultSpec& spec = *FindFault(fault);  // names were checked up front
    const bool controller = spec.target == Target::kController;
    const bool every = spec.target == Target::kEveryNode;
    const bool fleet = spec.target == Target::kFleet;
    const bool router = spec.target == Target::kRouter;
    FaultTimeline t;
    t.fault = fault;
    auto before = c_.Api("GET", "/api/v1/streams");
    std::map<std::string, std::string> primaries = Primaries(before.ok() ? *before : json());
    std::map<std::string, size_t> load_of;
    for (const auto& [s, p] : primaries) load_of[p]++;
    // The busiest node (and, for double-crash, the next busiest too).
    std::vector<LocalNode*> by_load;
    for (LocalNode& n : c_.nodes()) by_load.push_back(&n);
    std::stable_sort(by_load.begin(), by_load.end(), [&](LocalNode* a, LocalNode* b) {
      return load_of[a->name] > load_of[b->name];
    });
    LocalNode* node = by_load[0];
    for (LocalNode& n : c_.nodes()) {
      if (n.name == o_.target) node = &n;
    }
    if (spec.partition) node = &c_.nodes()[0];  // only gpu-1 has a namespace of its own
    const json job_before = spec.target == Target::kJobNode ? Job() : json::object();
    if (LocalNode* runs_job = c_.FindNode(job_before.value("node", ""))) node = runs_job;
    second_ = nullptr;
    if (spec.target == Target::kTwoNodes) {
      for (LocalNode* n : by_load) {
        if (n != node && second_ == nullptr) second_ = n;  // the busiest other node
      }
    }
    std::set<std::string> hit;
    // A GPU's (or a MIG instance's) fault hits its streams; the node's
    // others should stay.
    const bool gpu = spec.target == Target::kGpu || spec.target == Target::kSlice;
    const std::map<std::string, std::string> units = Units(before.ok() ? *before : json());
    const std::string unit = spec.target == Target::kGpu     ? node->name + "/gpu1"
                             : spec.target == Target::kSlice ? BusiestSlice(*node, units)
                                                             : "";
    if (spec.target == Target::kSlice && !ParseSliceUnit(unit, &faults_.gpu, &faults_.slice)) {
      t.note = "not a MIG instance's unit: " + unit;
    }
    std::set<std::string> node_others;
    for (const auto& [s, p] : primaries) {
      if (gpu) {
        if (units.at(s) == unit) {
          hit.insert(s);
        } else if (p == node->name) {
          node_others.insert(s);
        }
      } else if (controller || every || fleet || router || p == node->name ||
                 (second_ && p == second_->name)) {
        hit.insert(s);
      }
    }
    t.node = controller || router ? "control-plane"
             : every || fleet     ? "every node"
             : gpu                ? unit
             : second_            ? node->name + "+" + second_->name
                                  : node->name;
    t.streams_hit = hit.size();
    int64_t last_event = 0;
    if (auto ev = c_.Api("GET", "/api/v1/events"); ev.ok() && ev->is_array() && !ev->empty()) {
      last_event = ev->back().value("id", int64_t{0});
    }
    out_ << absl::StrFormat("\n== %s on %s (%d streams) ==\n", fault, t.node, t.streams_hit);
    out_.flush();
    const double continued_before = Continuations();
    int64_t t0 = UnixNanos();
    faults_.hit.clear();
    absl::Status injected = absl::OkStatus();
    if (every) {  // each node in turn, back in service before the next
      for (LocalNode& n : c_.nodes()) {
        if (injected.ok()) injected = spec.inject(faults_, n);
        if (injected.ok()) injected = Repair(spec, n, &t);
      }
    } else if (fleet) {  // all at once
      for (LocalNode& n : c_.nodes()) {
        if (injected.ok()) injected = spec.inject(faults_, n);
      }
    } else {
      injected = spec.inject(faults_, *node);
    }
    if (injected.ok() && second_ != nullptr) injected = spec.inject(faults_, *second_);
    if ((controller || router) && !faults_.hit.empty()) t.node = faults_.hit;
    t.router_taken_ms = faults_.router_taken_ms;
    faults_.router_taken_ms.clear();
    if (!injected.ok()) t.note = absl::StrCat("inject failed: ", injected.message());
    c_.Sleep(milliseconds(o_.observe_ms));
    if (spec.target == Target::kJobNode) JobSteps(*node, job_before, t0, &t);

    if (!controller && !router) {
      auto events = c_.Api("GET", absl::StrCat("/api/v1/events?after=", last_event));
      std::vector<api::Event> logged;
      if (events.ok() && events->is_array()) {
        for (const json& e : *events) {
          if (auto parsed = api::EventFromJson(e); parsed.ok()) logged.push_back(*parsed);
        }
      }
      for (const api::Event& e : logged) {
        t.taken_out += e.type == "detected";
        t.quarantine_held += e.type == "quarantine_held";
      }
      if (gpu) {
        GpuSteps(logged, node->name, t0, &t);
      } else {
        ControllerSteps(logged, node->name, t0, &t);
      }
      if (auto cap = c_.Api("GET", "/api/v1/capacity"); cap.ok()) {
        t.unplaced_streams = cap->value("unplaced_streams", int64_t{0});
      }
    }
    // Streams with no home during the fault go wherever capacity returns.
    auto during = c_.Api("GET", "/api/v1/streams");
    if (gpu) {
      const std::map<std::string, std::string> now = Units(during.ok() ? *during : json());
      t.node_streams = node_others.size();
      t.node_streams_kept = 0;
      for (const std::string& s : node_others) {
        auto it = now.find(s);
        if (it != now.end() && it->second == units.at(s)) ++*t.node_streams_kept;
      }
    }
    for (const auto& [s, p] : Primaries(during.ok() ? *during : json())) {
      if (p.empty()) hit.erase(s);
    }
    absl::Status repaired = router ? (spec.repair ? spec.repair(faults_, *node) : absl::OkStatus())
                            : controller ? RepairController(primaries, t0, &t)
                            : every      ? absl::OkStatus()  // each node was back before the next
                            : fleet      ? RepairFleet(spec, &t)
                                         : Repair(spec, *node, &t);
    if (repaired.ok() && second_ != nullptr) repaired = Repair(spec, *second_, &t);
    if (every) {
      auto after = c_.Api("GET", "/api/v1/streams");
      t.routes_unchanged = after.ok() && Primaries(*after) == primaries;
    } else if (!controller && !fleet && !router) {
      // A node that came back is the spare: the work it lost stays where it went.
      auto after = c_.Api("GET", "/api/v1/streams");
      for (const auto& [s, p] : Primaries(after.ok() ? *after : json())) {
        if (hit.count(s) && (p == node->name || (second_ && p == second_->name))) t.moved_back++;
      }
    }
    if (!repaired.ok()) t.note += (t.note.empty() ? "" : "; ") + std::string(repaired.message());
    int64_t t_end = UnixNanos();
    Count(t0, t_end, hit, controller || every || fleet || router ? "" : node->name, &t);
    llm_.answers.CountIn(t0, t_end, &t.llm_answered, &t.llm_failed);
    grpc_.answers.CountIn(t0, t_end, &t.grpc_answered, &t.grpc_failed);
    grpc_stream_.answers.CountIn(t0, t_end, &t.grpc_stream_answered, &t.grpc_stream_failed);
    t.llm_continued = static_cast<uint64_t>(std::max(0.0, Continuations() - continued_before));
    PrintTimeline(t);
    return t;
  }

  DemoReport& report() { return report_; }

 private:
  // train-crash: the job's takeover from its record, once it runs again.
  void JobSteps(const LocalNode& node, const json& before, int64_t t0, FaultTimeline* t) {
    const uint64_t epoch = before.value("job_epoch", uint64_t{0});
    json after;
    c_.WaitFor(
        [&] {
          after = Job();
          return after.value("phase", "") == "running" &&
                 after.value("job_epoch", uint64_t{0}) > epoch;
        },
        milliseconds(15000));
    if (!after.contains("last_takeover") || after.value("job_epoch", uint64_t{0}) <= epoch) {
      t->note = absl::StrCat("the training job did not run again: ", after.dump());
      return;
    }
    const json& lt = after["last_takeover"];
    const double t0_ms = double(t0) / 1e6;
    t->job_fenced_ms = lt.value("fenced_unix_ms", 0.0) - t0_ms;
    t->job_started_ms = lt.value("started_unix_ms", 0.0) - lt.value("fenced_unix_ms", 0.0);
    // The crashed run reached at least the step of the checkpoint it wrote
    // last: it writes its progress file after each checkpoint, so a crash
    // between the two leaves the file one step behind (read beside a busy
    // loop as "-1 steps lost").
    const int64_t resumed_from = lt.value("resumed_from", int64_t{0});
    const int64_t reached = std::max(int64_t(c_.JobProgress(node, kJob, epoch)), resumed_from);
    t->steps_lost = reached - resumed_from;
  }

  // The controller is back: same routes, every agent reconnected, and the
  // router has acknowledged the new controller's routes.
  absl::Status RepairController(const std::map<std::string, std::string>& primaries, int64_t t0,
                                FaultTimeline* t) {
    {
      if (t->fault == "etcd-quorum-loss") {
        // Without quorum for as long as it takes the leader to stop acting
        // (its lease's TTL), whatever --observe-ms says.
        if (c_.WaitFor([&] { return c_.Leader() == nullptr; }, milliseconds(8000))) {
          t->leader_stopped_ms = double(UnixNanos() - t0) / 1e6;
        }
      }
      for (int i : faults_.killed_etcd) {
        if (absl::Status s = c_.StartEtcd(i); !s.ok()) return s;
      }
      faults_.killed_etcd.clear();
      if (!c_.etcd().empty() &&
          !c_.WaitFor([&] { return c_.EtcdLeader() >= 0; }, milliseconds(15000))) {
        return absl::DeadlineExceededError("etcd did not elect a leader again within 15 s");
      }
      // Every controller that is down (killed) starts again; one leads (a
      // leader that lost its lease stood by again by itself).
      if (absl::Status s = c_.StartController(); !s.ok()) return s;
      // The first act of the controller that leads after the fault. The
      // API may be slow to answer on a loaded host: asked until it does.
      c_.WaitFor(
          [&] {
            auto ev = c_.Api("GET", "/api/v1/events");
            if (!ev.ok() || !ev->is_array()) return false;
            for (const json& e : *ev) {
              const double at = e.value("unix_ms", 0.0);
              if (e.value("type", "") == "controller_started" && at * 1e6 >= double(t0)) {
                t->takeover_ms = at - double(t0) / 1e6;
                return true;
              }
            }
            return true;  // answered: no controller started since the fault
          },
          milliseconds(10000));
      // The restarted controller must hold the same routes.
      std::optional<json> after;
      c_.WaitFor(
          [&] {
            auto streams = c_.Api("GET", "/api/v1/streams");
            if (streams.ok()) after = *streams;
            return after.has_value();
          },
          milliseconds(10000));
      t->routes_unchanged = after && Primaries(*after) == primaries;
      // The router reconnects and acknowledges the new controller's routes,
      // and every agent is back.
      t->routers_reacked = c_.WaitFor(
          [&] {
            auto ev = c_.Api("GET", "/api/v1/events");
            if (!ev.ok() || !ev->is_array()) return false;
            bool restarted = false, acked = false;
            for (const json& e : *ev) {
              std::string type = e.value("type", "");
              if (type == "controller_started") restarted = true, acked = false;
              if (restarted && type == "routers_acked") acked = true;
            }
            return acked;
          },
          milliseconds(10000));
      bool agents = c_.WaitFor(
          [&] {
            auto nodes = c_.Api("GET", "/api/v1/nodes");
            if (!nodes.ok() || !nodes->is_array()) return false;
            for (const json& j : *nodes) {
              if (!j.value("connected", false)) return false;
            }
            return true;
          },
          milliseconds(10000));
      if (!t->routers_reacked) return absl::DeadlineExceededError("no router re-acknowledged");
      if (!agents) return absl::DeadlineExceededError("an agent did not reconnect");
      // The next fault must meet a controller that fails over again.
      if (!c_.WaitGraceOver(milliseconds(20000))) {
        return absl::DeadlineExceededError("the restarted controller's grace did not end");
      }
      return absl::OkStatus();
    }
  }

  // A node fault's repair, then the wait for the node to rejoin as the spare.
  // Every node, one at a time, those out of service first: the ones the
  // breaker held then go out (make-before-break) as the others return.
  absl::Status RepairFleet(const FaultSpec& spec, FaultTimeline* t) {
    std::vector<LocalNode*> order;
    for (LocalNode& n : c_.nodes()) order.push_back(&n);
    std::map<std::string, bool> out;
    for (LocalNode* n : order) {
      auto j = c_.Api("GET", "/api/v1/nodes/" + n->name);
      out[n->name] = j.ok() && j->value("fenced", false);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](LocalNode* a, LocalNode* b) { return out[a->name] > out[b->name]; });
    for (LocalNode* n : order) {
      if (absl::Status s = Repair(spec, *n, t); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Repair(const FaultSpec& spec, LocalNode& n, FaultTimeline* t) {
    if (absl::Status s = spec.repair(faults_, n); !s.ok()) return s;
    bool back = c_.WaitFor(
        [&] {
          auto j = c_.Api("GET", "/api/v1/nodes/" + n.name);
          if (!j.ok()) return false;
          // Flapped past max_failures: it stays out, by design, once its
          // agent is back.
          t->held_out = j->value("state", "") == "held-out" && j->value("connected", false);
          // Back means in service with its server ready by its agent's
          // word: a worker that answers may still be the old one, about to
          // end on the SIGTERM its fence sent while it was stopped.
          return t->held_out || (j->value("state", "") == "alive" && !j->value("fenced", true) &&
                                 j->value("server_ready", false));
        },
        milliseconds(15000));
    if (!back) return absl::DeadlineExceededError(n.name + " did not rejoin within 15 s");
    if (t->held_out) return absl::OkStatus();  // no worker on a fenced node
    // Its agent starts the worker on rejoin: the spare is ready when it answers.
    if (!c_.WorkerReady(n, milliseconds(10000))) {
      return absl::DeadlineExceededError(n.name + "'s worker was not ready within 10 s");
    }
    return absl::OkStatus();
  }

  void Count(int64_t t0, int64_t t_end, const std::set<std::string>& hit, const std::string& node,
             FaultTimeline* t) {
    std::map<std::string, int64_t> last;  // stream -> last ok answer before now
    // "Served by the standby" counts only streams the failed node was really
    // serving when the fault hit (the router may already have moved some).
    std::map<std::string, std::string> served_at_t0;
    for (const AnswerLog::Rec& r : answers_.Snapshot()) {
      if (r.ns > t_end) break;
      bool in = r.ns >= t0;
      if (!in && r.ok) served_at_t0[r.stream] = r.node;
      if (in) {
        t->answered++;
        if (!r.ok) t->failed++;
        if (r.ok && hit.count(r.stream) && !node.empty() && served_at_t0[r.stream] == node &&
            !r.node.empty() && r.node != node && !t->first_standby_ms) {
          t->first_standby_ms = double(r.ns - t0) / 1e6;
        }
      }
      if (!r.ok || !hit.count(r.stream)) continue;
      auto it = last.find(r.stream);
      if (in && it != last.end()) {
        t->max_gap_ms = std::max(t->max_gap_ms, double(r.ns - it->second) / 1e6);
      }
      last[r.stream] = r.ns;
    }
  }

  void PrintTimeline(const FaultTimeline& t) {
    if (FindFault(t.fault)->target == Target::kEveryNode) {
      out_ << absl::StrFormat(
          "  every agent stopped (SIGTERM) and started in turn; %d node(s) taken "
          "out; routes %s\n",
          t.taken_out, t.routes_unchanged ? "unchanged" : "CHANGED");
    } else if (t.fault == "router-restart") {
      std::vector<std::string> each;
      for (double ms : t.router_taken_ms) each.push_back(absl::StrFormat("%.1f ms", ms));
      out_ << absl::StrFormat(
          "  each router restarted in turn through its handoff socket; listeners taken after "
          "%s; each old process drained and exited\n",
          each.empty() ? "-" : absl::StrJoin(each, ", "));
    } else if (t.fault == "router-kill") {
      out_ << absl::StrFormat(
          "  %s killed (kill -9); clients went on to the next router on their list; %s "
          "started again\n",
          t.node, t.node);
    } else if (t.fault == "controller-restart") {
      out_ << absl::StrFormat("  controller killed and restarted; routes %s\n",
                              t.routes_unchanged ? "unchanged" : "CHANGED");
    } else if (FindFault(t.fault)->target == Target::kController) {
      if (t.leader_stopped_ms) {
        out_ << absl::StrFormat(
            "  without quorum, the leading controller stopped acting after "
            "%.1f ms; routers served on their last routes\n",
            *t.leader_stopped_ms);
      }
      out_ << absl::StrFormat("  %s killed; %s; routes %s\n", t.node,
                              t.takeover_ms ? absl::StrFormat("a controller led and acted again "
                                                              "after %.1f ms (takeover_ms)",
                                                              *t.takeover_ms)
                                            : std::string("the leading controller kept its lease"),
                              t.routes_unchanged ? "unchanged" : "CHANGED");
    } else {
      out_ << absl::StrFormat("  %-34s %8s ms\n", "fault injected", "0.0")
           << absl::StrFormat("  %-34s %8s ms\n", "detected by the controller", Ms(t.detected_ms))
           << absl::StrFormat("  %-34s %8s ms\n", "fenced", Ms(t.fenced_ms))
           << absl::StrFormat("  %-34s %8s ms\n", "routes pushed", Ms(t.routes_pushed_ms))
           << absl::StrFormat("  %-34s %8s ms\n", "routers acknowledged", Ms(t.routers_acked_ms))
           << absl::StrFormat("  %-34s %8s ms\n", "first request served by the standby",
                              Ms(t.first_standby_ms));
      if (FindFault(t.fault)->target == Target::kFleet) {
        out_ << absl::StrFormat("  %-34s %8d taken out, %d held serving\n",
                                "quarantine breaker (nodes)", t.taken_out, t.quarantine_held);
      }
      if (t.node_streams_kept) {
        out_ << absl::StrFormat("  %-34s %8d of %d (%d node(s) taken out)\n",
                                "node's other GPUs kept their streams", *t.node_streams_kept,
                                t.node_streams.value_or(0), t.taken_out);
      }
      if (t.job_fenced_ms) {
        out_ << absl::StrFormat("  %-34s %8s ms\n", "training job: fence confirmed",
                                Ms(t.job_fenced_ms))
             << absl::StrFormat("  %-34s %8s ms after the fence\n",
                                "training job: started elsewhere", Ms(t.job_started_ms))
             << absl::StrFormat("  %-34s %8d (a checkpoint every %d)\n", "training job: steps lost",
                                t.steps_lost.value_or(-1), kJobEvery);
      }
    }
    out_ << absl::StrFormat("  answers %d, failed %d, longest gap on a hit stream %.1f ms\n",
                            t.answered, t.failed, t.max_gap_ms);
    if (o_.llm_streams > 0) {
      out_ << absl::StrFormat(
          "  LLM answers %d, failed %d; continued on the standby mid-answer %d\n", t.llm_answered,
          t.llm_failed, t.llm_continued);
    }
    if (o_.grpc_streams > 0) {
      out_ << absl::StrFormat(
          "  gRPC unary answers %d, failed %d; gRPC stream messages answered %d, failed %d\n",
          t.grpc_answered, t.grpc_failed, t.grpc_stream_answered, t.grpc_stream_failed);
    }
    if (t.unplaced_streams > 0) {
      out_ << absl::StrFormat("  over capacity: %d stream(s) unplaced, answered 503 no_capacity\n",
                              t.unplaced_streams);
    }
    if (t.moved_back > 0) {
      out_ << absl::StrFormat("  %d stream(s) moved back to the node after it rejoined\n",
                              t.moved_back);
    }
    if (!t.note.empty()) out_ << "  note: " << t.note << "\n";
    out_.flush();
  }

  void StatusLine() {
    bool tty = ::isatty(2) != 0;
    auto started = SteadyClock::now();
    while (!status_done_) {
      std::this_thread::sleep_for(milliseconds(250));
      if (!tty) continue;
      std::string nodes;
      if (auto j = c_.Api("GET", "/api/v1/nodes"); j.ok() && j->is_array()) {
        for (const json& n : *j) {
          absl::StrAppend(&nodes, " ", n.value("name", ""), ":", n.value("role", ""), "/",
                          n.value("state", ""));
        }
      } else {
        nodes = " controller unreachable";
      }
      std::fprintf(stderr, "\r\033[K[%5.1fs] ok %llu failed %llu |%s",
                   std::chrono::duration<double>(SteadyClock::now() - started).count(),
                   (unsigned long long)answers_.ok.load(),
                   (unsigned long long)answers_.failed.load(), nodes.c_str());
    }
    if (tty) std::fprintf(stderr, "\r\033[K");
  }

  const DemoOptions& o_;
  LocalCluster& c_;
  std::ostream& out_;
  FaultContext faults_;
  DemoReport report_;
  AnswerLog answers_;
  load::LoadOptions lo_;
  SideLoad llm_, grpc_, grpc_stream_;
  std::atomic<bool> stop_load_{false};
  std::atomic<bool> status_done_{false};
  std::thread load_thread_, status_thread_;
  LocalNode* second_ = nullptr;  // double-crash's second node
};

}  // namespace

absl::StatusOr<DemoReport> RunDemo(const DemoOptions& o, std::ostream& out) {
  for (const std::string& f : o.faults) {
    if (FindFault(f) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--faults: unknown fault '", f, "' (",
                                                     absl::StrJoin(FaultNames(), ", "), ")"));
    }
    if (FindFault(f)->target == Target::kJobNode && !o.train) {
      return absl::InvalidArgumentError(
          absl::StrCat("--faults: '", f, "' kills the training job's node; run it with --train"));
    }
    if (FindFault(f)->target == Target::kGpu && (o.gpus_per_node < 2 || o.mig_per_gpu > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--faults: '", f,
                       "' hits one GPU of a multi-GPU node; run it with --gpus-per-node 2+ "
                       "and no --mig-per-gpu"));
    }
    if (FindFault(f)->target == Target::kSlice && o.mig_per_gpu < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--faults: '", f, "' hits one MIG instance; run it with --mig-per-gpu 1+"));
    }
    if (f == "router-kill" && o.routers < 2) {
      return absl::InvalidArgumentError(
          "--faults: 'router-kill' kills a router; run it with --routers 2 or more");
    }
    if (FindFault(f)->ha && !o.ha) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--faults: '", f, "' is a fault of the etcd control plane; run it with --ha"));
    }
  }
  if (o.streams < 1 || o.streams > 30) {
    return absl::InvalidArgumentError("--streams: must be 1 to 30 (3 active nodes x 10)");
  }
  std::string dir = o.workdir;
  bool made_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/gpuha-demo-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    dir = tmpl;
    made_dir = true;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--workdir: ", dir, ": ", ec.message()));
  // Workers orphaned by a killed agent come to this process, to be reaped.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  bool partition = false;
  for (const std::string& f : o.faults) partition = partition || FindFault(f)->partition;
  if (o.routers < 1 || o.routers > 4)
    return absl::InvalidArgumentError("--routers: must be 1 to 4");
  if (o.gpus_per_node < 1 || o.gpus_per_node > 8) {
    return absl::InvalidArgumentError("--gpus-per-node: must be 1 to 8");
  }
  if (o.mig_per_gpu < 0 || o.mig_per_gpu > 7) {
    return absl::InvalidArgumentError("--mig-per-gpu: must be 0 (off) to 7");
  }
  if ((o.gpus_per_node > 1 || o.mig_per_gpu > 0) && o.watched_servers) {
    return absl::InvalidArgumentError(
        "--gpus-per-node, --mig-per-gpu: each GPU's (or instance's) worker runs under its "
        "agent; drop --watched-servers");
  }
  LocalCluster cluster({.exe = o.exe,
                        .gpus_per_node = o.gpus_per_node,
                        .mig_per_gpu = o.mig_per_gpu,
                        .worker_latency_ms = o.latency_ms,
                        .worker_args = {"--engine-metrics", o.engine_metrics},
                        .max_failures = o.max_failures,
                        .partition = partition,
                        .controllers = o.ha ? 3 : 1,
                        .watched_servers = o.watched_servers,
                        // A BMC power-off's stand-in: the demo's nodes die whole.
                        .fence_hook = o.train ? "true" : "",
                        .routers = o.routers,
                        .stop = o.stop},
                       dir);
  out << "gpuha demo: " << (o.ha ? "3 controllers on a 3-member etcd cluster" : "controller")
      << ", " << (o.routers > 1 ? absl::StrCat(o.routers, " routers") : "router")
      << " and 4 agents (3 active + 1 passive, " << o.gpus_per_node << " simulated L4 each"
      << (o.mig_per_gpu > 0
              ? absl::StrCat(" in ", o.mig_per_gpu, " MIG instances, a worker per instance")
          : o.gpus_per_node > 1 ? ", a worker per GPU"
                                : "")
      << ") with workers "
      << (o.watched_servers ? "beside them (watched)" : "under them (supervised)") << ", in " << dir
      << "\n";
  out.flush();
  absl::Status s = cluster.Start();
  Demo demo(o, cluster, out);
  if (s.ok()) s = demo.WaitReady();
  if (s.ok() && o.train) s = demo.StartJob();
  if (!s.ok()) {
    cluster.Stop();
    return s;
  }
  out << absl::StrFormat(
      "ready: %d streams admitted; load %.0f req/s through the router at "
      "127.0.0.1:%d (KServe v2, every answer checked)\n",
      o.streams, o.rate, cluster.router_port());
  out.flush();
  demo.StartLoad();
  cluster.Sleep(milliseconds(1000));
  for (const std::string& f : o.faults) {
    if (cluster.Stopping()) break;
    demo.report().faults.push_back(demo.Run(f));
  }
  cluster.Sleep(milliseconds(500));
  // (--keep leaves the job running, for the dashboard and `ctl jobs`.)
  if (o.train && !o.keep && !cluster.Stopping()) demo.StopJob();
  demo.StopLoad();
  DemoReport report = demo.report();
  out << "\n" << report.Text();
  out.flush();
  if (o.keep && !cluster.Stopping()) {
    out << absl::StrFormat(
        "\nThe cluster keeps running (--keep); Ctrl-C stops it.\n"
        "  router:      http://127.0.0.1:%d/streams/cam-0/v2/models/cv/infer "
        "(X-Api-Key: %s)\n"
        "  operator API: http://127.0.0.1:%d/api/v1/nodes  (streams, events, failovers, "
        "capacity)\n"
        "  metrics:     http://127.0.0.1:%d/metrics (router), http://127.0.0.1:%d/metrics "
        "(controller)\n"
        "  dashboard:   http://127.0.0.1:%d/\n"
        "  logs and configs: %s\n",
        cluster.router_port(), cluster.options().api_key, cluster.api_port(),
        cluster.router_admin_port(), cluster.api_port(), cluster.api_port(), dir);
    out.flush();
    cluster.WaitFor([] { return false; }, std::chrono::hours(24 * 365));
  }
  cluster.Stop();
  if (made_dir && !o.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return report;
}

}  // namespace gpuha::demo
