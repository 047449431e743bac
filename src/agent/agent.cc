#include "agent/agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace gpuha::agent {
namespace {

using std::chrono::milliseconds;

JobOptions JobsWithDefaults(const AgentConfig& c) {
  JobOptions o = c.jobs;
  if (o.progress_dir.empty()) o.progress_dir = "/tmp/gpuha-jobs-" + c.node;
  return o;
}

constexpr const char* kVersion = "0.1.0";

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
  absl::StatusOr<std::vector<ServerSlot>> slots = ServerSlots(config_, devices_);
  if (!slots.ok()) return slots.status();
  for (const ServerSlot& slot : *slots) {
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
  // The join token goes with every hello: a listed node proves it too.
  if (!config_.registration.join_token.empty()) {
    h->mutable_registration()->set_join_token(config_.registration.join_token);
  }
  if (const AgentConfig::Registration& r = config_.registration; !r.address.empty()) {
    v1::Registration* out = h->mutable_registration();
    out->set_address(r.address);
    out->set_grpc_address(r.grpc_address);
    out->set_capacity(r.capacity);
    out->set_cpu_only(r.cpu_only);
    out->mutable_labels()->insert(r.labels.begin(), r.labels.end());
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

}  // namespace gpuha::agent
