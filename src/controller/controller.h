// Controller: the brain of the active-passive cluster. Membership from agent
// streams, failure detection, N+k placement, failover with fencing, recovery
// as passive, operator commands, events, durable state and the route snapshots
// routers watch.
//
//   Controller c(config, std::move(store), &clock, &fencer);
//   RETURN_IF_ERROR(c.Recover());                // loads the store
//   c.AgentConnected(hello, sink, proven);       // from the gRPC service
//   c.Tick();                                    // every few ms, on one thread
//
// Every state change goes through one function that applies its side effects,
// records an event with monotonic and wall timestamps, and logs one line.
// Thread-safety: all public methods lock mu_; sinks are called under it, so
// AgentSink::Send must not block.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/heartbeat_datagram.h"
#include "common/prometheus.h"
#include "controller/controller_config.h"
#include "controller/datagram_sessions.h"
#include "controller/event_log.h"
#include "controller/failure_detector.h"
#include "controller/fence_runner.h"
#include "controller/job.h"
#include "controller/join_tokens.h"
#include "controller/node_lifecycle.h"
#include "controller/node_state.h"
#include "controller/router_acks.h"
#include "controller/state_codec.h"
#include "controller/store.h"
#include "controller/traffic_history.h"
#include "gpuha/v1/agent.pb.h"
#include "gpuha/v1/routes.pb.h"
#include "placement/placement.h"

namespace gpuha::controller {

// "healthy", "degraded", "draining", "failed" or "unknown".
const char* HealthName(v1::NodeHealth h);

// Every counter of the controller, declared once: the list makes both the
// fields and their /metrics families (gpuha_controller_<field>_total).
#define GPUHA_CONTROLLER_COUNTERS(X)                                                            \
  X(failovers, "Nodes taken out of service.")                                                   \
  X(fence_hook_failures, "Fence hooks that failed or timed out.")                               \
  X(heartbeats, "Agent heartbeats received, each once (stream or datagram).")                   \
  X(stale_agents_corrected, "Agents re-fenced for serving while fenced.")                       \
  X(admissions_refused, "Streams refused under N+k.")                                           \
  X(unplaced_streams, "Streams that found no node in a failover.")                              \
  X(store_errors, "Store writes that failed.")                                                  \
  X(stalls, "Ticks delayed past a third of the detector floor (silence forgiven).")             \
  X(silences_held,                                                                              \
    "Nodes past their silence threshold not failed: most nodes were silent together.")          \
  X(silences_held_no_capacity,                                                                  \
    "Silent nodes held to the detector ceiling: their streams would have had nowhere to go.")   \
  X(agents_refused, "Agent streams refused: a second stream for a connected node.")             \
  X(join_tokens_throttled,                                                                      \
    "Agent hellos refused unchecked: too many wrong join tokens from their IP in a second.")    \
  X(fence_repeats, "Fence commands re-sent to a node that had not confirmed.")                  \
  X(quarantines_held, "Health verdicts not acted on: the quarantine breaker was open.")         \
  X(gpu_failovers, "GPUs taken out of placement alone, their node serving on.")                 \
  X(job_takeovers, "Jobs started on another node after their node's fence was confirmed.")      \
  X(jobs_blocked, "Jobs not restarted because their node's fence was not confirmed.")           \
  X(heartbeat_datagrams, "Agent heartbeats received as UDP datagrams (counted in heartbeats).") \
  X(datagrams_refused, "UDP datagrams refused: malformed, unknown session or bad MAC.")         \
  X(datagrams_stale,                                                                            \
    "Heartbeat datagrams older than a heartbeat already heard, or of a session just ended "     \
    "(dropped).")                                                                               \
  X(datagrams_dropped,                                                                          \
    "UDP datagrams the kernel dropped before they were read (a full buffer, mostly).")          \
  X(datagram_fallbacks,                                                                         \
    "Agents told to beat on their streams again: their datagrams stopped arriving.")            \
  X(store_rows_set_aside,                                                                       \
    "Store rows that did not read back at the last recovery: named in the log and events, "     \
    "not served.")

struct ControllerCounters {
#define GPUHA_FIELD(name, help) uint64_t name = 0;
  GPUHA_CONTROLLER_COUNTERS(GPUHA_FIELD)
#undef GPUHA_FIELD
};

// The help text of gpuha_controller_leader, on the leader's page and a standby's.
inline constexpr char kLeaderHelp[] = "1: this controller leads and acts.";
// gpuha_controller_store_up's: the leader's last write, a standby's last read.
inline constexpr char kStoreUpHelp[] =
    "1: this controller's last store write (leader) or read (standby) went through.";

class Controller {
 public:
  Controller(ControllerConfig config, std::unique_ptr<Store> store, common::Clock* clock,
             FenceRunner* fencer);
  ~Controller();

  // Loads nodes, streams, epoch and recent events from the store, and starts
  // a new epoch (written to the store) with a controller_started event.
  [[nodiscard]] absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Loads the same for reading only, as a standby serves the API on etcd: no
  // new epoch, no event, nothing written, and it never acts (acting() false).
  [[nodiscard]] absl::Status LoadAsStandby() ABSL_LOCKS_EXCLUDED(mu_);

  // --- agents ---------------------------------------------------------------
  // NotFound for a node that is not in the config, unless the registration
  // policy lets its hello add it (PermissionDenied for a wrong join token,
  // InvalidArgument for a registration that does not hold). `proven`: the transport
  // proved the name (mTLS), so this stream replaces a connected one (a
  // reconnect); otherwise a node with a connected agent refuses a second
  // stream (AlreadyExists) until the first one ends. `peer_ip`: where the
  // stream comes from (empty: unknown). A node registered without mTLS is
  // bound to the IP it registered from: a hello from elsewhere is refused
  // (PermissionDenied), join token or not, until an admin rebinds it.
  [[nodiscard]] absl::Status AgentConnected(const v1::Hello& hello, std::shared_ptr<AgentSink> sink,
                                            bool proven, const std::string& peer_ip = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a registered node from the IP it is bound to: the next agent that
  // registers it (with the join token) binds it anew (an admin's act, for a
  // node whose host moved). NotFound; FailedPrecondition for a listed node.
  [[nodiscard]] absl::Status RebindNode(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a registered node whose agent is gone and which is out of
  // service (drained or failed) with no stream or job left on it: its row,
  // its placement units, its alerts' series. A listed node is the config's.
  [[nodiscard]] absl::Status RemoveNode(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Wrong join tokens one source IP may send in a second; past them its
  // hellos are refused unchecked for the rest of the second.
  static constexpr int kMaxWrongJoinTokens = JoinTokens::kMaxWrongPerSecond;
  // `from`: the stream it came on; a beat from a stream another one
  // replaced (an mTLS reconnect) is dropped. Null: trusted (tests).
  void AgentHeartbeat(const std::string& node, const v1::Heartbeat& hb,
                      const AgentSink* from = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // A heartbeat datagram (common/heartbeat_datagram.h) from the UDP port:
  // applied as AgentHeartbeat when it is a stream's, signed with its key,
  // and newer than every heartbeat heard from that agent. The reason when
  // it is not (counted in datagrams_refused; AlreadyExists, one not newer
  // or one of a session that ended, in datagrams_stale). One caller, the
  // UDP thread: the keys it verifies with are not thread-safe.
  [[nodiscard]] absl::Status AgentDatagram(absl::string_view datagram) ABSL_LOCKS_EXCLUDED(mu_);
  // The UDP port heartbeat datagrams reach; 0 (the default): none, agents
  // beat on their streams only. Welcomes offer datagrams from then on.
  void SetDatagramPort(uint16_t port) { datagram_port_ = port; }
  // Datagrams the kernel dropped before they were read (SO_RXQ_OVFL).
  void CountDatagramDrops(uint64_t dropped);
  void AgentDisconnected(const std::string& node, const AgentSink* sink) ABSL_LOCKS_EXCLUDED(mu_);
  // The agent on `sink` stops on purpose. If its server stops with it, the
  // node's work moves first (make-before-break) and the node is fenced, not
  // counted as a failure; it rejoins when its agent is back and healthy.
  // Otherwise its server keeps serving: for recovery.restart_grace its
  // silence fails nothing over, unless a router reports its server failing.
  void AgentGoodbye(const std::string& node, const AgentSink* sink, const v1::Goodbye& goodbye)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs failure detection and recovery; call every few milliseconds.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // --- operator API (errors carry the HTTP meaning in their code) -----------
  [[nodiscard]] absl::StatusOr<Assignment> AddStream(const StreamSpec& s) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status RemoveStream(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status Drain(const std::string& node, bool force) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status Undrain(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status Fail(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status SetRole(const std::string& node, Role role) ABSL_LOCKS_EXCLUDED(mu_);
  // Stateful jobs (job.h). AddJob places it on a serving node with the
  // GPUs (active nodes first), or leaves it pending. RemoveJob stops it.
  // ConfirmJobFence: an operator says a blocked job's old node is off
  // (Pacemaker's `stonith_admin --confirm`); the job restarts elsewhere.
  [[nodiscard]] absl::StatusOr<nlohmann::json> AddJob(const JobSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status RemoveJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::StatusOr<nlohmann::json> ConfirmJobFence(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);
  nlohmann::json JobsJson() const ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::StatusOr<nlohmann::json> JobJson(const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  nlohmann::json NodesJson() const ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::StatusOr<nlohmann::json> NodeJson(const std::string& node) const
      ABSL_LOCKS_EXCLUDED(mu_);
  nlohmann::json StreamsJson() const ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::StatusOr<nlohmann::json> StreamJson(const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  nlohmann::json CapacityJson() const ABSL_LOCKS_EXCLUDED(mu_);
  // Epoch, route version, and how long the startup grace still lasts (a
  // restarted controller fails nothing over until its agents had a window
  // to come back).
  nlohmann::json StatusJson() const ABSL_LOCKS_EXCLUDED(mu_);
  nlohmann::json TenantsJson() const ABSL_LOCKS_EXCLUDED(mu_);
  // Up to `limit` events after `after_id`; with no `after_id`, the newest.
  nlohmann::json EventsJson(std::optional<int64_t> after_id, size_t limit) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // One entry per failover (a `detected` event), timed from its events:
  // fault seen -> detected -> fenced -> routes pushed -> routers acknowledged.
  nlohmann::json FailoversJson() const ABSL_LOCKS_EXCLUDED(mu_);
  // The data plane over the last minutes, a point a second (TrafficHistory).
  nlohmann::json HistoryJson() const ABSL_LOCKS_EXCLUDED(mu_);
  // Each router watching routes: the version it holds and its traffic.
  nlohmann::json RoutersJson() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string MetricsText() const ABSL_LOCKS_EXCLUDED(mu_);
  bool HasTenant(const std::string& t) const;

  // --- routers --------------------------------------------------------------
  v1::RouteSnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t route_version() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the route version passes `known` or `timeout` ends.
  uint64_t WaitForRoutes(uint64_t known, common::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // `stats`: the router's traffic so far, when the ack carries it.
  void RouterAck(const std::string& router, uint64_t version,
                 const std::vector<std::string>& suspects, const v1::RouterStats* stats = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A router starts watching, holding routes (`held_epoch`, `held_version`).
  // If those are newer than the controller's, the router would refuse its
  // routes: the controller moves past that epoch (and persists it).
  void RouterHello(const std::string& router, uint64_t held_epoch, uint64_t held_version)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RouterGone(const std::string& router) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  ControllerCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);

  // This process no longer leads (its etcd lease lapsed, or a write found
  // another leader). From now on it fences no node, tells no agent to serve,
  // pushes no routes, writes nothing to the store and refuses every change
  // (Unavailable), while the process stops. A leader deposed while a store
  // write hung once failed a node over 2 s later and pushed routes the new
  // leader never had. Takes no lock: callable from any thread, even while
  // another holds mu_ in a hung store write.
  void StopActing(const std::string& why);
  // False once StopActing ran, or while the lease check (if set) says the
  // leadership's lease may have run out: a keep-alive thread that was
  // delayed (a paused process) must not leave the rest acting meanwhile.
  bool acting() const { return acting_.load() && (!lease_check_ || lease_check_()); }
  // Set once, before the controller is shared with other threads.
  void SetLeaseCheck(std::function<bool()> holds) { lease_check_ = std::move(holds); }
  std::vector<Event> EventsSince(int64_t after_id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  [[nodiscard]] absl::Status RecoverImpl(bool standby) ABSL_LOCKS_EXCLUDED(mu_);
  // Its steps (controller_recovery.cc). Rows that do not read back are set
  // aside, named: (row, why).
  using SetAsideRows = std::vector<std::pair<std::string, std::string>>;
  [[nodiscard]] absl::Status RecoverMetaLocked(const std::map<std::string, std::string>& meta,
                                               bool standby) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status RecoverNodesLocked(std::map<std::string, std::string>& stored_nodes,
                                                SetAsideRows* aside)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `stored_nodes` gains the nodes that stored streams prove known.
  [[nodiscard]] absl::Status RecoverStreamsLocked(std::map<std::string, std::string>& stored_nodes,
                                                  SetAsideRows* aside)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status RecoverJobsLocked(SetAsideRows* aside)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status RecoverEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  using NodeState = controller::NodeState;  // node_state.h
  static constexpr common::Duration kGpuJoinWait = std::chrono::seconds(10);
  static constexpr double kXidRepeatQuietMs = 60'000;
  static constexpr size_t kRecentXids = 10;  // per node, in the API's GPU view
  static constexpr common::Duration kRefenceFirst = std::chrono::milliseconds(100);
  static constexpr common::Duration kRefenceMax = std::chrono::seconds(5);

  // Transitions of a node's lifecycle, each its only writer: one event
  // each, and the node persisted once.
  // serving -> `to` (fenced or drained; held-out past max_failures). The one
  // place a node is taken out. `fault_unix_ns` is when the fault was first
  // seen (0 = unknown); `make_before_break` moves routes before fencing. A
  // node already out only moves to the stronger state (drained, held-out).
  void TakeOutLocked(NodeState& n, const std::string& why, int64_t fault_unix_ns,
                     bool make_before_break, bool count_failure, NodeLifecycle to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a failure now; past max_failures within the window, holds the
  // node out.
  void CountFailureLocked(NodeState& n, std::vector<StoreWrite>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The role its agent is told: where a rejoining node will serve.
  Role RoleToTellLocked(const NodeState& n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // fenced or drained -> held-out: an operator must undrain it.
  void HoldOutLocked(NodeState& n, const std::string& why, std::vector<StoreWrite>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // fenced, drained or held-out -> rejoining: its agent is told to serve
  // again, as passive; JoinLocked puts it back once its server is ready.
  void RejoinLocked(NodeState& n, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // rejoining -> fenced: failed again before it took work. It must prove
  // itself healthy for healthy_for once more; counted, so a node that fails
  // each time it comes back is held out after max_failures.
  void RejoinFailedLocked(NodeState& n, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The steps of AgentConnected (controller_agents.cc). The node an agent's
  // hello may hold (`proven`: by mTLS; else `peer_ip` binds a registered
  // node and is what the join-token guard counts by), or why not.
  [[nodiscard]] absl::StatusOr<NodeState*> AdmitAgentLocked(const v1::Hello& hello, bool proven,
                                                            const std::string& peer_ip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A registered node's new address from its agent's hello (routes move).
  [[nodiscard]] absl::Status UpdateRegistrationLocked(NodeState& n, const v1::Hello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The welcome: epoch, role, fence, and a datagram session when offered.
  void WelcomeLocked(NodeState& n, const v1::Hello& hello) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A node the config does not list, added from its agent's hello under
  // the registration policy (pending until its server is ready).
  [[nodiscard]] absl::StatusOr<NodeState*> RegisterLocked(const v1::Hello& hello,
                                                          const std::string& peer_ip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The join token of `hello`, from `peer_ip` (empty: unknown), checked by
  // join_tokens_ (JoinTokens); a source it throttles is counted.
  [[nodiscard]] absl::Status CheckJoinTokenLocked(const v1::Hello& hello,
                                                  const std::string& peer_ip)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // pending -> serving, in its configured role, or rejoining -> serving, as
  // passive: its agent is connected and its server ready. Streams that fit
  // nowhere so far are placed now.
  void JoinLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the agent (or runs the fence hook) that the node serves nothing.
  void FenceLocked(NodeState& n, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fence message alone, to a connected agent: no event.
  void SendFenceLocked(NodeState& n, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rejoin message (serve again, at this epoch, in this role), to a
  // connected agent: no event.
  void SendRejoinLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new route version. The commit that follows persists it with the
  // state it describes (standbys serve it): call it before CommitLocked.
  void PushRoutesLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // epoch_ = past + 1, persisted, with an event and new routes.
  void AdvanceEpochLocked(uint64_t past, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistNodeLocked(const NodeState& n, std::vector<StoreWrite>* batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistStreamLocked(const std::string& id, std::vector<StoreWrite>* batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- jobs (controller_jobs.cc) ---------------------------------------------
  struct JobState {
    JobRecord r;
    // Not stored: a new leader starts these afresh.
    common::TimePoint fence_since{};  // when it began to wait for its node's fence
    bool escalated = false;           // the fence hook ran (or there is none)
    std::string prefer;               // the node that took its node's place
    common::TimePoint retry_at{};     // pending: next placement try; else next StartJob resend
  };
  void PersistJobLocked(const JobState& j, std::vector<StoreWrite>* batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The serving node with the GPUs free that the job would go to ("" if
  // none): for a move the node that took the old one's place, then
  // passive, buffer and active nodes; else active ones first.
  std::string JobTargetLocked(const JobState& j, const std::string& exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts it on a node (a new job epoch), or leaves it pending.
  void PlaceJobLocked(JobState& j, const std::string& exclude, std::vector<StoreWrite>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `n` is being taken out: its jobs wait for its fence (TakeOutLocked,
  // which persists them after the fence: a fence that fails at once
  // blocks them first).
  void JobsOffNodeLocked(const NodeState& n, int64_t fault_unix_ns, bool planned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a job waits for `node`'s fence (it must not rejoin meanwhile).
  bool JobsFencingLocked(const std::string& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fence of `j`'s node is confirmed (`how`): it starts elsewhere.
  void ConfirmJobFenceLocked(JobState& j, const std::string& how, std::vector<StoreWrite>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job waiting on `node`'s fence, confirmed, or blocked with an alert.
  void NodeFenceConfirmedLocked(const std::string& node, const std::string& how)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NodeFenceFailedLocked(const std::string& node, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What an agent says of its jobs (hello or heartbeat).
  void JobReportLocked(NodeState& n, const google::protobuf::RepeatedPtrField<v1::JobStatus>& jobs,
                       bool fenced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartedJobReportLocked(NodeState& n, JobState& j, const v1::JobStatus* mine, bool fenced,
                              common::TimePoint now, std::vector<StoreWrite>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopUnplacedJobsLocked(NodeState& n,
                              const google::protobuf::RepeatedPtrField<v1::JobStatus>& jobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Escalates fences the agent does not confirm; places pending jobs.
  void JobsTickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendStartJobLocked(NodeState& n, const JobState& j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the fence hook for `id` on its own thread; the result confirms or
  // blocks the node's jobs (and a failure holds the node out).
  void RunFenceHookLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One call into the controller that may change it: holds mu_ and, as it
  // ends, applies in one store batch every row its steps committed, before
  // another call can see the state. The steps decide; the call writes once
  // (a failover that also holds the node out and moves its jobs is one
  // store write, not four). Calls that only read lock mu_ alone.
  class ABSL_SCOPED_LOCKABLE Step {
   public:
    explicit Step(Controller* c) ABSL_EXCLUSIVE_LOCK_FUNCTION(c->mu_);
    ~Step() ABSL_UNLOCK_FUNCTION();
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    Controller* const c_;
  };
  // Adds `batch` to the rows the current Step writes as it ends.
  void CommitLocked(std::vector<StoreWrite> batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the rows committed so far (and those a failed write left
  // unsaved) with the epoch and the route version (MetaWritesLocked), in
  // one store batch: a Step's end, or an answer that says what is stored.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every change so far is stored (flushed, none left in unsaved_)
  // by a controller that still leads: what an API write is answered with, so
  // that a write is confirmed only once it is stored.
  [[nodiscard]] absl::Status StoredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<StoreWrite> MetaWritesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EventLocked(const std::string& type, const std::string& node, const std::string& detail,
                   std::optional<double> unix_ms = std::nullopt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json NodeJsonLocked(const NodeState& n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json GpuUnitsJsonLocked(const NodeState& n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendNodeFamiliesLocked(common::PromText* p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeState* FindLocked(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stream as the API must give it (and as a store row must hold it): an
  // ID routers can route, a known tenant, a weight in range.
  [[nodiscard]] absl::Status CheckStreamLocked(const StreamSpec& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether taking one more node out on an agent's health verdict keeps
  // the nodes out after failures within quarantine_max_share.
  bool QuarantineAllowsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- GPUs as placement units (controller_gpus.cc) ----------------------------
  // On a serving node with servers per GPU: takes out each GPU its agent
  // calls failed or draining, or whose server is not ready (its streams
  // only), and brings one back once it has been healthy and ready for
  // healthy_for. The quarantine breaker counts GPUs as it counts nodes.
  void GpuVerdictsLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeOutGpuLocked(NodeState& n, const GpuServerConfig& g, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestoreGpuLocked(NodeState& n, const GpuServerConfig& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool GpuQuarantineAllowsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A joining node with servers per GPU waits until each GPU's server is
  // ready or its GPU is down (then it joins without that GPU).
  // Past kGpuJoinWait it joins anyway, and its GPUs that are not up go out
  // one by one.
  bool GpuServersUpLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The nodes of the passive units a failover promoted, persisted.
  void PersistPromotedLocked(const FailoverPlan& plan, std::vector<StoreWrite>* batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unavailable once StopActing ran: a change this process may no longer make.
  [[nodiscard]] absl::Status CheckActing() const;
  static constexpr int64_t kMaxStreamWeight = 1'000'000;
  // Epochs a controller gives, and reads back, stay below this.
  static constexpr uint64_t kMaxEpoch = uint64_t{1} << 62;

  const ControllerConfig config_;
  std::unique_ptr<Store> store_;
  common::Clock* const clock_;
  FenceRunner* const fencer_;
  const common::TimePoint started_;
  common::TimePoint grace_until_;
  std::optional<common::TimePoint> last_tick_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar routes_cv_;
  std::atomic<bool> acting_{true};
  std::function<bool()> lease_check_;          // set before any thread runs
  bool standby_ = false;                       // LoadAsStandby: live fields are the leader's
  bool store_up_ ABSL_GUARDED_BY(mu_) = true;  // the last store write went through
  Placement placement_ ABSL_GUARDED_BY(mu_);
  FailureDetector detector_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, StreamSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t route_version_ ABSL_GUARDED_BY(mu_) = 1;
  // The highest job epoch given (stored as meta.job_epoch): each placement
  // of any job gets a higher one, so a job removed and added again on the
  // same directory fences its old writer too.
  uint64_t job_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Rows of commits the store refused, written again with the next commit.
  std::map<std::pair<std::string, std::string>, std::optional<std::string>> unsaved_
      ABSL_GUARDED_BY(mu_);                            // (table, key) -> value, nullopt deletes
  std::string last_store_error_ ABSL_GUARDED_BY(mu_);  // why the last failed commit failed
  bool flush_due_ ABSL_GUARDED_BY(mu_) = false;  // CommitLocked ran since the last FlushLocked
  RouterAcks router_acks_ ABSL_GUARDED_BY(mu_);
  EventLog events_ ABSL_GUARDED_BY(mu_){10000};                         // the newest 10000
  mutable FailoverStepHistograms failover_steps_ ABSL_GUARDED_BY(mu_);  // fed at each scrape
  ControllerCounters counters_ ABSL_GUARDED_BY(mu_);
  // After config_, which it is made from.
  JoinTokens join_tokens_ ABSL_GUARDED_BY(mu_){config_.registration.join_token_sha256};
  // Datagrams that are not applied are counted without mu_ (a flood of them
  // must not take it); CountersLocked() folds them in.
  std::atomic<uint64_t> datagrams_refused_{0};
  std::atomic<uint64_t> datagrams_stale_{0};
  std::atomic<uint64_t> datagrams_dropped_{0};
  // Drops counted since the last tick's look (DatagramsTickLocked).
  std::atomic<uint64_t> drops_unjudged_{0};
  ControllerCounters CountersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TrafficHistory traffic_ ABSL_GUARDED_BY(mu_){600};  // ten minutes
  std::vector<std::thread> hooks_;                    // fence hooks in flight
  std::atomic<uint16_t> datagram_port_{0};
  // The agents' datagram sessions and keys, under a lock of their own
  // (taken after mu_, never before it): a datagram is verified without mu_.
  DatagramSessions datagram_sessions_;
  // Applies one heartbeat of `n`'s agent, from its stream or a datagram;
  // `fresh`: newer than any heard. One that is not gives its telemetry and
  // XIDs only: its state and liveness are older than what was applied.
  void HeartbeatLocked(NodeState* n, const std::string& node, const v1::Heartbeat& hb, bool fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The steps of HeartbeatLocked: new XIDs into the node's row (once per
  // GPU and XID within kXidRepeatQuietMs); the fence re-sent with backoff
  // to an agent serving under an old epoch while fenced; and the verdict
  // (join, take out, hold in quarantine, or the GPUs' own verdicts), `why`
  // being the agent's first reason.
  void RecordXidsLocked(NodeState& n, const v1::Heartbeat& hb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefenceLocked(NodeState& n, const v1::Heartbeat& hb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JudgeHeartbeatLocked(NodeState& n, const std::string& node, const v1::Heartbeat& hb,
                            bool server_was_ready, bool in_service, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `n`'s datagram session, if any.
  void EndDatagramsLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells `n`'s agent its datagrams are lost (`why`) and ends its session:
  // it beats on its stream from now on.
  void DatagramsLostLocked(NodeState& n, const std::string& id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each tick: an agent whose datagrams were heard, whose stream beats go
  // on skipping beats, and of whose datagrams none came for a second, not
  // even late (UDP blocked on the way), is told to beat on its stream
  // alone. `stalled`: this tick came late, and datagrams may sit unread
  // behind the stream's beats: their silence is forgiven, as the
  // detector's is.
  void DatagramsTickLocked(common::TimePoint now, bool stalled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace gpuha::controller
