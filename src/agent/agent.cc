#include "agent/agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/grpc_client.h"
#include "common/log.h"
#include "common/reconnect.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;

JobOptions JobsWithDefaults(const AgentConfig& c) {
  JobOptions o = c.jobs;
  if (o.progress_dir.empty()) o.progress_dir = "/tmp/gpuha-jobs-" + c.node;
  return o;
}

constexpr const char* kVersion = "0.1.0";

// What a tag on the heartbeat stream's completion queue stands for.
enum class StreamOp : intptr_t { kStart = 1, kRead, kWrite, kWake, kFinish };
void* Tag(StreamOp op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }
StreamOp OpOf(void* tag) { return static_cast<StreamOp>(reinterpret_cast<intptr_t>(tag)); }

}  // namespace

v1::NodeHealth ToProto(gpu::HealthState s) {
  switch (s) {
    case gpu::HealthState::kHealthy:
      return v1::NODE_HEALTH_HEALTHY;
    case gpu::HealthState::kDegraded:
      return v1::NODE_HEALTH_DEGRADED;
    case gpu::HealthState::kDraining:
      return v1::NODE_HEALTH_DRAINING;
    case gpu::HealthState::kFailed:
      return v1::NODE_HEALTH_FAILED;
  }
  return v1::NODE_HEALTH_UNSPECIFIED;
}

void AddReason(const gpu::HealthReason& r, v1::HealthReason* out) {
  out->set_code(r.code);
  out->set_detail(r.detail);
  out->set_severity(ToProto(r.state));
}

Agent::Agent(AgentConfig config, std::unique_ptr<gpu::GpuProbe> probe, ProcessRunner* runner,
             common::Clock* clock)
    : config_(std::move(config)),
      runner_(runner),
      sim_(dynamic_cast<gpu::SimProbe*>(probe.get())),
      probe_(gpu::WatchedProbe::Wrap(std::move(probe), milliseconds(config_.call_deadline_ms))),
      clock_(clock),
      supervisor_(NodeServer(config_), runner, clock,
                  ServerProbe(NodeServer(config_), config_.node, clock)),
      jobs_(JobsWithDefaults(config_), runner, clock),
      remediator_(RemediationWithSettle(config_), runner, clock, config_.node),
      evaluator_(config_.thresholds) {}

Agent::~Agent() { Stop(); }

absl::Status Agent::Start() {
  auto devices = probe_->Devices();
  if (!devices.ok()) return devices.status();
  devices_ = *devices;
  for (const ServerSlot& slot : ServerSlots(config_, devices_)) {
    SupervisorOptions o = GpuServerOptions(config_, slot);
    std::optional<size_t> ready_slot;
    auto probe = ServerProbe(o, config_.node, clock_, &ready_batch_, &ready_slot);
    gpu_servers_.push_back(
        {slot, std::make_unique<Supervisor>(o, runner_, clock_, std::move(probe)), ready_slot});
  }
  if (absl::Status s = OpenDriverWatch(); !s.ok()) return s;
  auto http =
      common::HttpServer::Start({.address = config_.listen.host, .port = config_.listen.port},
                                [this](const common::HttpRequest& r) { return HandleHttp(r); });
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  Evaluate();
  size_t slices = 0;
  for (const gpu::DeviceInfo& d : devices_) slices += d.slices.size();
  spdlog::info("agent {}: {} GPU(s) via {}{}, metrics on {}:{}", config_.node, devices_.size(),
               probe_->Backend(), slices > 0 ? absl::StrCat(", ", slices, " MIG instance(s)") : "",
               config_.listen.host, http_->port());
  threads_.emplace_back([this] { SampleLoop(); });
  threads_.emplace_back([this] { EventLoop(); });
  if (kernel_log_) threads_.emplace_back([this] { KernelLogLoop(); });
  // A watched server is probed once before the first heartbeat: a restarted
  // agent's first word must not be "not ready" for a server that serves on
  // (the controller would take the node out, after a planned restart too).
  // At once: 56 hung MIG servers cost one timeout, not 56.
  const common::TimePoint round = FetchGpuServersReady();
  for (Supervisor* s : Servers()) {
    if (s->state().watched) s->Tick(round);
  }
  threads_.emplace_back([this] { ConnectionLoop(); });
  // A server the agent starts, or one started elsewhere that it only probes
  // (ready_url, metrics_url): either way the loop keeps its state, and the
  // jobs the controller places here. (Only the first ran it once: a watched
  // server was never probed, and its node never joined.)
  threads_.emplace_back([this] { SupervisorLoop(); });
  if (std::string socket = PodResourcesSocket(config_); !socket.empty()) {
    threads_.emplace_back([this, socket] { PodResourcesLoop(socket); });
  }
  return absl::OkStatus();
}

void Agent::Stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
  }
  stop_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  for (Supervisor* s : Servers()) s->Shutdown();
  jobs_.Shutdown();
  remediator_.Shutdown();
  if (http_) http_->Stop();
}

void Agent::Leave(common::Duration wait) {
  if (connected_) {
    const bool server_stops = ServersSupervised() && !fenced_;
    spdlog::info("agent {}: planned stop; telling the controller{}", config_.node,
                 server_stops ? ", and waiting for it to move this node's work" : "");
    leaving_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      urgent_ = true;
    }
    WakeHeartbeat();
    // Its jobs get their stop grace to checkpoint before the agent goes.
    if (!jobs_.Status().empty()) wait += config_.jobs.stop_grace;
    std::unique_lock<std::mutex> lock(stop_mu_);
    if (!stop_cv_.wait_for(lock, wait, [this] { return left_; })) {
      spdlog::warn("agent {}: the controller did not answer the goodbye within {} ms; stopping",
                   config_.node, common::ToMillis(wait));
    }
  }
  Stop();
}

void Agent::MarkLeft() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    left_ = true;
  }
  stop_cv_.notify_all();
}

void Agent::WaitFor(common::Duration d) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_cv_.wait_for(lock, d, [this] { return stopping_.load(); });
}

void Agent::SupervisorLoop() {
  while (!stopping_) {
    const common::TimePoint round = FetchGpuServersReady();
    for (Supervisor* s : Servers()) s->Tick(round);
    jobs_.Tick();
    if (config_.remediation.enabled()) RemediateGpus();
    WaitFor(milliseconds(100));
  }
}

v1::AgentMessage Agent::BuildHello() const {
  v1::AgentMessage m;
  v1::Hello* h = m.mutable_hello();
  h->set_node(config_.node);
  h->set_agent_version(kVersion);
  h->set_gpu_backend(probe_->Backend());
  h->set_heartbeat_interval_ms(config_.heartbeat_ms);
  h->set_last_epoch(epoch_.load());
  h->set_fenced(fenced_.load());
  if (const AgentConfig::Registration& r = config_.registration; !r.address.empty()) {
    v1::Registration* out = h->mutable_registration();
    out->set_address(r.address);
    out->set_grpc_address(r.grpc_address);
    out->set_capacity(r.capacity);
    out->set_cpu_only(r.cpu_only);
    out->mutable_labels()->insert(r.labels.begin(), r.labels.end());
    out->set_join_token(r.join_token);
    for (const GpuServer& g : gpu_servers_) {
      v1::GpuServer* gs = out->add_gpu_servers();
      gs->set_index(g.slot.gpu);
      if (g.slot.slice) gs->set_slice(*g.slot.slice);
      gs->set_profile(g.slot.profile);
      gs->set_address(GpuServerAddress(config_, g.slot));
      gs->set_grpc_address(GpuServerGrpcAddress(config_, g.slot));
      gs->set_capacity(g.slot.capacity);
    }
  }
  for (v1::JobStatus& j : jobs_.Status()) *h->add_jobs() = std::move(j);
  for (const gpu::DeviceInfo& d : devices_) {
    v1::GpuInfo* g = h->add_gpus();
    g->set_index(d.index);
    g->set_uuid(d.uuid);
    g->set_name(d.name);
    g->set_pci_bus_id(d.pci_bus_id);
    g->set_memory_total_bytes(d.memory_total_bytes);
  }
  return m;
}

v1::AgentMessage Agent::BuildHeartbeat() {
  v1::AgentMessage m;
  v1::Heartbeat* hb = m.mutable_heartbeat();
  hb->set_seq(++heartbeat_seq_);
  hb->set_sent_unix_nanos(clock_->UnixNanos());
  hb->set_epoch(epoch_.load());
  hb->set_fenced(fenced_.load());
  ServerState server = supervisor_.state();
  v1::ServerStatus* ss = hb->mutable_server();
  ss->set_running(server.running || !server.supervised);
  ss->set_ready(server.supervised || server.watched ? server.ready : !fenced_.load());
  ss->set_pid(server.pid);
  ss->set_restarts(server.restarts);
  ss->set_last_exit(server.last_exit);
  for (v1::JobStatus& j : jobs_.Status()) *hb->add_jobs() = std::move(j);
  std::lock_guard<std::mutex> lock(mu_);
  hb->set_health(ToProto(health_.state));
  hb->set_health_changed_unix_nanos(health_changed_unix_nanos_);
  for (const gpu::HealthReason& r : health_.reasons) AddReason(r, hb->add_reasons());
  if (!gpu_servers_.empty() || config_.remediation.enabled()) AddGpuHealthLocked(hb);
  // Telemetry rides only on the first heartbeat after a new sample; the
  // heartbeats in between stay small (seq, health, epoch, server state).
  static const std::vector<gpu::GpuSample> kNoGpus;
  static const std::vector<gpu::NicSample> kNoNics;
  bool fresh = sample_seq_ != sent_sample_seq_;
  sent_sample_seq_ = sample_seq_;
  for (const gpu::GpuSample& s : fresh ? samples_ : kNoGpus) {
    v1::GpuSample* g = hb->add_gpus();
    g->set_index(s.index);
    g->set_lost(s.lost);
    g->set_temperature_c(s.temperature_c);
    g->set_power_w(s.power_w);
    g->set_power_limit_w(s.power_limit_w);
    g->set_memory_used_bytes(s.memory_used_bytes);
    g->set_memory_total_bytes(s.memory_total_bytes);
    g->set_utilization_pct(s.utilization_pct);
    g->set_throttle_reasons(s.throttle_reasons);
    g->set_ecc_corrected(s.ecc_corrected);
    g->set_ecc_uncorrected(s.ecc_uncorrected);
    g->set_pages_pending(s.pages_pending);
  }
  for (const gpu::NicSample& n : fresh ? nics_ : kNoNics) {
    v1::NicSample* pn = hb->add_nics();
    pn->set_name(n.name);
    pn->set_up(gpu::NicUp(n));
    pn->set_operstate(n.operstate);
    pn->set_rx_errors(n.rx_errors);
    pn->set_tx_errors(n.tx_errors);
  }
  for (const gpu::XidEvent& x : unsent_xids_) {
    v1::XidEvent* px = hb->add_xids();
    px->set_gpu_index(x.gpu_index);
    px->set_xid(x.xid);
    px->set_unix_nanos(x.unix_nanos);
  }
  unsent_xids_.clear();
  return m;
}

void Agent::Handle(const v1::ControllerMessage& m) {
  auto stale = [&](uint64_t epoch, const char* what) {
    if (epoch >= epoch_.load()) {
      epoch_ = epoch;
      return false;
    }
    counters_.stale_commands++;
    spdlog::warn("agent {}: ignoring {} from epoch {}; this agent is at epoch {}", config_.node,
                 what, epoch, epoch_.load());
    return true;
  };
  switch (m.msg_case()) {
    case v1::ControllerMessage::kWelcome:
      if (stale(m.welcome().epoch(), "welcome")) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        role_ = m.welcome().role();
      }
      if (m.welcome().fenced() && !fenced_.exchange(true)) {
        counters_.fences++;
        for (Supervisor* s : Servers()) s->Fence();
      }
      if (m.welcome().fenced()) jobs_.StopAll();
      if (m.welcome().has_datagrams()) {
        if (absl::Status s = beats_.Open(stream_peer_, m.welcome().datagrams()); !s.ok()) {
          spdlog::warn("agent {}: heartbeats stay on the stream: {}", config_.node, s.message());
        }
      }
      break;
    case v1::ControllerMessage::kDatagramsHeard:
      beats_.Heard(m.datagrams_heard().session());
      return;  // nothing to tell the controller
    case v1::ControllerMessage::kFence:
      if (stale(m.fence().epoch(), "fence")) return;
      spdlog::warn("agent {}: fenced at epoch {}: {}", config_.node, m.fence().epoch(),
                   m.fence().reason());
      if (!fenced_.exchange(true)) counters_.fences++;
      for (Supervisor* s : Servers()) s->Fence();
      jobs_.StopAll();  // each checkpoints on SIGTERM; SIGKILL after jobs.stop_grace_ms
      if (leaving_) {
        // The work moved; the server may stop. Jobs first end, and a last
        // heartbeat says so: the controller's confirmation of this fence
        // for them (ConnectionLoop).
        if (jobs_.Status().empty()) {
          MarkLeft();
        } else {
          jobs_beat_on_leave_ = true;
        }
      }
      break;
    case v1::ControllerMessage::kRejoin:
      if (stale(m.rejoin().epoch(), "rejoin")) return;
      spdlog::info("agent {}: rejoining as {} at epoch {}", config_.node, m.rejoin().role(),
                   m.rejoin().epoch());
      {
        std::lock_guard<std::mutex> eval_lock(eval_mu_);
        evaluator_.Reset();
      }
      remediator_.Reset();
      {
        std::lock_guard<std::mutex> lock(mu_);
        role_ = m.rejoin().role();
      }
      fenced_ = false;
      for (Supervisor* s : Servers()) s->Unfence();
      break;
    case v1::ControllerMessage::kStartJob:
      if (stale(m.start_job().epoch(), "start_job")) return;
      if (fenced_) {
        // The controller places jobs on serving nodes only; a start that
        // crossed a fence must not run here.
        spdlog::warn("agent {}: not starting job {}: this node is fenced", config_.node,
                     m.start_job().job());
        return;
      }
      spdlog::info("agent {}: starting job {} at placement {}", config_.node, m.start_job().job(),
                   m.start_job().job_epoch());
      jobs_.Start(m.start_job());
      break;
    case v1::ControllerMessage::kStopJob:
      if (stale(m.stop_job().epoch(), "stop_job")) return;
      spdlog::info("agent {}: stopping job {}", config_.node, m.stop_job().job());
      jobs_.Stop(m.stop_job().job());
      break;
    case v1::ControllerMessage::MSG_NOT_SET:
      break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    urgent_ = true;
  }
  WakeHeartbeat();
}

void Agent::WakeHeartbeat() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (wake_cq_ == nullptr || wake_pending_) return;
  wake_pending_ = true;
  wake_alarm_.Set(wake_cq_, gpr_now(GPR_CLOCK_MONOTONIC), Tag(StreamOp::kWake));
}

absl::Status Agent::RunStream(const HostPort& controller, common::Duration connect_timeout) {
  auto creds = common::ClientCredentials(
      {.ca = config_.tls_ca, .cert = config_.tls_cert, .key = config_.tls_key});
  if (!creds.ok()) return creds.status();
  auto channel = common::DialController(controller, *creds, connect_timeout, &stopping_);
  if (!channel.ok()) return channel.status();
  auto stub = v1::AgentService::NewStub(*channel);

  // The stream runs on the async API with a completion queue that only this
  // thread polls. A heartbeat is written inline, its completion is found on the
  // next poll without a thread hand-off, and the controller's frames are read
  // by this thread while it waits for the next beat. (On the callback API every
  // write completion woke another gRPC thread: a third of the agent's CPU.)
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("stopping");
    stream_ctx_ = &ctx;  // from here Stop() cancels the call (or the call to be)
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_cq_ = &cq;
  }
  sent_sample_seq_ = 0;  // a new controller gets full telemetry at once
  beats_.Reset();        // and offers datagrams anew, or not
  v1::AgentMessage out = BuildHello();
  v1::ControllerMessage in;
  bool reading = false;
  bool writing = true;  // the hello, until the call has started and it is written
  bool broken = false;
  bool goodbye_in_flight = false;
  bool goodbye_written = false;
  bool last_beat_in_flight = false;  // leaving: the beat after the jobs ended
  bool writes_done = false;          // half-closed: nothing more may be written
  auto woken = [this] {              // kWake came back: the next WakeHeartbeat() may set the alarm
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_pending_ = false;
  };
  // The call is created and started together; kStart reports the start.
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::AgentMessage, v1::ControllerMessage>> stream =
      stub->PrepareAsyncConnect(&ctx, &cq);
  stream->StartCall(Tag(StreamOp::kStart));
  auto next = clock_->Now();
  while (!broken && !stopping_) {
    void* tag = nullptr;
    bool ok = false;
    common::Duration wait = writing    ? milliseconds(1000)
                            : leaving_ ? milliseconds(100)  // beats no more: waits for the fence
                                       : std::max(common::Duration(0), next - clock_->Now());
    grpc::CompletionQueue::NextStatus st =
        cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + wait);
    if (st == grpc::CompletionQueue::SHUTDOWN) break;
    if (st == grpc::CompletionQueue::GOT_EVENT) {
      switch (OpOf(tag)) {
        case StreamOp::kStart:
          if (!ok) {  // the call never started: the hello will not be written
            writing = false;
            broken = true;
            break;
          }
          stream_peer_ = ctx.peer();
          reading = true;
          stream->Read(&in, Tag(StreamOp::kRead));
          stream->Write(out, Tag(StreamOp::kWrite));
          break;
        case StreamOp::kWrite:
          writing = false;
          if (!ok) {
            broken = true;
          } else if (last_beat_in_flight) {
            last_beat_in_flight = false;
            MarkLeft();
          } else if (goodbye_in_flight) {
            goodbye_in_flight = false;
            goodbye_written = true;
            // Written is not yet heard. A supervised server waits for the
            // controller's fence (sent once it has read the goodbye); else
            // the agent half-closes, and the controller ends the call once
            // it has read the goodbye: the read then fails, the stream ends,
            // and ConnectionLoop lets Leave() go on.
            // (Not while its jobs beat on: the last beat ends the leave.)
            if ((!ServersSupervised() || fenced_) && !jobs_beat_on_leave_) {
              writing = true;
              writes_done = true;
              stream->WritesDone(Tag(StreamOp::kWrite));
            }
          } else if (!connected_.exchange(true)) {
            spdlog::info("agent {}: connected to controller {}", config_.node, controller.str());
            next = clock_->Now() + milliseconds(config_.heartbeat_ms);
          }
          break;
        case StreamOp::kRead:
          reading = false;
          if (!ok) {
            broken = true;
            break;
          }
          Handle(in);
          reading = true;
          stream->Read(&in, Tag(StreamOp::kRead));
          break;
        case StreamOp::kWake:
          woken();
          break;
        case StreamOp::kFinish:
          break;
      }
    }
    if (broken || stopping_) break;
    // One write in flight at a time; a heartbeat that finds the previous one
    // still queued (a stalled connection) waits for it rather than piling up.
    if (writing || !connected_) continue;
    if (leaving_) {  // a goodbye, then no more heartbeats
      if (!goodbye_written) {
        out.Clear();
        out.mutable_goodbye()->set_reason("the agent is stopping (SIGTERM)");
        out.mutable_goodbye()->set_server_stops(ServersSupervised() && !fenced_);
        goodbye_in_flight = true;
        writing = true;
        stream->Write(out, Tag(StreamOp::kWrite));
      } else if (jobs_beat_on_leave_ && !writes_done && clock_->Now() >= next) {
        // Fenced on the way out: beats go on while its jobs stop, the last
        // one once none runs.
        const bool ended = !jobs_.AnyRunning();
        next = clock_->Now() + milliseconds(config_.heartbeat_ms);
        out = BuildHeartbeat();
        writing = true;
        stream->Write(out, Tag(StreamOp::kWrite));
        if (ended) {
          jobs_beat_on_leave_ = false;
          last_beat_in_flight = true;
        }
      }
      continue;
    }
    common::TimePoint now = clock_->Now();
    bool due = now >= next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!urgent_ && !due) continue;
      urgent_ = false;
    }
    if (due) {  // an urgent beat leaves the regular schedule alone
      next += milliseconds(config_.heartbeat_ms);
      if (now > next) next = now + milliseconds(config_.heartbeat_ms);  // fell behind: restart
    }
    if (sim_ != nullptr && sim_->AgentHung()) continue;  // silent, connection kept open
    out = BuildHeartbeat();
    counters_.heartbeats_sent++;
    if (beats_.Send(out.mutable_heartbeat())) {
      counters_.heartbeat_datagrams++;
      continue;
    }
    writing = true;
    stream->Write(out, Tag(StreamOp::kWrite));
  }
  connected_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ctx_ = nullptr;
  }
  // Cancel (a no-op when the controller already ended the call), collect the
  // outstanding read, write and wake-up, then the status.
  ctx.TryCancel();
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_cq_ = nullptr;
    if (wake_pending_) wake_alarm_.Cancel();
  }
  auto drain_until = [&](auto done) {
    void* tag = nullptr;
    bool ok = false;
    while (!done() && cq.Next(&tag, &ok)) {
      switch (OpOf(tag)) {
        case StreamOp::kStart:  // the hello was never written
        case StreamOp::kWrite:
          writing = false;
          break;
        case StreamOp::kRead:
          reading = false;
          break;
        case StreamOp::kWake:
          woken();
          break;
        case StreamOp::kFinish:
          return;
      }
    }
  };
  auto wake_pending = [&] {
    std::lock_guard<std::mutex> lock(wake_mu_);
    return wake_pending_;
  };
  drain_until([&] { return !reading && !writing && !wake_pending(); });
  grpc::Status status;
  stream->Finish(&status, Tag(StreamOp::kFinish));
  drain_until([] { return false; });
  cq.Shutdown();
  drain_until([] { return false; });
  if (stopping_) return absl::CancelledError("stopping");
  return absl::UnavailableError(status.ok()
                                    ? "closed the stream"
                                    : absl::StrCat("stream broke: ", status.error_message().empty()
                                                                         ? "connection lost"
                                                                         : status.error_message()));
}

void Agent::ConnectionLoop() {
  common::ReconnectPolicy policy(config_.controllers, std::hash<std::string>()(config_.node));
  while (!stopping_) {
    const HostPort c = policy.target();
    common::TimePoint started = clock_->Now();
    absl::Status s = RunStream(c, policy.ConnectTimeout());
    if (stopping_) break;
    if (leaving_) {  // no controller to wait for
      MarkLeft();
      break;
    }
    common::Duration wait = policy.Failed(started, clock_->Now(), absl::IsDeadlineExceeded(s));
    counters_.reconnects++;
    spdlog::warn("agent {}: controller {} {}; retrying with {} in {} ms", config_.node, c.str(),
                 s.message(), policy.target().str(), common::ToMillis(wait));
    WaitFor(wait);
  }
}

}  // namespace gpuha::agent
