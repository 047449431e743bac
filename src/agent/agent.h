// Agent: one per GPU node. Samples the GPU probe and NICs, turns them into a
// health state, keeps a heartbeat stream to a controller, supervises the
// node's inference server and obeys fence/rejoin commands.
//
//   Agent agent(config, std::move(probe), &runner, RealClock::Get());
//   RETURN_IF_ERROR(agent.Start());
//   ...
//   agent.Stop();
//
// Threads: sampling (every sample_ms), XID events (blocks in the probe),
// connection (heartbeats every heartbeat_ms, reconnects with jittered backoff
// over the controller list), supervisor (100 ms ticks), and the HTTP server
// for /metrics and /healthz. Shared state sits under mu_.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "agent/agent_config.h"
#include "agent/datagram_beats.h"
#include "agent/job_supervisor.h"
#include "agent/pod_resources.h"
#include "agent/process.h"
#include "agent/remediation.h"
#include "agent/supervisor.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "common/prometheus.h"
#include "gpu/gpu_probe.h"
#include "gpu/health.h"
#include "gpu/kernel_log.h"
#include "gpu/pci_presence.h"
#include "gpu/sim_probe.h"
#include "gpu/watchdog.h"
#include "gpuha/v1/agent.grpc.pb.h"

namespace grpc {
class ClientContext;
}

namespace gpuha::agent {

// The agent's counters, declared once: each is a field of AgentCounters and
// the /metrics family gpuha_agent_NAME_total (Envoy's ALL_*_STATS habit), so
// nothing is counted and never shown.
#define GPUHA_AGENT_COUNTERS(X)                                                                   \
  X(heartbeats_sent, "Heartbeats written to a controller.")                                       \
  X(heartbeat_datagrams, "Heartbeats sent as UDP datagrams alone (in heartbeats_sent).")          \
  X(datagram_send_errors, "Heartbeat datagrams the kernel refused (sent on the stream).")         \
  X(datagram_fallbacks, "Times the controller heard no datagrams: beats back on the stream.")     \
  X(reconnects, "Controller streams that broke or never opened.")                                 \
  X(samples, "Telemetry samples taken.")                                                          \
  X(probe_errors, "GPU probe calls that failed.")                                                 \
  X(xid_events, "XID occurrences seen (NVML and kernel log, each once).")                         \
  X(kernel_log_xids, "XID lines read from the kernel log.")                                       \
  X(xid_duplicates, "XIDs seen by both sources, reported once.")                                  \
  X(recovery_actions, "GPU recovery actions NVML reported (its event, or read after Drain P2P).") \
  X(xid_server_restarts, "Servers restarted for an application XID of theirs.")                   \
  X(gpu_calls_hung, "GPU probe calls that missed their deadline.")                                \
  X(gpus_vanished, "Samples of a GPU gone from the PCI bus.")                                     \
  X(pci_check_errors, "PCI presence checks that could not read sysfs.")                           \
  X(fences, "Fence commands obeyed.")                                                             \
  X(pod_resources_errors, "Kubelet pod-resources List calls that failed.")                        \
  X(stale_commands, "Commands ignored for carrying an old epoch.")

struct AgentCounters {
#define GPUHA_FIELD(name, help) std::atomic<uint64_t> name{0};
  GPUHA_AGENT_COUNTERS(GPUHA_FIELD)
#undef GPUHA_FIELD
};

// Shared by agent.cc and agent_gpus.cc.
v1::NodeHealth ToProto(gpu::HealthState s);
void AddReason(const gpu::HealthReason& r, v1::HealthReason* out);
// The node's own server: none with servers per GPU (each GPU's runs under
// its own supervisor), else the configured one.
SupervisorOptions NodeServer(const AgentConfig& c);
// Remediation settles for three samples (3 s at least) after a step that
// worked before a failure still on the GPU's verdict escalates.
RemediationOptions RemediationWithSettle(const AgentConfig& c);

class Agent {
 public:
  Agent(AgentConfig config, std::unique_ptr<gpu::GpuProbe> probe, ProcessRunner* runner,
        common::Clock* clock);
  ~Agent();
  // Reads the devices, binds the HTTP endpoint and starts the threads.
  [[nodiscard]] absl::Status Start();
  void Stop();
  // A planned stop (SIGTERM): tells the controller goodbye, so that the
  // node's silence is not taken for a failure, then Stop(). When the agent
  // supervises its server (which stops with it), it first waits, up to
  // `wait`, for the controller to move the node's work and fence it.
  void Leave(common::Duration wait);

  uint16_t http_port() const { return http_ ? http_->port() : 0; }
  bool connected() const { return connected_.load(); }
  gpu::HealthState health() const;
  bool fenced() const { return fenced_.load(); }
  const AgentCounters& counters() const { return counters_; }
  std::string MetricsText() const;

 private:
  // dcgm-exporter's GPU families and labels (agent_endpoints.cc). Caller holds mu_.
  void AppendDcgmFamilies(common::PromText* p) const;
  void SampleLoop();
  void EventLoop();
  void ConnectionLoop();
  void SupervisorLoop();
  // Asks the kubelet which pods hold the GPUs, every pod_resources_interval.
  void PodResourcesLoop(const std::string& socket);
  // Samples every GPU and NIC and judges the readings (Judge).
  void Evaluate();
  // Judges new XID events at once, on the last sample's readings.
  void EvaluateXids(std::vector<gpu::XidEvent> xids);
  // Updates the health state from `obs` (a fresh sample, or new XIDs
  // alone) and wakes the heartbeat thread when it changed. Caller holds
  // eval_mu_.
  void JudgeLocked(gpu::Observation obs, bool sampled);
  // Opens the kernel log and checks the PCI tree (agent_config.h's paths).
  absl::Status OpenDriverWatch();
  // Marks GPUs gone from the PCI bus lost and lists the ones the driver misses.
  void CheckPci(gpu::Observation* obs);
  // Reads the kernel log for XIDs on listed GPUs as they are written.
  void KernelLogLoop();
  // Reports XIDs from `source`, each occurrence once (XidDeduper pairs
  // NVML's copy of one with the kernel log's).
  void ReportXids(std::vector<gpu::XidEvent> seen, gpu::XidSource source);
  // Asks the connection thread for a heartbeat now (urgent_ must be set).
  void WakeHeartbeat();
  absl::Status RunStream(const HostPort& controller, common::Duration connect_timeout);
  v1::AgentMessage BuildHello() const;
  v1::AgentMessage BuildHeartbeat();
  void Handle(const v1::ControllerMessage& m);
  common::HttpResponse HandleHttp(const common::HttpRequest& r);
  // Sleeps up to `d`, returning early on Stop().
  void WaitFor(common::Duration d);

  // Every server this agent runs or watches: the node's, and with per_gpu
  // one per GPU (whose node-level supervisor then has nothing to run).
  std::vector<Supervisor*> Servers();
  // A server the agent starts stops with it (its goodbye says so).
  bool ServersSupervised();

  const AgentConfig config_;
  ProcessRunner* const runner_;
  gpu::SimProbe* const sim_;  // the wrapped probe when it is the sim backend, else null
  std::unique_ptr<gpu::WatchedProbe> probe_;
  common::Clock* const clock_;
  Supervisor supervisor_;
  // The GPU servers' readiness probes, asked as one round per tick.
  ReadyBatch ready_batch_;
  // A round of ready_batch_ for the GPU servers due; returns when it began.
  common::TimePoint FetchGpuServersReady();
  struct GpuServer {
    ServerSlot slot;  // its GPU, or its GPU's MIG instance
    std::unique_ptr<Supervisor> supervisor;
    std::optional<size_t> ready_slot{};  // in ready_batch_
    bool stopped_for_remedy = false;     // supervisor thread only: fenced while its GPU is failed
  };
  std::vector<GpuServer> gpu_servers_;  // fixed after Start(): per_gpu's, in port order
  JobSupervisor jobs_;
  Remediator remediator_;
  // Runs the remediation steps of the GPUs whose own verdict is failed; a
  // GPU whose step worked is judged again from scratch.
  void RemediateGpus();
  // With servers per GPU: the node's verdict from node-level reasons, each
  // GPU's in gpu_health; remediation steps as reasons. Under mu_.
  void AddGpuHealthLocked(v1::Heartbeat* hb);
  std::unique_ptr<common::HttpServer> http_;
  AgentCounters counters_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::atomic<bool> fenced_{false};
  std::atomic<uint64_t> epoch_{0};
  std::vector<std::thread> threads_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::atomic<bool> leaving_{false};  // Leave(): the stream says goodbye, then beats no more
  // Leave(), fenced with jobs: the connection thread beats on until they end.
  std::atomic<bool> jobs_beat_on_leave_{false};
  bool left_ = false;  // guarded by stop_mu_: Leave() may stop now
  // Leave() may stop: the goodbye was heard (and the fence came, if the server
  // stops with the agent), or there is no controller to tell.
  void MarkLeft();

  std::mutex sample_mu_;  // serialises probe sampling
  std::mutex eval_mu_;    // serialises the evaluator; taken after sample_mu_, never held to sample
  gpu::HealthEvaluator evaluator_;              // guarded by eval_mu_
  std::string pci_devices_;                     // the sysfs PCI tree compared; "" when off
  gpu::PciScan pci_at_start_;                   // fixed after Start()
  std::unique_ptr<gpu::KernelLog> kernel_log_;  // its own thread's, after Start()
  mutable std::mutex xid_mu_;
  gpu::XidDeduper xid_dedup_;  // guarded by xid_mu_
  // XIDs NVML told first whose verdict the kernel log's line decides (an
  // application's process, 154's action, 144-150's registers, 45's
  // cause), waiting for that line.
  static constexpr common::Duration kAttributionWait = std::chrono::milliseconds(250);
  struct HeldXid {
    gpu::XidEvent x;
    common::TimePoint until;
  };
  std::vector<HeldXid> held_xids_;  // guarded by xid_mu_
  // Occurrences (as xid_events counts them) by GPU and XID, for
  // gpuha_agent_xids_total{gpu,xid}: alerts on a count of XID 79s, as
  // dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT{xid} allows.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> xids_by_code_;  // guarded by xid_mu_
  std::atomic<bool> xids_held_{false};  // held_xids_ is not empty: the event loop wakes sooner
  // Whether Fabric Manager ran when last looked (an XID 45's), and when.
  bool fabric_manager_ = false;                              // guarded by xid_mu_
  std::optional<common::TimePoint> fabric_manager_seen_at_;  // guarded by xid_mu_
  // Whose process an XID's is (XidEvent::owner); the node's own server is
  // restarted for an application XID it caused.
  void AttributeXid(gpu::XidEvent* x);
  // A kernel log line that decides its XID's verdict (154's action,
  // 144-150's registers) or adds to it (74's registers), judged even when
  // it comes after NVML's copy and the wait.
  static bool LineDecides(const gpu::XidEvent& x);

  mutable std::mutex mu_;
  bool urgent_ = false;                        // guarded by mu_
  std::vector<gpu::DeviceInfo> devices_;       // fixed after Start()
  std::vector<gpu::GpuSample> samples_;        // guarded by mu_
  std::vector<gpu::NicSample> nics_;           // guarded by mu_
  gpu::HealthReport health_;                   // guarded by mu_
  int64_t health_changed_unix_nanos_ = 0;      // guarded by mu_
  std::vector<gpu::XidEvent> unsent_xids_;     // guarded by mu_
  std::map<uint32_t, uint32_t> last_xid_;      // guarded by mu_, per GPU index
  GpuOwners gpu_owners_;                       // guarded by mu_; the kubelet's last answer
  std::string role_;                           // guarded by mu_
  grpc::ClientContext* stream_ctx_ = nullptr;  // guarded by mu_
  uint64_t heartbeat_seq_ = 0;                 // connection thread only
  DatagramBeats beats_{&counters_.datagram_send_errors};  // connection thread only
  std::string stream_peer_;       // connection thread only: where the stream went
  uint64_t sample_seq_ = 0;       // guarded by mu_; one per Evaluate()
  uint64_t sent_sample_seq_ = 0;  // connection thread only

  // Wakes the connection thread, which sleeps in its stream's completion
  // queue: an alarm set to now posts kWake there.
  std::mutex wake_mu_;
  grpc::CompletionQueue* wake_cq_ = nullptr;  // guarded by wake_mu_; set while a stream runs
  grpc::Alarm wake_alarm_;                    // guarded by wake_mu_
  bool wake_pending_ = false;                 // guarded by wake_mu_
};

}  // namespace gpuha::agent
