#include "agent/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <utility>

#include "agent/engine_watch.h"
#include "common/http_server.h"
#include "common/log.h"

namespace gpuha::agent {

namespace {

// How long the calling thread has waited, runnable, for a CPU since it
// began (the scheduler's run_delay in /proc/thread-self/schedstat), or
// nullopt where the kernel keeps no such count.
std::optional<std::chrono::nanoseconds> ThreadRunDelay() {
  std::ifstream f("/proc/thread-self/schedstat");
  uint64_t ran = 0, waited = 0;
  if (!(f >> ran >> waited)) return std::nullopt;
  return std::chrono::nanoseconds(waited);
}

// Runs `exchange` (HTTP done on this thread) and says whether this thread
// meanwhile waited for a CPU for half of `timeout` or more: a failure then
// is the host's, not the server's (see ServerProbe).
template <class F>
bool StarvedDuring(common::Duration timeout, F&& exchange) {
  const auto before = ThreadRunDelay();
  exchange();
  const auto after = ThreadRunDelay();
  return before && after && (*after - *before) * 2 >= timeout;
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions options, ProcessRunner* runner, common::Clock* clock,
                       std::function<ProbeReading()> probe)
    : options_(std::move(options)),
      runner_(runner),
      clock_(clock),
      probe_(std::move(probe)),
      backoff_(options_.backoff) {
  state_.supervised = !options_.command.empty();
  state_.watched =
      !state_.supervised && (!options_.ready_url.empty() || !options_.metrics_url.empty());
  next_start_ = clock_->Now();
}

Supervisor::~Supervisor() { Shutdown(); }

void Supervisor::StopLocked(common::TimePoint now) {
  if (!state_.running) return;
  if (auto exit = runner_->Poll(state_.pid)) {
    state_.running = false;
    state_.last_exit = *exit;
    term_sent_.reset();
    spdlog::info("supervisor: server pid {} stopped ({})", state_.pid, *exit);
    return;
  }
  if (!term_sent_) {
    runner_->Signal(state_.pid, SIGTERM);
    term_sent_ = now;
  } else if (now - *term_sent_ >= options_.stop_grace) {
    runner_->Signal(state_.pid, SIGKILL);
  }
}

void Supervisor::Tick(std::optional<common::TimePoint> round) {
  std::lock_guard<std::mutex> lock(mu_);
  common::TimePoint now = clock_->Now();
  const common::TimePoint probe_at = round.value_or(now);
  if (state_.watched) {
    if (probe_at >= next_probe_) {
      if (ProbeReading r = probe_()) probe_ok_ = ProbeOkLocked(*r);
      next_probe_ = now + options_.probe_interval;
    }
    state_.running = probe_ok_;  // as far as the agent can tell
    state_.ready = probe_ok_ && !state_.fenced;
    return;
  }
  if (!state_.supervised) return;
  // A stop once begun runs to its end, even if the fence is lifted
  // meanwhile: the SIGTERM cannot be taken back. A server stopped (SIGSTOP)
  // when it was fenced gets that SIGTERM when it runs again; taking it for
  // ready then would let the node rejoin as the spare with a server about to
  // exit (found by the chaos test: server-hang, then another fault within a
  // second, met a spare whose server was restarting).
  if (shutdown_ || (state_.fenced && options_.fence_mode == FenceMode::kStop) || term_sent_) {
    StopLocked(now);
    state_.ready = false;
    if (state_.running || shutdown_ || state_.fenced) return;
    // The old server is gone and the fence lifted: start afresh below.
  }
  if (state_.running) {
    if (auto exit = runner_->Poll(state_.pid)) {
      state_.running = false;
      state_.ready = false;
      probe_ok_ = false;
      state_.last_exit = *exit;
      ++state_.restarts;
      backoff_.MaybeReset(started_at_, now);
      common::Duration wait = backoff_.Next();
      next_start_ = now + wait;
      spdlog::warn("supervisor: server pid {} ended ({}); restart {} in {} ms", state_.pid, *exit,
                   state_.restarts, common::ToMillis(wait));
    }
  }
  if (!state_.running && now >= next_start_) {
    absl::StatusOr<pid_t> pid = runner_->Spawn(options_.command);
    if (pid.ok()) {
      state_.running = true;
      state_.pid = *pid;
      started_at_ = now;
      next_probe_ = now;
      spdlog::info("supervisor: started server pid {}", *pid);
    } else {
      state_.last_exit = std::string(pid.status().message());
      common::Duration wait = backoff_.Next();
      next_start_ = now + wait;
      spdlog::error("supervisor: {}; retry in {} ms", pid.status().message(),
                    common::ToMillis(wait));
    }
  }
  if (state_.running && probe_at >= next_probe_) {
    const ProbeReading r =
        options_.ready_url.empty() && options_.metrics_url.empty() ? ProbeReading(true) : probe_();
    if (r) probe_ok_ = ProbeOkLocked(*r);
    next_probe_ = now + options_.probe_interval;
  }
  state_.ready = state_.running && probe_ok_ && !state_.fenced;
}

bool Supervisor::ProbeOkLocked(bool ok) {
  constexpr int kNotReadyReadings = 2;
  if (ok || !probe_ok_) {
    probe_failures_ = 0;
    return ok;
  }
  if (++probe_failures_ < kNotReadyReadings) return true;
  probe_failures_ = 0;
  return false;
}

bool Supervisor::ProbeDue() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (clock_->Now() < next_probe_) return false;
  if (state_.watched) return true;
  return state_.supervised && state_.running && !shutdown_ && !term_sent_ &&
         !(state_.fenced && options_.fence_mode == FenceMode::kStop);
}

void Supervisor::Fence() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_.fenced) spdlog::warn("supervisor: fenced, server out of service");
  state_.fenced = true;
  state_.ready = false;
}

bool Supervisor::Restart(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_.supervised || !state_.running || term_sent_ || shutdown_) return false;
  spdlog::warn("supervisor: restarting server pid {}: {}", state_.pid, why);
  runner_->Signal(state_.pid, SIGTERM);
  term_sent_ = clock_->Now();
  state_.ready = false;
  probe_ok_ = false;  // the new server is probed before it counts as ready
  ++state_.restarts;
  return true;
}

void Supervisor::Unfence() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.fenced) spdlog::info("supervisor: unfenced");
  state_.fenced = false;
  backoff_.Reset();
  next_start_ = clock_->Now();
}

void Supervisor::Shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_ = true;
  if (!state_.running) return;
  runner_->Signal(state_.pid, SIGTERM);
  pid_t pid = state_.pid;
  lock.unlock();
  // Give the server its grace period, then make sure it is gone.
  for (int i = 0; i < 50; ++i) {
    if (runner_->Poll(pid)) {
      std::lock_guard<std::mutex> relock(mu_);
      state_.running = false;
      return;
    }
    struct timespec ts = {0, 20'000'000};
    nanosleep(&ts, nullptr);
  }
  runner_->Signal(pid, SIGKILL);
  for (int i = 0; i < 50 && !runner_->Poll(pid); ++i) {
    struct timespec ts = {0, 10'000'000};
    nanosleep(&ts, nullptr);
  }
  std::lock_guard<std::mutex> relock(mu_);
  state_.running = false;
}

ServerState Supervisor::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

size_t ReadyBatch::Add(const common::HttpUrl& url) {
  clients_.push_back(std::make_unique<common::HttpClient>(url.host, url.port, loop_));
  targets_.push_back(url.target);
  answers_.emplace_back();
  return clients_.size() - 1;
}

void ReadyBatch::Fetch(const std::vector<size_t>& slots, common::Duration timeout) {
  std::fill(answers_.begin(), answers_.end(), std::nullopt);
  if (slots.empty()) return;
  std::vector<common::HttpClient::Get> calls;
  for (size_t s : slots) calls.push_back({clients_[s].get(), targets_[s]});
  const bool starved = StarvedDuring(timeout, [&] {
    common::HttpClient::GetAll(calls,
                               std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  });
  for (size_t i = 0; i < slots.size(); ++i) {
    const bool ready = calls[i].result.ok() && calls[i].result->status == 200;
    answers_[slots[i]] = ready || !starved ? ProbeReading(ready) : std::nullopt;
  }
}

ProbeReading ReadyBatch::Take(size_t slot, common::Duration timeout) {
  if (std::optional<ProbeReading> got = std::exchange(answers_[slot], std::nullopt)) return *got;
  absl::StatusOr<common::HttpResult> r = absl::UnknownError("not asked");
  const bool starved = StarvedDuring(timeout, [&] {
    r = clients_[slot]->Call("GET", targets_[slot], "",
                             std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  });
  const bool ready = r.ok() && r->status == 200;
  return ready || !starved ? ProbeReading(ready) : std::nullopt;
}

std::function<ProbeReading()> ServerProbe(const SupervisorOptions& o, const std::string& node,
                                          common::Clock* clock, ReadyBatch* batch,
                                          std::optional<size_t>* slot) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(o.probe_timeout);
  std::optional<common::HttpUrl> ready, metrics;
  if (!o.ready_url.empty())
    ready = *common::ParseHttpUrl(o.ready_url);  // validated with the config
  if (!o.metrics_url.empty()) metrics = *common::ParseHttpUrl(o.metrics_url);
  struct Watch {
    EngineWatch engine;
    FailureWatch failures;
    common::Duration stall_after;
    common::TimePoint next_scrape{};
    bool stalled = false;
    bool failing = false;
  };
  // Only errors for a second (five at least) is a failed server: a broken
  // CUDA context answers each inference at once, so a second holds many.
  auto w = std::make_shared<Watch>(
      Watch{EngineWatch(o.stall_after),
            FailureWatch(std::min<common::Duration>(std::chrono::seconds(1), o.stall_after)),
            o.stall_after});
  // Kept-alive connections: a node of 8 GPUs in 7 MIG instances probes 56
  // servers, and a connection (and event loop) per probe cost more CPU
  // than the rest of the agent.
  std::shared_ptr<common::HttpClient> ready_client, metrics_client;
  std::optional<size_t> ready_slot;
  if (ready && batch != nullptr) {
    ready_slot = batch->Add(*ready);
  } else if (ready) {
    ready_client = std::make_shared<common::HttpClient>(ready->host, ready->port);
  }
  if (slot != nullptr) *slot = ready_slot;
  if (metrics) metrics_client = std::make_shared<common::HttpClient>(metrics->host, metrics->port);
  return [ready, metrics, ms, node, clock, w, batch, ready_slot, ready_client,
          metrics_client]() -> ProbeReading {
    if (ready_slot) {
      ProbeReading got = batch->Take(*ready_slot, ms);
      if (!got || !*got) return got;
    }
    if (ready_client) {
      absl::StatusOr<common::HttpResult> r = absl::UnknownError("not asked");
      const bool starved =
          StarvedDuring(ms, [&] { r = ready_client->Call("GET", ready->target, "", ms); });
      if (!r.ok() || r->status != 200) return starved ? std::nullopt : ProbeReading(false);
    }
    if (!metrics) return true;
    const common::TimePoint now = clock->Now();
    if (now >= w->next_scrape) {
      // Once a second, or four times per stall_after when that is shorter.
      w->next_scrape =
          now + std::min<common::Duration>(std::chrono::seconds(1), w->stall_after / 4);
      auto r = metrics_client->Call("GET", metrics->target, "", ms);
      std::optional<EngineSample> s =
          r.ok() && r->status == 200 ? ParseEngineMetrics(r->body) : std::nullopt;
      // A scrape that failed keeps the last verdict: a hung engine whose
      // metrics time out too is not thereby ready.
      bool stalled = s && s->has_progress ? w->engine.Observe(now, *s) : w->stalled;
      if (stalled && !w->stalled) {
        spdlog::error(
            "agent {}: inference server stalled: {} request(s) pending and no progress for {} ms "
            "(its readiness still answers); reporting it not ready",
            node, s->pending, common::ToMillis(now - w->engine.moved_at()));
      } else if (!stalled && w->stalled) {
        spdlog::info("agent {}: inference server progressing again", node);
      }
      w->stalled = stalled;
      bool failing = s ? w->failures.Observe(now, *s) : w->failing;
      if (failing && !w->failing) {
        spdlog::error(
            "agent {}: inference server answers only errors: {} failed request(s) and no success "
            "for {} ms (its readiness still answers); reporting it not ready",
            node, w->failures.failures(), common::ToMillis(now - w->failures.success_at()));
      } else if (!failing && w->failing) {
        spdlog::info("agent {}: inference server succeeding again", node);
      }
      w->failing = failing;
    }
    return !w->stalled && !w->failing;
  };
}

}  // namespace gpuha::agent
