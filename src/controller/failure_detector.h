// FailureDetector: decides from heartbeat arrivals alone when a node is
// suspect or failed. Adaptive like phi-accrual: a node fails when it has been
// silent longer than mean + k * stddev of its recent heartbeat intervals,
// never sooner than `floor` (BFD's 3 x 50 ms) and never later than `ceiling`.
// A broken stream (a crashed agent) makes the node suspect at once and failed
// after `broken_grace` unless it reconnects.
//
// Silence most nodes share is held: while more than half the watched nodes
// are overdue together (each by its own rhythm: halfway from its mean
// interval to its threshold), none fails by silence, until it has been
// unheard for `ceiling` (forgiven silence included). A loaded or
// partitioned watcher hears no one; nodes that fail on their own fail one
// by one while the rest still beat. (Pacemaker's quorum reasons the same
// way: a side that hears no majority fences no one.) The hold outlasts the
// shared silence by one threshold, as beats come back a tick apart, for
// every node that was overdue in it (one that had not yet reached its
// threshold when another's beat ended the sharing failed a few ms later, a
// healthy node on a loaded host). A broken stream is the node's own word
// and is never held.
//
//   FailureDetector d(options, &clock);
//   d.Heartbeat("n1");                  // on every heartbeat
//   d.StreamBroken("n1");               // when the gRPC stream ends
//   for (auto& t : d.Check()) ...       // every few ms on the controller loop
//
// Time comes only from the injected Clock, so tests run with no sleeps.
// Thread-safety: none; the controller's loop owns it.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace gpuha::controller {

enum class Liveness { kAlive, kSuspect, kFailed };
const char* LivenessName(Liveness l);

struct DetectorOptions {
  common::Duration floor = std::chrono::milliseconds(150);
  common::Duration ceiling = std::chrono::seconds(3);
  double k = 4;         // stddevs of tolerance above the mean interval
  size_t window = 100;  // intervals remembered per node
  // Silent this long (or its threshold, if shorter), a node is suspect (not yet
  // failed). An absolute mark: with slow heartbeats a live node is suspect
  // between beats.
  common::Duration suspect_after = std::chrono::milliseconds(100);
  common::Duration broken_grace = std::chrono::milliseconds(30);
  // Until a node has shown this many intervals its rhythm is unknown (a new
  // agent process is still starting): silence must reach warmup_threshold.
  size_t warmup_intervals = 10;
  common::Duration warmup_threshold = std::chrono::seconds(1);
};

struct LivenessChange {
  std::string node;
  Liveness from;
  Liveness to;
  std::string reason;  // "stream broke", "silent 163 ms (threshold 150 ms)"
  common::TimePoint last_heartbeat;
  // Past its threshold but held (to == kSuspect; from is kAlive when it
  // crossed both marks between two checks): most watched nodes are silent
  // with it. Reported once per hold.
  bool held = false;
  // The node's stream broke (its own word), not silence.
  bool broken = false;
};

class FailureDetector {
 public:
  FailureDetector(DetectorOptions options, common::Clock* clock);
  // Starts watching a node (its first heartbeat counts from now).
  void Connected(const std::string& node);
  void Heartbeat(const std::string& node);
  void StreamBroken(const std::string& node);
  // Stops watching (node removed or fenced for good).
  void Forget(const std::string& node);
  // Re-evaluates every node; returns the changes since the last call.
  std::vector<LivenessChange> Check();
  // The watcher itself was stalled (CPU starvation, a slow disk): silence it
  // could not observe says nothing about the nodes. Restarts every node's
  // silence from now; broken streams stay broken.
  void ForgiveSilence();
  // The same for one node: its heartbeats may have been lost on the way in
  // the watcher's own host (a full socket buffer), so its silence until now
  // says nothing. Not a failed or broken node's.
  void ForgiveSilence(const std::string& node);
  // The watcher's call for a node whose failure would cost more than a
  // false verdict (its streams would have nowhere to go): its silence is
  // held as shared silence is, until it has been unheard for the ceiling,
  // or until it is heard again. False when it has already been unheard
  // that long (or is not watched, or its stream broke): it fails now.
  bool HoldToCeiling(const std::string& node);
  Liveness state(const std::string& node) const;
  // The silence after which `node` fails now, from its interval history.
  common::Duration Threshold(const std::string& node) const;

 private:
  struct NodeState {
    Liveness liveness = Liveness::kAlive;
    common::TimePoint last;   // silence counts from here (forgiveness moves it)
    common::TimePoint heard;  // its last heartbeat or connection
    std::deque<double> intervals_ms;
    double sum = 0, sum_sq = 0;
    bool broken = false;
    common::TimePoint broken_at;
    bool held = false;  // past its threshold, held as shared silence
    // Overdue while the silence was shared (not yet past its threshold):
    // held as the others are, once past it, for a threshold after the
    // shared silence ended, unless heard first.
    bool shared_overdue = false;
    bool hold_to_ceiling = false;  // HoldToCeiling, until heard again
  };
  common::Duration ThresholdOf(const NodeState& s) const;
  // The silence after which a node counts as overdue for shared silence.
  common::Duration OverdueAfter(const NodeState& s) const;

  const DetectorOptions options_;
  common::Clock* const clock_;
  std::map<std::string, NodeState> nodes_;
  std::optional<common::TimePoint> last_shared_;  // the last check that found shared silence
};

}  // namespace gpuha::controller
