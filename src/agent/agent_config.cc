#include "agent/agent_config.h"

#include <algorithm>
#include <filesystem>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "agent/pod_resources.h"
#include "common/config_fields.h"
#include "common/file_util.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/names.h"
#include "common/yaml_reader.h"
#include "gpu/gpu_models.h"

namespace gpuha::agent {

absl::StatusOr<AgentConfig> ParseAgentConfig(absl::string_view yaml, const std::string& source) {
  auto doc = common::YamlDocument::LoadString(yaml, source);
  if (!doc.ok()) return doc.status();
  common::YamlMap root = doc->Root();
  AgentConfig c;
  if (auto v = root.String("node")) c.node = *v;
  if (auto list = root.StringList("controllers")) {
    for (size_t i = 0; i < list->size(); ++i) {
      auto hp = ParseHostPort((*list)[i], absl::StrCat("controllers[", i, "]"));
      if (!hp.ok()) {
        root.Fail("controllers", hp.status().message());
        break;
      }
      c.controllers.push_back(*hp);
    }
  }
  common::YamlMap gpu = root.Map("gpu");
  if (auto v = gpu.Enum("backend", {"nvml", "sim"})) c.gpu_backend = *v;
  if (auto v = gpu.String("nvml_lib")) c.nvml_lib = *v;
  common::YamlMap sim = gpu.Map("sim");
  if (auto v = sim.String("model")) {
    if (gpu::FindGpuModel(*v) == nullptr)
      sim.Fail("model", absl::StrCat("unknown GPU model '", *v, "'"));
    c.sim.model = *v;
  }
  if (auto v = sim.Int("count")) {
    if (*v < 1 || *v > 64) sim.Fail("count", "must be between 1 and 64");
    c.sim.count = static_cast<uint32_t>(*v);
  }
  if (auto v = sim.Int("mig")) {
    if (*v < 0 || *v > 7) sim.Fail("mig", "must be between 0 (off) and 7 instances per GPU");
    c.sim.mig = static_cast<uint32_t>(*v);
  }
  if (auto v = sim.Number("load")) {
    if (*v < 0 || *v > 1) sim.Fail("load", "must be between 0 and 1");
    c.sim.load = *v;
  }
  if (auto v = sim.Int("seed")) c.sim.seed = static_cast<uint64_t>(*v);
  if (auto v = sim.Bool("cost_model")) c.sim.cost_model = *v;
  if (auto v = gpu.String("fault_script")) {
    std::filesystem::path p(*v);
    if (p.is_relative()) p = std::filesystem::path(source).parent_path() / p;
    auto faults = gpu::LoadFaultScriptFile(p.string());
    if (!faults.ok()) {
      gpu.Fail("fault_script", faults.status().message());
    } else {
      c.sim.faults = *faults;
    }
  }
  std::chrono::milliseconds deadline(c.call_deadline_ms);
  common::ReadMillis(gpu, "call_deadline_ms", &deadline, {.min = 50, .max = 60000});
  c.call_deadline_ms = static_cast<int>(deadline.count());
  std::chrono::milliseconds slow(c.slow_sample_ms);
  common::ReadMillis(gpu, "slow_sample_ms", &slow, {.min = 0, .max = 3600000});
  c.slow_sample_ms = static_cast<int>(slow.count());
  c.sim.slow_every = slow;
  for (auto [key, out] :
       {std::pair{"kernel_log", &c.kernel_log}, std::pair{"pci_devices", &c.pci_devices}}) {
    if (auto v = gpu.String(key)) *out = *v;  // the reader refuses an empty one
  }
  common::YamlMap intervals = root.Map("intervals");
  std::chrono::milliseconds sample(c.sample_ms), heartbeat(c.heartbeat_ms);
  common::ReadMillis(intervals, "sample_ms", &sample, {.min = 10, .max = 60000});
  common::ReadMillis(intervals, "heartbeat_ms", &heartbeat, {.min = 5, .max = 10000});
  c.sample_ms = static_cast<int>(sample.count());
  c.heartbeat_ms = static_cast<int>(heartbeat.count());
  if (auto v = root.StringList("nics")) c.nics = *v;
  if (auto v = root.String("sysfs_net")) c.sysfs_net = *v;
  if (auto v = root.String("sysfs_module")) c.sysfs_module = *v;
  gpu::ReadHealthThresholds(root.Map("thresholds"), &c.thresholds);
  common::YamlMap server = root.Map("server");
  common::YamlMap per_gpu = server.Map("per_gpu");
  common::ReadIntIn(per_gpu, "port_base", 1, 65000, &c.per_gpu.port_base);
  common::ReadIntIn(per_gpu, "grpc_port_base", 1, 65000, &c.per_gpu.grpc_port_base);
  common::ReadIntIn(per_gpu, "metrics_port_base", 1, 65000, &c.per_gpu.metrics_port_base);
  common::ReadIntIn(per_gpu, "capacity", 1, 1'000'000, &c.per_gpu.capacity);
  common::ReadIntIn(per_gpu, "slice_capacity", 1, 1'000'000, &c.per_gpu.slice_capacity);
  // A URL under per_gpu names its port as {port}: checked as GPU 0's.
  auto url_of = [&](const std::string& v) {
    return c.per_gpu.port_base > 0
               ? FillGpuServer(v, ServerSlot{.port = c.per_gpu.port_base,
                                             .grpc_port = c.per_gpu.grpc_port_base,
                                             .metrics_port = c.per_gpu.metrics_port_base})
               : v;
  };
  if (auto v = server.StringList("command")) {
    if (v->empty()) server.Fail("command", "must name a program");
    c.server.command = *v;
  }
  if (auto v = server.String("ready_url")) {
    if (auto url = common::ParseHttpUrl(url_of(*v)); !url.ok())
      server.Fail("ready_url", url.status().message());
    c.server.ready_url = *v;
  }
  if (auto v = server.String("metrics_url")) {
    if (auto url = common::ParseHttpUrl(url_of(*v)); !url.ok())
      server.Fail("metrics_url", url.status().message());
    c.server.metrics_url = *v;
  }
  common::ReadMillis(server, "stall_after_ms", &c.server.stall_after, {.min = 100, .max = 600000});
  if (auto v = server.Enum("fence_mode", {"stop", "unready"})) {
    c.server.fence_mode = *v == "stop" ? FenceMode::kStop : FenceMode::kUnready;
  }
  common::ReadMillis(server, "probe_interval_ms", &c.server.probe_interval,
                     {.min = 10, .max = 60000});
  common::ReadMillis(server, "probe_timeout_ms", &c.server.probe_timeout,
                     {.min = 10, .max = 60000});
  if (auto v = root.String("listen")) {
    auto hp = ParseHostPort(*v, "listen");
    if (!hp.ok())
      root.Fail("listen", hp.status().message());
    else
      c.listen = *hp;
  }
  common::YamlMap jobs = root.Map("jobs");
  if (auto v = jobs.String("progress_dir")) c.jobs.progress_dir = *v;
  common::ReadMillis(jobs, "stop_grace_ms", &c.jobs.stop_grace, {.min = 100, .max = 3'600'000});
  common::YamlMap rem = root.Map("remediation");
  for (auto [key, out] : {std::pair{"gpu_reset", &c.remediation.gpu_reset},
                          std::pair{"reboot", &c.remediation.reboot}}) {
    if (auto v = rem.StringList(key)) {
      if (v->empty()) rem.Fail(key, "must name a program");
      *out = *v;
    }
  }
  if (auto v = rem.String("rebind_driver")) {
    c.remediation.rebind_driver = *v;
    if (!c.remediation.gpu_reset.empty()) {
      rem.Fail("rebind_driver", "is the reset step of a passthrough host; drop gpu_reset or it");
    }
  }
  if (auto v = rem.String("sysfs_pci")) c.remediation.sysfs_pci = *v;
  common::ReadMillis(rem, "timeout_ms", &c.remediation.timeout, {.min = 100, .max = 3'600'000});
  common::ReadMillis(rem, "window_ms", &c.remediation.window, {.min = 1000, .max = 86'400'000});
  if (auto v = rem.String("reboot_history")) c.remediation.reboot_history = *v;
  common::ReadMillis(rem, "reboot_cooldown_ms", &c.remediation.reboot_cooldown,
                     {.min = 0, .max = 7LL * 86'400'000});
  common::ReadIntIn(rem, "max_reboots", 1, 1000, &c.remediation.max_reboots);
  common::ReadMillis(rem, "reboot_window_ms", &c.remediation.reboot_window,
                     {.min = 1000, .max = 90LL * 86'400'000});
  common::YamlMap metrics = root.Map("metrics");
  if (auto v = metrics.Bool("dcgm_names")) c.dcgm_names = *v;
  if (auto v = metrics.String("pod_resources")) c.pod_resources = *v;  // auto | off | a path
  common::ReadMillis(metrics, "pod_resources_interval_ms", &c.pod_resources_interval,
                     {.min = 100, .max = 600000});
  common::TlsFiles tls = common::ReadTlsFiles(root.Map("tls"));
  c.tls_ca = tls.ca;
  c.tls_cert = tls.cert;
  c.tls_key = tls.key;
  common::YamlMap reg = root.Map("register");
  if (auto v = reg.String("address")) {
    if (!ParseHostPort(*v, "address").ok()) {
      reg.Fail("address", absl::StrCat("'", *v, "' is not HOST:PORT"));
    }
    c.registration.address = *v;
  }
  if (auto v = reg.String("grpc_address")) {
    if (!ParseHostPort(*v, "grpc_address").ok()) {
      reg.Fail("grpc_address", absl::StrCat("'", *v, "' is not HOST:PORT"));
    }
    c.registration.grpc_address = *v;
  }
  common::ReadIntIn(reg, "capacity", 1, 1'000'000, &c.registration.capacity);
  if (auto v = reg.Bool("cpu_only")) c.registration.cpu_only = *v;
  if (auto labels = reg.StringList("labels")) {
    for (const std::string& label : *labels) {
      if (absl::Status s = AddLabel(label, &c.registration.labels); !s.ok()) {
        reg.Fail("labels", s.message());
        break;
      }
    }
  }
  if (auto v = reg.String("join_token_file")) c.registration.join_token_file = *v;
  if (absl::Status s = root.Finish(); !s.ok()) return s;
  return c;
}

absl::Status ReadJoinToken(AgentConfig& c) {
  const std::string& path = c.registration.join_token_file;
  if (path.empty()) return absl::OkStatus();
  auto text = common::ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register.join_token_file: ", text.status().message()));
  }
  c.registration.join_token = std::string(absl::StripAsciiWhitespace(*text));
  if (c.registration.join_token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register.join_token_file: ", path, " is empty"));
  }
  return absl::OkStatus();
}

absl::Status AddLabel(const std::string& flag_value, std::map<std::string, std::string>* labels) {
  // Kubernetes' label syntax: an optional DNS prefix and a name, each of
  // [A-Za-z0-9._-/], and a value of at most 63 characters.
  size_t eq = flag_value.find('=');
  auto ok = [](absl::string_view s, size_t max, bool slash) {
    if (s.size() > max) return false;
    for (char ch : s) {
      if (!absl::ascii_isalnum(ch) && ch != '.' && ch != '_' && ch != '-' && !(slash && ch == '/'))
        return false;
    }
    return true;
  };
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("label '", absl::CHexEscape(flag_value), "' is not KEY=VALUE"));
  }
  std::string key = flag_value.substr(0, eq), value = flag_value.substr(eq + 1);
  if (!ok(key, 253, true)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label key '", absl::CHexEscape(key), "' must be [A-Za-z0-9._/-]"));
  }
  if (!ok(value, 63, false)) {
    return absl::InvalidArgumentError(absl::StrCat("label ", key, ": value '",
                                                   absl::CHexEscape(value),
                                                   "' must be [A-Za-z0-9._-], at most 63"));
  }
  (*labels)[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<AgentConfig> LoadAgentConfig(const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseAgentConfig(*text, path);
}

absl::Status ValidateAgentConfig(const AgentConfig& c) {
  if (c.node.empty()) return absl::InvalidArgumentError("node: a node name is required (--node)");
  if (!common::ValidName(c.node)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node: '", absl::CHexEscape(c.node), "' must be ", common::kNameRule));
  }
  if (c.controllers.empty()) {
    return absl::InvalidArgumentError(
        "controllers: at least one controller is required (--controller)");
  }
  if (c.gpu_backend.empty()) {
    return absl::InvalidArgumentError("gpu: choose a backend, --gpu nvml or --gpu sim");
  }
  // A registration must name the server routers are to reach: the other
  // register settings without an address would be dropped silently.
  const AgentConfig::Registration& reg = c.registration;
  if (c.per_gpu.port_base > 0 && c.server.command.empty() && c.server.ready_url.empty()) {
    return absl::InvalidArgumentError(
        "server.per_gpu: a server per GPU needs server.command (to start each) or "
        "server.ready_url (to watch each), with {port} in it");
  }
  // A port named in the server's command or URLs must have its base, or
  // every server would be given port 0.
  for (auto [name, base, field] :
       {std::tuple{"{port}", c.per_gpu.port_base, "port_base"},
        std::tuple{"{grpc_port}", c.per_gpu.grpc_port_base, "grpc_port_base"},
        std::tuple{"{metrics_port}", c.per_gpu.metrics_port_base, "metrics_port_base"}}) {
    if (base > 0) continue;
    std::vector<std::string> texts = c.server.command;
    texts.push_back(c.server.ready_url);
    texts.push_back(c.server.metrics_url);
    for (const std::string& t : texts) {
      if (absl::StrContains(t, name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("server.per_gpu.", field, ": '", t, "' names ", name, ", which needs it"));
      }
    }
  }
  // A join token alone is a listed node's proof (the controller asks it of
  // every agent once one is set); labels and cpu_only describe a node
  // being registered.
  if (reg.address.empty() && (!reg.labels.empty() || reg.cpu_only)) {
    return absl::InvalidArgumentError(
        "register.address: a registering node must give its inference server's HOST:PORT "
        "(--address)");
  }
  // A certificate that cannot be read must stop the agent here, not surface
  // later as an anonymous TLS handshake failure.
  for (auto [field, path] : {std::pair{"tls.ca", &c.tls_ca}, std::pair{"tls.cert", &c.tls_cert},
                             std::pair{"tls.key", &c.tls_key}}) {
    if (path->empty()) continue;
    if (auto text = common::ReadFile(*path); !text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", text.status().message()));
    }
  }
  return absl::OkStatus();
}

std::string PodResourcesSocket(const AgentConfig& c) {
  if (c.pod_resources == "off") return "";
  if (c.pod_resources != "auto") return c.pod_resources;
  std::error_code ec;
  return std::filesystem::exists(kKubeletPodResourcesSocket, ec) ? kKubeletPodResourcesSocket : "";
}

std::string KernelLogPath(const AgentConfig& c) {
  if (c.kernel_log == "off") return "";
  if (!c.kernel_log.empty()) return c.kernel_log;
  return c.gpu_backend == "nvml" ? "/dev/kmsg" : "";
}

std::string PciDevicesPath(const AgentConfig& c) {
  if (c.pci_devices == "off") return "";
  if (!c.pci_devices.empty()) return c.pci_devices;
  return c.gpu_backend == "nvml" ? "/sys/bus/pci/devices" : "";
}

namespace {

// The ports of `n` servers from each base set must not meet, nor the agent's own.
absl::Status CheckPortRanges(const AgentConfig& c, int n) {
  struct Range {
    const char* field;
    int base;
  };
  const Range ranges[] = {{"port_base", c.per_gpu.port_base},
                          {"grpc_port_base", c.per_gpu.grpc_port_base},
                          {"metrics_port_base", c.per_gpu.metrics_port_base}};
  auto span = [n](int base) { return absl::StrCat(base, "-", base + n - 1); };
  for (size_t i = 0; i < std::size(ranges); ++i) {
    const Range& a = ranges[i];
    if (a.base == 0) continue;
    if (a.base + n - 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("server.per_gpu.", a.field, ": ", n,
                                                     " servers need ports ", span(a.base),
                                                     ", past 65535"));
    }
    const int listen = c.listen.port;
    if (listen >= a.base && listen < a.base + n) {
      return absl::InvalidArgumentError(
          absl::StrCat("server.per_gpu.", a.field, ": the ports of its ", n, " servers (",
                       span(a.base), ") hold the agent's listen port ", listen));
    }
    for (size_t j = i + 1; j < std::size(ranges); ++j) {
      const Range& b = ranges[j];
      if (b.base == 0 || b.base >= a.base + n || a.base >= b.base + n) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("server.per_gpu.", a.field, " and ", b.field, ": this node's ", n,
                       " servers need ports ", span(a.base), " and ", span(b.base),
                       ", which meet; set the bases at least ", n, " apart"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ServerSlot>> ServerSlots(const AgentConfig& c,
                                                    const std::vector<gpu::DeviceInfo>& devices) {
  std::vector<ServerSlot> out;
  if (c.per_gpu.port_base == 0) return out;
  const int64_t gpu_capacity =
      c.per_gpu.capacity > 0 ? c.per_gpu.capacity : c.registration.capacity;
  int port = c.per_gpu.port_base;
  for (const gpu::DeviceInfo& d : devices) {
    if (d.slices.empty()) {
      out.push_back({d.index, std::nullopt, absl::StrCat(d.index), "", port++, 0, gpu_capacity});
      continue;
    }
    const int64_t each =
        c.per_gpu.slice_capacity > 0
            ? c.per_gpu.slice_capacity
            : std::max<int64_t>(1, gpu_capacity / static_cast<int64_t>(d.slices.size()));
    for (const gpu::SliceInfo& sl : d.slices) {
      // Without its UUID, CUDA_VISIBLE_DEVICES cannot name the instance:
      // the GPU's index would put the server on its first instance.
      if (sl.uuid.empty()) {
        spdlog::error("agent: GPU {} MIG instance {} has no UUID; no server for it", d.index,
                      sl.index);
        continue;
      }
      // NVML names an instance "<GPU name> MIG <profile>".
      const size_t mig = sl.name.rfind(" MIG ");
      out.push_back({d.index, sl.index, sl.uuid,
                     mig == std::string::npos ? "" : sl.name.substr(mig + 5), port++, 0, each});
    }
  }
  for (ServerSlot& s : out) {
    const int place = s.port - c.per_gpu.port_base;
    if (c.per_gpu.grpc_port_base > 0) s.grpc_port = c.per_gpu.grpc_port_base + place;
    if (c.per_gpu.metrics_port_base > 0) s.metrics_port = c.per_gpu.metrics_port_base + place;
  }
  if (absl::Status s = CheckPortRanges(c, static_cast<int>(out.size())); !s.ok()) return s;
  return out;
}

std::string FillGpuServer(const std::string& text, const ServerSlot& slot) {
  return absl::StrReplaceAll(text, {{"{gpu}", absl::StrCat(slot.gpu)},
                                    {"{slice}", slot.slice ? absl::StrCat(*slot.slice) : ""},
                                    {"{port}", absl::StrCat(slot.port)},
                                    {"{grpc_port}", absl::StrCat(slot.grpc_port)},
                                    {"{metrics_port}", absl::StrCat(slot.metrics_port)}});
}

SupervisorOptions GpuServerOptions(const AgentConfig& c, const ServerSlot& slot) {
  SupervisorOptions o = c.server;
  for (std::string& arg : o.command) arg = FillGpuServer(arg, slot);
  o.ready_url = FillGpuServer(o.ready_url, slot);
  o.metrics_url = FillGpuServer(o.metrics_url, slot);
  if (!o.command.empty()) {
    o.command.insert(o.command.begin(), {"env", absl::StrCat("CUDA_VISIBLE_DEVICES=", slot.visible),
                                         absl::StrCat("NVIDIA_VISIBLE_DEVICES=", slot.visible)});
  }
  return o;
}

std::string GpuServerAddress(const AgentConfig& c, const ServerSlot& slot) {
  HostPort hp{"127.0.0.1", 0};
  if (auto reg = ParseHostPort(c.registration.address, "address"); reg.ok()) hp = *reg;
  hp.port = static_cast<uint16_t>(slot.port);
  return hp.str();
}

std::string GpuServerGrpcAddress(const AgentConfig& c, const ServerSlot& slot) {
  if (slot.grpc_port == 0) return "";
  ServerSlot s = slot;
  s.port = slot.grpc_port;
  return GpuServerAddress(c, s);
}

}  // namespace gpuha::agent
