// Supervisor: keeps the node's inference server running, probes its
// readiness, and stops serving on a fence (keepalived's child supervision).
// A server the agent does not start is only probed (watched).
//
//   Supervisor s(options, &runner, clock, probe);
//   while (running) { s.Tick(); sleep(100ms); }   // on the supervisor thread
//   s.Fence();    // from the connection thread, on a controller command
//
// Restarts follow 1, 2, 4 ... 60 s, reset after a stable minute. Thread-safety:
// all methods lock; Tick() is meant for one thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/process.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "common/http_server.h"

namespace gpuha::agent {

enum class FenceMode { kStop, kUnready };

struct SupervisorOptions {
  // Empty: no server to start. With ready_url or metrics_url, the server
  // is still watched (one the agent does not own: a Triton pod beside a
  // DaemonSet agent); a fence then marks it unready but cannot stop it.
  std::vector<std::string> command;
  std::string ready_url;  // empty: a running server counts as ready
  // The engine's metrics (Triton or vLLM), scraped once a second (or every
  // stall_after / 4 when shorter): requests
  // pending with no progress for stall_after counts as not ready, whatever
  // ready_url says (EngineWatch). Empty: not watched.
  std::string metrics_url;
  common::Duration stall_after = std::chrono::seconds(5);
  FenceMode fence_mode = FenceMode::kStop;
  common::Duration probe_interval = std::chrono::milliseconds(500);
  common::Duration probe_timeout = std::chrono::milliseconds(300);  // no answer: not ready
  common::Duration stop_grace = std::chrono::seconds(2);
  common::Backoff::Options backoff;
};

struct ServerState {
  bool supervised = false;  // the agent starts and stops the server
  bool watched = false;     // not started here, but probed
  bool running = false;
  bool ready = false;  // probe passed and not fenced
  bool fenced = false;
  pid_t pid = 0;
  uint32_t restarts = 0;
  std::string last_exit;
};

// The probe `gpuha agent` gives its supervisor: the server is ready when
// `ready_url` answers 200 and, with `metrics_url`, its engine is not stalled
// (EngineWatch over a scrape once a second, or every stall_after / 4 when
// shorter; a failed scrape keeps the last verdict). A server that answers
// its health check while its inference no longer moves is not ready.
//
// With `batch`, the readiness URL is asked through it (its slot in *slot):
// answers fetched for a round of servers at once are taken from there.
//
// A readiness GET that fails while the probing thread itself waited,
// runnable, for a CPU for half its timeout or more (the kernel's run_delay)
// is no reading: the host kept the probe from running, which says nothing
// of the server (found beside a busy loop: two such timeouts in a row
// failed a healthy node over).
using ProbeReading = std::optional<bool>;  // nullopt: no reading
class ReadyBatch;
std::function<ProbeReading()> ServerProbe(const SupervisorOptions& o, const std::string& node,
                                          common::Clock* clock, ReadyBatch* batch = nullptr,
                                          std::optional<size_t>* slot = nullptr);

// Readiness probes of many servers as one round (a node with a server per
// GPU or MIG instance): the supervisor thread fetches the answers of the
// servers whose probe is due at once, and each server's probe then takes
// its own answer instead of asking alone. An answer lives until the next
// Fetch, so a probe never reads one from an earlier round.
//
// Thread-safety: none; the supervisor thread only.
class ReadyBatch {
 public:
  // A server's readiness URL; returns its slot.
  size_t Add(const common::HttpUrl& url);
  // Forgets the last round's answers, then GETs the URLs of `slots` at once.
  void Fetch(const std::vector<size_t>& slots, common::Duration timeout);
  // Whether `slot` answered 200 in this round (nullopt: no reading, see
  // ServerProbe); without an answer, asks now, alone.
  ProbeReading Take(size_t slot, common::Duration timeout);

 private:
  common::HttpClient::Loop loop_;
  std::vector<std::unique_ptr<common::HttpClient>> clients_;
  std::vector<std::string> targets_;
  std::vector<std::optional<ProbeReading>> answers_;  // outer nullopt: not fetched
};

class Supervisor {
 public:
  // `probe` answers whether the server is ready now (nullopt: no reading,
  // the verdict stands); it may block briefly.
  Supervisor(SupervisorOptions options, ProcessRunner* runner, common::Clock* clock,
             std::function<ProbeReading()> probe);
  ~Supervisor();
  // With `round`: the probe is due as of that time (when a ReadyBatch
  // round began), so a server that fell due while the round ran is not
  // then asked alone.
  void Tick(std::optional<common::TimePoint> round = std::nullopt);
  // Whether Tick() would probe the server now (a ReadyBatch round).
  bool ProbeDue() const;
  void Fence();
  void Unfence();
  // Stops the running server (SIGTERM, then SIGKILL after stop_grace) and
  // starts it again at once: NVIDIA's RESTART_APP, for an XID its work
  // caused. False when there is no running server of the agent's to restart.
  bool Restart(const std::string& why);
  // Stops the server for good (agent shutdown).
  void Shutdown();
  ServerState state() const;

 private:
  void StopLocked(common::TimePoint now);

  const SupervisorOptions options_;
  ProcessRunner* const runner_;
  common::Clock* const clock_;
  const std::function<ProbeReading()> probe_;

  mutable std::mutex mu_;
  ServerState state_;                           // guarded by mu_
  common::Backoff backoff_;                     // guarded by mu_
  common::TimePoint started_at_{};              // guarded by mu_
  common::TimePoint next_start_{};              // guarded by mu_
  common::TimePoint next_probe_{};              // guarded by mu_
  std::optional<common::TimePoint> term_sent_;  // guarded by mu_
  bool probe_ok_ = false;                       // guarded by mu_
  int probe_failures_ = 0;                      // guarded by mu_; in a row, while probe_ok_
  // The probe's reading, folded into probe_ok_: a server that answered
  // stays ready through one failed probe (a loaded host delays one now and
  // then: the XID-flood chaos test fenced a node that had just rejoined on
  // one), and is not ready after two in a row.
  bool ProbeOkLocked(bool ok);
  bool shutdown_ = false;  // guarded by mu_
};

}  // namespace gpuha::agent
