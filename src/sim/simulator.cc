#include "sim/simulator.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <queue>
#include <thread>

#include "absl/strings/str_cat.h"
#include "placement/placement.h"

namespace gpuha::sim {
namespace {

using placement::FailoverPlan;
using placement::NodeSpec;
using placement::Placement;
using placement::Role;

// SplitMix64: a small, well-mixed generator whose state is one word, so each
// GPU, node and rack carries its own stream cheaply.
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a: a class's stream is keyed by its name, so adding a class to an
// input does not change the failures the others draw.
uint64_t NameKey(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

uint64_t Seed(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xd1b54a32d192ed03ULL);
  return Next(s);
}

// Uniform in (0, 1): never 0, so log() is finite.
double Uniform(uint64_t& state) {
  return (static_cast<double>(Next(state) >> 11) + 0.5) * 0x1.0p-53;
}

double Draw(double mean, Distribution d, double shape, uint64_t& rng) {
  double u = Uniform(rng);
  if (d == Distribution::kWeibull) {
    double scale = mean / std::tgamma(1 + 1 / shape);
    return scale * std::pow(-std::log(u), 1 / shape);
  }
  return -mean * std::log(u);
}

double TimeToFailure(const FailureClass& c, uint64_t& rng) {
  return Draw(c.mtbf_hours, c.distribution, c.shape, rng);
}

double RepairTime(const FailureClass& c, uint64_t& rng) {
  if (c.fixed_repair) return c.repair_hours;
  return Draw(c.repair_hours, Distribution::kExponential, 1, rng);
}

// The daily curve integrated: stream-hours per admitted stream over [a, b].
class LoadCurve {
 public:
  LoadCurve(const std::array<double, 24>& daily, double horizon) : daily_(daily), end_(horizon) {
    for (int h = 0; h < 24; ++h) prefix_[h + 1] = prefix_[h] + daily_[h];
  }
  double Integral(double a, double b) const {
    a = std::clamp(a, 0.0, end_);
    b = std::clamp(b, 0.0, end_);
    return b > a ? Cumulative(b) - Cumulative(a) : 0;
  }

 private:
  double Cumulative(double t) const {
    double days = std::floor(t / 24);
    double r = t - days * 24;
    int h = std::min(23, static_cast<int>(r));
    return days * prefix_[24] + prefix_[h] + (r - h) * daily_[h];
  }
  std::array<double, 24> daily_;
  std::array<double, 25> prefix_{};
  double end_;
};

struct Event {
  double t;
  uint32_t cls;
  uint32_t entity;
  bool repair;
};
struct Later {
  bool operator()(const Event& a, const Event& b) const {
    if (a.t != b.t) return a.t > b.t;
    if (a.cls != b.cls) return a.cls > b.cls;
    if (a.entity != b.entity) return a.entity > b.entity;
    return a.repair > b.repair;
  }
};

// A maintenance window that finds no room asks again an hour later.
constexpr double kMaintenanceRetryHours = 1;

class Run {
 public:
  Run(const SimInput& in, const Strategy& s, int64_t run)
      : in_(in),
        s_(s),
        f_(in.fleet),
        horizon_(in.horizon_hours()),
        load_(in.daily_load, horizon_),
        per_node_(s.unit == Unit::kGpu ? f_.gpus_per_node : 1),
        unit_capacity_(s.unit == Unit::kGpu ? f_.streams_per_gpu
                                            : f_.streams_per_gpu * f_.gpus_per_node),
        // N+k counts whole nodes: a node's GPU units are one host.
        placement_(!s.reserve ? 0 : f_.redundancy) {
    int64_t units = f_.nodes * per_node_;
    node_down_.assign(f_.nodes, 0);
    node_bad_gpus_.assign(f_.nodes, 0);
    gpu_down_.assign(f_.nodes * f_.gpus_per_node, 0);
    maintenance_waiting_.assign(f_.nodes, false);
    unit_ids_.reserve(units);
    for (int64_t n = 0; n < f_.nodes; ++n) {
      bool spare = n >= f_.nodes - f_.passive_nodes;
      Role role = Role::kActive;
      if (spare && s.reserve && s.spares == Spares::kPassive) role = Role::kPassive;
      if (spare && s.reserve && s.spares == Spares::kBuffer) role = Role::kBuffer;
      for (int64_t j = 0; j < per_node_; ++j) {
        unit_ids_.push_back(absl::StrCat("u", unit_ids_.size()));
        // A node's GPUs share its host: a stream's standby is on another node.
        (void)placement_.AddNode(
            {unit_ids_.back(), role, unit_capacity_, false, absl::StrCat("h", n)});
      }
    }
    // Admit one GPU's streams at a time until N+k (or the fleet) is full.
    for (int64_t b = 0;; ++b) {
      if (!placement_.Admit({absl::StrCat("b", b), "sim", f_.streams_per_gpu}).ok()) break;
      ++bundles_;
    }
    down_until_.assign(bundles_, 0);
    waiting_since_.assign(bundles_, -1);

    // One random stream per (class, entity), the same for every strategy.
    uint64_t run_seed = Seed(in.seed, static_cast<uint64_t>(run));
    std::vector<Event> initial;
    rng_.resize(in.failures.size());
    for (uint32_t c = 0; c < in.failures.size(); ++c) {
      const FailureClass& fc = in.failures[c];
      int64_t entities = EntitiesOf(fc.scope);
      rng_[c].resize(entities);
      uint64_t class_seed = Seed(run_seed, NameKey(fc.name));
      for (int64_t e = 0; e < entities; ++e) {
        rng_[c][e] = Seed(class_seed, static_cast<uint64_t>(e));
        double t = TimeToFailure(fc, rng_[c][e]);
        if (t < horizon_) initial.push_back({t, c, static_cast<uint32_t>(e), false});
      }
    }
    events_ = std::priority_queue<Event, std::vector<Event>, Later>(Later(), std::move(initial));
  }

  RunFigures Go() {
    while (!events_.empty() && events_.top().t < horizon_) {
      Event e = events_.top();
      events_.pop();
      Handle(e);
    }
    Advance(horizon_);
    for (int64_t b : waiting_) {
      figures_.stream_hours_lost +=
          f_.streams_per_gpu * load_.Integral(waiting_since_[b], horizon_);
    }
    figures_.admitted_streams = bundles_ * f_.streams_per_gpu;
    figures_.gpus = f_.nodes * f_.gpus_per_node;
    figures_.idle_gpus = figures_.gpus - bundles_;
    figures_.demand_stream_hours =
        static_cast<double>(figures_.admitted_streams) * load_.Integral(0, horizon_);
    return figures_;
  }

 private:
  int64_t EntitiesOf(Scope scope) const {
    switch (scope) {
      case Scope::kGpu:
        return f_.nodes * f_.gpus_per_node;
      case Scope::kRack:
        return (f_.nodes + f_.nodes_per_rack - 1) / f_.nodes_per_rack;
      case Scope::kNode:
      case Scope::kPlanned:
        return f_.nodes;
    }
    return 0;
  }

  void Schedule(double t, uint32_t cls, uint32_t entity, bool repair) {
    if (t < horizon_) events_.push({t, cls, entity, repair});
  }

  void Handle(const Event& e) {
    const FailureClass& fc = in_.failures[e.cls];
    uint64_t& rng = rng_[e.cls][e.entity];
    if (fc.scope == Scope::kPlanned && !e.repair && !StartMaintenance(e)) return;
    int delta = e.repair ? -1 : 1;
    double gap = fc.scope == Scope::kGpu       ? s_.gpu.hours()
                 : fc.scope == Scope::kPlanned ? s_.planned_outage_s / 3600
                                               : s_.node.hours();
    switch (fc.scope) {
      case Scope::kGpu:
        ChangeGpu(e.t, e.entity, delta, gap);
        break;
      case Scope::kNode:
      case Scope::kPlanned:
        ChangeNode(e.t, e.entity, delta, gap);
        break;
      case Scope::kRack: {
        int64_t first = static_cast<int64_t>(e.entity) * f_.nodes_per_rack;
        int64_t last = std::min(f_.nodes, first + f_.nodes_per_rack);
        for (int64_t n = first; n < last; ++n) ChangeNode(e.t, n, delta, gap);
        break;
      }
    }
    if (e.repair) {
      Schedule(e.t + TimeToFailure(fc, rng), e.cls, e.entity, false);
    } else {
      Schedule(e.t + RepairTime(fc, rng), e.cls, e.entity, true);
    }
  }

  // A maintenance window starts when the rest of the fleet has room for the
  // node's streams, as an operator drains: N+k may dip for the window, but
  // no stream is left without a place. False: postponed an hour.
  bool StartMaintenance(const Event& e) {
    if (!s_.reserve) return true;  // nothing to keep: the window just happens
    int64_t n = e.entity;
    int64_t up = 0;  // the node's capacity still in service
    for (int64_t j = 0; j < per_node_; ++j) {
      if (!UnitDown(n * per_node_ + j)) up += unit_capacity_;
    }
    if (placement_.FreeUnits() >= up) {
      if (maintenance_waiting_[n]) maintenance_waiting_[n] = false;
      return true;
    }
    if (!maintenance_waiting_[n]) {
      maintenance_waiting_[n] = true;
      ++figures_.maintenance_deferred;
    }
    Schedule(e.t + kMaintenanceRetryHours, e.cls, e.entity, false);
    return false;
  }

  bool UnitDown(int64_t u) const {
    if (s_.unit == Unit::kGpu) {
      int64_t n = u / f_.gpus_per_node;
      return node_down_[n] > 0 || gpu_down_[u] > 0;
    }
    return node_down_[u] > 0 || node_bad_gpus_[u] > 0;
  }

  void ChangeGpu(double t, int64_t gpu, int delta, double gap) {
    int64_t n = gpu / f_.gpus_per_node;
    int64_t u = s_.unit == Unit::kGpu ? gpu : n;
    bool was = UnitDown(u);
    int before = gpu_down_[gpu];
    gpu_down_[gpu] += delta;
    if (before == 0 && gpu_down_[gpu] > 0) ++node_bad_gpus_[n];
    if (before > 0 && gpu_down_[gpu] == 0) --node_bad_gpus_[n];
    Transition(t, u, was, gap);
  }

  void ChangeNode(double t, int64_t n, int delta, double gap) {
    std::vector<bool> was(per_node_);
    for (int64_t j = 0; j < per_node_; ++j) was[j] = UnitDown(n * per_node_ + j);
    node_down_[n] += delta;
    for (int64_t j = 0; j < per_node_; ++j) Transition(t, n * per_node_ + j, was[j], gap);
  }

  void Transition(double t, int64_t u, bool was, double gap) {
    bool now = UnitDown(u);
    if (!was && now) Fail(t, u, gap);
    if (was && !now) Restore(t, u);
  }

  // Integrates the capacity that is down and the time all streams had room.
  void Advance(double t) {
    figures_.failed_capacity_stream_hours +=
        static_cast<double>(down_capacity_) * load_.Integral(last_t_, t);
    if (waiting_.empty()) figures_.full_capacity_hours += t - last_t_;
    last_t_ = t;
  }

  void Fail(double t, int64_t u, double gap) {
    Advance(t);
    ++figures_.failures;
    down_capacity_ += unit_capacity_;
    FailoverPlan plan = placement_.FailNode(unit_ids_[u]);
    for (const placement::Assignment& a : plan.moved) Hit(Bundle(a.stream), t, gap);
    for (const std::string& id : plan.unplaced) Wait(Bundle(id), t);
    figures_.streams_moved += static_cast<int64_t>(plan.moved.size()) * f_.streams_per_gpu;
    if (!plan.unplaced.empty()) ++figures_.overflow_events;
  }

  void Restore(double t, int64_t u) {
    Advance(t);
    down_capacity_ -= unit_capacity_;
    // gpuha's controller brings a repaired node back as a standby; the other
    // strategies' schedulers have no such role and use it at once.
    (void)placement_.RestoreNode(unit_ids_[u], s_.reserve && s_.spares == Spares::kPassive);
    if (waiting_.empty()) return;
    std::vector<int64_t> still;
    for (int64_t b : waiting_) {
      std::optional<placement::Assignment> a = placement_.Find(absl::StrCat("b", b));
      if (a && !a->primary.empty()) {
        Placed(b, t);
      } else {
        still.push_back(b);
      }
    }
    waiting_.swap(still);
  }

  static int64_t Bundle(const std::string& id) {
    int64_t b = 0;
    std::from_chars(id.data() + 1, id.data() + id.size(), b);
    return b;
  }

  // A stream moved elsewhere: down for the strategy's gap (once, if a second
  // fault hits it while it is still coming up).
  void Hit(int64_t b, double t, double gap) {
    double start = std::max(t, down_until_[b]);
    double end = t + gap;
    if (end > start) {
      figures_.stream_hours_lost += f_.streams_per_gpu * load_.Integral(start, end);
    }
    down_until_[b] = std::max(down_until_[b], end);
  }

  // A stream with nowhere to go: down until capacity returns.
  void Wait(int64_t b, double t) {
    waiting_since_[b] = std::max(t, down_until_[b]);
    waiting_.push_back(b);
  }

  void Placed(int64_t b, double t) {
    double end = std::max(waiting_since_[b], t + s_.node.restart_s / 3600);
    figures_.stream_hours_lost += f_.streams_per_gpu * load_.Integral(waiting_since_[b], end);
    down_until_[b] = end;
    waiting_since_[b] = -1;
  }

  const SimInput& in_;
  const Strategy& s_;
  const Fleet& f_;
  const double horizon_;
  const LoadCurve load_;
  const int64_t per_node_;       // placement units per node
  const int64_t unit_capacity_;  // streams per unit
  Placement placement_;
  std::vector<std::string> unit_ids_;
  int64_t bundles_ = 0;
  std::vector<int> node_down_;             // node-wide causes in force
  std::vector<int> node_bad_gpus_;         // GPUs of the node with a fault
  std::vector<int> gpu_down_;              // GPU causes in force
  std::vector<bool> maintenance_waiting_;  // a window postponed, counted once
  std::vector<double> down_until_;         // per bundle: serving again at
  std::vector<double> waiting_since_;      // per bundle: unplaced since, or -1
  std::vector<int64_t> waiting_;           // unplaced bundles
  int64_t down_capacity_ = 0;              // streams of capacity down now
  double last_t_ = 0;
  std::vector<std::vector<uint64_t>> rng_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  RunFigures figures_;
};

// Student's t, two-sided 95%, for 1..30 degrees of freedom.
constexpr double kT975[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                            2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                            2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};

}  // namespace

Figure Summarize(const std::vector<double>& samples) {
  Figure f;
  if (samples.empty()) return f;
  double n = static_cast<double>(samples.size());
  for (double v : samples) f.mean += v / n;
  f.lo = f.hi = f.mean;
  if (samples.size() < 2) return f;
  double var = 0;
  for (double v : samples) var += (v - f.mean) * (v - f.mean) / (n - 1);
  size_t df = samples.size() - 1;
  double t = df <= 30 ? kT975[df - 1] : 1.96 + 2.5 / static_cast<double>(df);
  double half = t * std::sqrt(var / n);
  f.lo = f.mean - half;
  f.hi = f.mean + half;
  return f;
}

RunFigures SimulateRun(const SimInput& in, const Strategy& strategy, int64_t run) {
  return Run(in, strategy, run).Go();
}

SimResult Simulate(const SimInput& in, const SimOptions& options) {
  auto start = std::chrono::steady_clock::now();
  const int64_t runs = in.runs;
  const int64_t total = static_cast<int64_t>(in.strategies.size()) * runs;
  std::vector<RunFigures> figures(total);
  std::atomic<int64_t> next{0}, done{0};
  auto work = [&] {
    for (int64_t j = next++; j < total; j = next++) {
      figures[j] = SimulateRun(in, in.strategies[j / runs], j % runs);
      int64_t d = ++done;
      if (options.progress) options.progress(d, total);
    }
  };
  int threads =
      static_cast<int>(std::clamp<int64_t>(options.threads, 1, std::max<int64_t>(1, total)));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();

  SimResult result;
  result.input = in;
  for (size_t s = 0; s < in.strategies.size(); ++s) {
    StrategyResult r;
    r.strategy = in.strategies[s];
    auto collect = [&](auto get) {
      std::vector<double> v;
      for (int64_t k = 0; k < runs; ++k) v.push_back(get(figures[s * runs + k]));
      return Summarize(v);
    };
    r.availability = collect([](const RunFigures& f) {
      return f.demand_stream_hours > 0 ? 1 - f.stream_hours_lost / f.demand_stream_hours : 1.0;
    });
    r.stream_hours_lost = collect([](const RunFigures& f) { return f.stream_hours_lost; });
    r.stream_hours_lost_per_year =
        collect([&](const RunFigures& f) { return f.stream_hours_lost / in.horizon_years; });
    r.demand_stream_hours = collect([](const RunFigures& f) { return f.demand_stream_hours; });
    r.capacity_availability =
        collect([&](const RunFigures& f) { return f.full_capacity_hours / in.horizon_hours(); });
    r.overflow_events = collect([](const RunFigures& f) { return double(f.overflow_events); });
    r.failures = collect([](const RunFigures& f) { return double(f.failures); });
    r.streams_moved = collect([](const RunFigures& f) { return double(f.streams_moved); });
    r.maintenance_deferred =
        collect([](const RunFigures& f) { return double(f.maintenance_deferred); });
    const RunFigures& first = figures[s * runs];
    r.admitted_streams = first.admitted_streams;
    r.idle_gpus = first.idle_gpus;
    r.gpus = first.gpus;
    result.strategies.push_back(std::move(r));
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace gpuha::sim
