#include "cli/agent_command.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/agent.h"
#include "agent/agent_config.h"
#include "cli/exit_codes.h"
#include "cli/signals.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "gpu/nvml_probe.h"
#include "gpu/sim_probe.h"

namespace gpuha::cli {

AgentCommand::AgentCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("agent", "Per-node GPU/NIC health, heartbeats, server supervision");
  app_->add_option("--config", config_path_, "Agent config YAML (flags override it)");
  app_->add_option("--node", node_, "This node's name");
  app_->add_option("--controller", controllers_, "HOST:PORT[,HOST:PORT...] of the controllers");
  app_->add_option("--gpu", gpu_, "GPU backend")->check(CLI::IsMember({"nvml", "sim"}));
  app_->add_option("--nvml-lib", nvml_lib_, "Path of libnvidia-ml.so.1 (default: the loader's)");
  app_->add_option("--sim-model", sim_model_, "Simulated GPU model (default L4)");
  app_->add_option("--sim-gpus", sim_gpus_, "Simulated GPUs (default 1)")->check(CLI::Range(1, 64));
  app_->add_option("--sim-mig", sim_mig_, "MIG instances per simulated GPU (default 0, off)")
      ->check(CLI::Range(0, 7));
  app_->add_option("--sim-load", sim_load_, "Simulated load 0..1")->check(CLI::Range(0.0, 1.0));
  app_->add_option("--fault", faults_, "Sim fault, e.g. at_ms=2000,gpu=0,kind=xid,xid=79");
  app_->add_option("--fault-script", fault_script_, "Sim fault script YAML");
  app_->add_option("--listen", listen_,
                   "HOST:PORT for /metrics and /healthz (default 127.0.0.1:7402)");
  app_->add_option("--heartbeat-ms", heartbeat_ms_, "Heartbeat interval")
      ->check(CLI::Range(5, 10000));
  app_->add_option("--sample-ms", sample_ms_, "Sampling interval")->check(CLI::Range(10, 60000));
  app_->add_option("--nic", nics_, "Network interface whose link counts toward health");
  app_->add_option("--server-cmd", server_cmd_, "Inference server command line to supervise");
  app_->add_option("--ready-url", ready_url_, "Readiness URL of the server");
  app_->add_option("--fence-mode", fence_mode_, "On fence: stop the server or mark it unready")
      ->check(CLI::IsMember({"stop", "unready"}));
  app_->add_option("--address", address_,
                   "register: HOST:PORT of this node's inference server, for routers");
  app_->add_option("--capacity", capacity_, "register: this node's stream units (default 10)")
      ->check(CLI::Range(1, 1000000));
  app_->add_option("--gpu-port-base", gpu_port_base_,
                   "a server per GPU: GPU i's listens on this + i ({port} and {gpu} in "
                   "--server-cmd and --ready-url); --capacity is then per GPU")
      ->check(CLI::Range(1, 65000));
  app_->add_option("--label", labels_, "register: KEY=VALUE, e.g. gpuha.io/role=passive");
  app_->add_option("--join-token-file", join_token_file_,
                   "register: file holding the controller's join token");
  app_->add_flag("--check", check_, "Check the config and flags, print them, and exit");
}

int AgentCommand::Run() {
  // Before anything starts a thread (NVML and gRPC do): threads inherit the mask.
  StopSignals stop_signals;
  agent::AgentConfig c;
  auto fail = [](const absl::Status& s) {
    spdlog::error("agent: {}", s.message());
    return kExitBadInput;
  };
  if (!config_path_.empty()) {
    auto loaded = agent::LoadAgentConfig(config_path_);
    if (!loaded.ok()) return fail(loaded.status());
    c = *loaded;
  }
  if (!node_.empty()) c.node = node_;
  if (!controllers_.empty()) {
    c.controllers.clear();
    for (absl::string_view part : absl::StrSplit(controllers_, ',', absl::SkipWhitespace())) {
      auto hp = agent::ParseHostPort(std::string(part), "--controller");
      if (!hp.ok()) return fail(hp.status());
      c.controllers.push_back(*hp);
    }
  }
  if (!gpu_.empty()) c.gpu_backend = gpu_;
  if (!nvml_lib_.empty()) c.nvml_lib = nvml_lib_;
  if (!sim_model_.empty()) c.sim.model = sim_model_;
  if (sim_gpus_ > 0) c.sim.count = static_cast<uint32_t>(sim_gpus_);
  if (sim_mig_ >= 0) c.sim.mig = static_cast<uint32_t>(sim_mig_);
  if (sim_load_ >= 0) c.sim.load = sim_load_;
  if (!fault_script_.empty()) {
    auto faults = gpu::LoadFaultScriptFile(fault_script_);
    if (!faults.ok()) return fail(faults.status());
    c.sim.faults = *faults;
  }
  for (const std::string& spec : faults_) {
    auto f = gpu::ParseFaultSpec(spec);
    if (!f.ok()) return fail(f.status());
    c.sim.faults.push_back(*f);
  }
  if (!listen_.empty()) {
    auto hp = agent::ParseHostPort(listen_, "--listen");
    if (!hp.ok()) return fail(hp.status());
    c.listen = *hp;
  }
  if (heartbeat_ms_ > 0) c.heartbeat_ms = heartbeat_ms_;
  if (sample_ms_ > 0) c.sample_ms = sample_ms_;
  if (!nics_.empty()) c.nics = nics_;
  if (!server_cmd_.empty()) {
    c.server.command = absl::StrSplit(server_cmd_, ' ', absl::SkipWhitespace());
  }
  if (gpu_port_base_ > 0) c.per_gpu.port_base = gpu_port_base_;
  if (!ready_url_.empty()) {
    // Checked as GPU 0's URL when it names {port}.
    if (auto u =
            common::ParseHttpUrl(agent::FillGpuServer(ready_url_, {.port = c.per_gpu.port_base}));
        !u.ok()) {
      return fail(u.status());
    }
    c.server.ready_url = ready_url_;
  }
  if (!fence_mode_.empty()) {
    c.server.fence_mode =
        fence_mode_ == "stop" ? agent::FenceMode::kStop : agent::FenceMode::kUnready;
  }
  agent::AgentConfig::Registration& reg = c.registration;
  if (!address_.empty()) {
    if (auto hp = agent::ParseHostPort(address_, "--address"); !hp.ok()) return fail(hp.status());
    reg.address = address_;
  }
  if (capacity_ > 0) reg.capacity = capacity_;
  for (const std::string& l : labels_) {
    if (absl::Status s = agent::AddLabel(l, &reg.labels); !s.ok()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--label: ", s.message())));
    }
  }
  if (!join_token_file_.empty()) reg.join_token_file = join_token_file_;
  if (absl::Status s = agent::ReadJoinToken(c); !s.ok()) return fail(s);
  if (absl::Status s = agent::ValidateAgentConfig(c); !s.ok()) return fail(s);
  if (c.gpu_backend != "sim" && !c.sim.faults.empty()) {
    return fail(absl::InvalidArgumentError("--fault and fault scripts need --gpu sim"));
  }
  if (c.server.command.empty() && c.server.fence_mode == agent::FenceMode::kStop &&
      (!c.server.ready_url.empty() || !c.server.metrics_url.empty())) {
    spdlog::warn(
        "agent: server.fence_mode stop: the agent cannot stop a server it does not "
        "start (no server.command); a fence marks it unready (fence_mode: unready)");
  }
  if (check_) {
    std::string registers =
        reg.address.empty() ? ""
                            : absl::StrCat(", registers ", reg.address, " capacity ", reg.capacity);
    std::printf("agent config ok: node %s, %zu controller(s), gpu %s, metrics on %s:%u%s\n",
                c.node.c_str(), c.controllers.size(), c.gpu_backend.c_str(), c.listen.host.c_str(),
                c.listen.port, registers.c_str());
    return kExitOk;
  }

  std::unique_ptr<gpu::GpuProbe> probe;
  if (c.gpu_backend == "nvml") {
    auto nvml = gpu::NvmlProbe::Open(c.nvml_lib,
                                     {.slow_every = std::chrono::milliseconds(c.slow_sample_ms)});
    if (!nvml.ok()) {
      spdlog::error("agent: {} (--gpu sim runs the agent on a simulated GPU)",
                    nvml.status().message());
      return kExitFailure;
    }
    probe = std::move(*nvml);
  } else {
    auto sim = gpu::SimProbe::Create(c.sim, common::RealClock::Get());
    if (!sim.ok()) return fail(sim.status());
    probe = std::move(*sim);
  }

  agent::RealProcessRunner runner;
  agent::Agent a(c, std::move(probe), &runner, common::RealClock::Get());
  if (absl::Status s = a.Start(); !s.ok()) {
    spdlog::error("agent: {}", s.message());
    return kExitFailure;
  }
  // The port line is machine-read by tests and the demo.
  std::printf("gpuha agent %s listening on %s:%u\n", c.node.c_str(), c.listen.host.c_str(),
              a.http_port());
  std::fflush(stdout);
  common::SdNotifyOrLog(absl::StrCat("READY=1\nSTATUS=agent ", c.node, " metrics on ",
                                     c.listen.host, ":", a.http_port()));
  int signo = stop_signals.Wait();
  spdlog::info("agent {}: signal {}, stopping", c.node, signo);
  common::SdNotifyOrLog("STOPPING=1");
  // A planned stop: the controller hears it and does not take the node's
  // silence for a failure (a DaemonSet or package upgrade).
  a.Leave(std::chrono::seconds(3));
  return kExitOk;
}

}  // namespace gpuha::cli
