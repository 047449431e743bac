// The agent's side of its controller: the heartbeat stream (hello,
// heartbeats, goodbye; heartbeat datagrams beside it), the commands it
// obeys, and reconnecting over the controller list. Split from agent.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/grpc_client.h"
#include "common/log.h"
#include "common/reconnect.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;

// What a tag on the heartbeat stream's completion queue stands for.
enum class StreamOp : intptr_t { kStart = 1, kRead, kWrite, kWake, kFinish };
void* Tag(StreamOp op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }
StreamOp OpOf(void* tag) { return static_cast<StreamOp>(reinterpret_cast<intptr_t>(tag)); }

}  // namespace

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
    case v1::ControllerMessage::kDatagramsLost:
      if (beats_.Lost(m.datagrams_lost().session())) {
        counters_.datagram_fallbacks++;
        spdlog::warn("agent {}: heartbeats back on the stream: {}", config_.node,
                     m.datagrams_lost().reason());
      }
      return;
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
