#include "cluster/config_builders.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net_util.h"

namespace gpuha::cluster {

namespace {

std::string QuotedList(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const std::string& s : items) quoted.push_back(Quote(s));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

// ", key: value" for a set optional; nothing otherwise.
template <class T>
std::string Opt(const char* key, const std::optional<T>& v) {
  return v ? absl::StrCat(", ", key, ": ", *v) : std::string();
}

// "{ a: 1, b: 2 }" from ", a: 1, b: 2" (empty when nothing was set).
std::string FlowMap(const std::string& fields) {
  return fields.empty() ? std::string() : absl::StrCat("{ ", fields.substr(2), " }");
}

}  // namespace

std::string Quote(const std::string& text) { return nlohmann::json(text).dump(); }

std::string ControllerYaml::Yaml() const {
  std::string out;
  if (!comment.empty()) absl::StrAppend(&out, "# ", comment, "\n");
  absl::StrAppend(&out, "cluster: { redundancy: ", redundancy, " }\nnodes:\n");
  for (const NodeEntry& n : nodes) {
    absl::StrAppend(&out, "  - { name: ", Quote(n.name), ", role: ", n.role);
    if (n.gpu_servers.empty()) absl::StrAppend(&out, ", capacity: ", n.capacity);
    if (!n.address.empty()) absl::StrAppend(&out, ", address: ", Quote(n.address));
    if (!n.grpc_address.empty()) {
      absl::StrAppend(&out, ", grpc_address: ", Quote(n.grpc_address));
    }
    for (size_t g = 0; g < n.gpu_servers.size(); ++g) {
      const NodeEntry::GpuServer& e = n.gpu_servers[g];
      absl::StrAppend(&out, g == 0 ? ", gpu_servers: [" : ", ", "{ index: ", e.index,
                      e.slice ? absl::StrCat(", slice: ", *e.slice) : "",
                      ", address: ", Quote(e.address),
                      e.grpc_address.empty() ? "" : ", grpc_address: " + Quote(e.grpc_address),
                      ", capacity: ", e.capacity, " }", g + 1 == n.gpu_servers.size() ? "]" : "");
    }
    absl::StrAppend(&out, " }\n");
  }
  absl::StrAppend(&out, "tenants: ", QuotedList(tenants), "\n");
  std::string listen;
  if (!grpc_listen.empty()) absl::StrAppend(&listen, ", grpc: ", Quote(grpc_listen));
  if (!http_listen.empty()) absl::StrAppend(&listen, ", http: ", Quote(http_listen));
  if (!listen.empty()) absl::StrAppend(&out, "listen: ", FlowMap(listen), "\n");
  if (!store_path.empty()) absl::StrAppend(&out, "store: { path: ", Quote(store_path), " }\n");
  if (!etcd.empty()) {
    std::vector<std::string> quoted;
    for (const std::string& e : etcd) quoted.push_back(Quote(e));
    absl::StrAppend(&out, "store: { etcd: [", absl::StrJoin(quoted, ", "), "] }\n");
  }
  std::string recovery = absl::StrCat(Opt("healthy_for_ms", healthy_for_ms),
                                      Opt("max_failures", max_failures), Opt("window_s", window_s));
  if (!recovery.empty()) absl::StrAppend(&out, "recovery: ", FlowMap(recovery), "\n");
  if (startup_grace_ms) absl::StrAppend(&out, "startup_grace_ms: ", *startup_grace_ms, "\n");
  std::string fence = Opt("timeout_ms", fence_timeout_ms);
  if (!fence_hook.empty()) absl::StrAppend(&fence, ", hook: ", Quote(fence_hook));
  if (!fence.empty()) absl::StrAppend(&out, "fence: ", FlowMap(fence), "\n");
  return out;
}

std::string AgentYaml::Yaml() const {
  std::string out = absl::StrCat("node: ", Quote(node), "\ncontrollers: ", QuotedList(controllers),
                                 "\ngpu: { backend: ", gpu_backend);
  if (gpu_backend == "sim") {
    absl::StrAppend(&out, ", sim: { model: ", Quote(sim_model), ", count: ", sim_count,
                    sim_mig > 0 ? absl::StrCat(", mig: ", sim_mig) : "", ", load: ", sim_load,
                    " }");
  }
  absl::StrAppend(&out, Opt("call_deadline_ms", call_deadline_ms));
  if (!pci_devices.empty()) absl::StrAppend(&out, ", pci_devices: ", Quote(pci_devices));
  absl::StrAppend(&out, " }\n");
  std::string intervals = Opt("sample_ms", sample_ms) + Opt("heartbeat_ms", heartbeat_ms);
  if (!intervals.empty()) absl::StrAppend(&out, "intervals: ", FlowMap(intervals), "\n");
  if (!listen.empty()) absl::StrAppend(&out, "listen: ", Quote(listen), "\n");
  if (!server_command.empty() || !ready_url.empty()) {
    std::string server =
        server_command.empty() ? "" : absl::StrCat(", command: ", QuotedList(server_command));
    if (!ready_url.empty()) absl::StrAppend(&server, ", ready_url: ", Quote(ready_url));
    if (!metrics_url.empty()) absl::StrAppend(&server, ", metrics_url: ", Quote(metrics_url));
    absl::StrAppend(&server, Opt("stall_after_ms", stall_after_ms));
    if (!fence_mode.empty()) absl::StrAppend(&server, ", fence_mode: ", fence_mode);
    absl::StrAppend(&server, Opt("probe_interval_ms", probe_interval_ms),
                    Opt("probe_timeout_ms", probe_timeout_ms));
    std::string per_gpu = Opt("port_base", per_gpu_port_base) + Opt("capacity", per_gpu_capacity) +
                          Opt("grpc_port_base", per_gpu_grpc_port_base);
    if (!per_gpu.empty()) absl::StrAppend(&server, ", per_gpu: ", FlowMap(per_gpu));
    absl::StrAppend(&out, "server: ", FlowMap(server), "\n");
  }
  std::string jobs = Opt("stop_grace_ms", job_stop_grace_ms);
  if (!job_progress_dir.empty())
    absl::StrAppend(&jobs, ", progress_dir: ", Quote(job_progress_dir));
  if (!jobs.empty()) absl::StrAppend(&out, "jobs: ", FlowMap(jobs), "\n");
  return out;
}

std::string RouterYaml::Yaml() const {
  std::string out;
  if (!listen.empty()) absl::StrAppend(&out, "listen: ", Quote(listen), "\n");
  if (!admin.empty()) absl::StrAppend(&out, "admin: ", Quote(admin), "\n");
  if (threads) absl::StrAppend(&out, "threads: ", *threads, "\n");
  if (!id.empty()) absl::StrAppend(&out, "id: ", Quote(id), "\n");
  if (!controllers.empty()) absl::StrAppend(&out, "controllers: ", QuotedList(controllers), "\n");
  if (auth_none) absl::StrAppend(&out, "auth: none\n");
  if (!tenants.empty()) absl::StrAppend(&out, "tenants:\n");
  for (const TenantEntry& t : tenants) {
    std::vector<std::string> hashes;
    for (const std::string& k : t.api_keys) hashes.push_back(common::Sha256Hex(k));
    absl::StrAppend(&out, "  - { name: ", Quote(t.name), ", api_keys_sha256: ", QuotedList(hashes),
                    Opt("requests_per_second", t.requests_per_second), Opt("burst", t.burst),
                    Opt("max_concurrent", t.max_concurrent), " }\n");
  }
  if (!routes.empty()) absl::StrAppend(&out, "routes:\n");
  for (const RouteEntry& r : routes) {
    absl::StrAppend(&out, "  - { stream: ", Quote(r.stream), ", primary: ", Quote(r.primary));
    if (!r.tenant.empty()) absl::StrAppend(&out, ", tenant: ", Quote(r.tenant));
    if (!r.standby.empty()) absl::StrAppend(&out, ", standby: ", Quote(r.standby));
    if (!r.primary_grpc.empty()) absl::StrAppend(&out, ", primary_grpc: ", Quote(r.primary_grpc));
    if (!r.standby_grpc.empty()) absl::StrAppend(&out, ", standby_grpc: ", Quote(r.standby_grpc));
    absl::StrAppend(&out, " }\n");
  }
  std::string failover =
      Opt("probe_interval_ms", probe_interval_ms) + Opt("hang_after_ms", hang_after_ms);
  if (!failover.empty()) absl::StrAppend(&out, "failover: ", FlowMap(failover), "\n");
  return out;
}

}  // namespace gpuha::cluster
