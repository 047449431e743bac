#include "agent/pod_resources.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpuha::agent {

GpuOwners GpuOwnersFromList(const ::v1::ListPodResourcesResponse& list,
                            const std::vector<gpu::DeviceInfo>& devices) {
  std::map<std::string, uint32_t> by_uuid;
  for (const gpu::DeviceInfo& d : devices) by_uuid[d.uuid] = d.index;
  auto gpu_of = [&](const std::string& id) -> std::optional<uint32_t> {
    std::string uuid = id.substr(0, id.find("::"));  // a time-sliced replica: "UUID::3"
    if (auto it = by_uuid.find(uuid); it != by_uuid.end()) return it->second;
    uint32_t index = 0;
    if (absl::SimpleAtoi(id, &index)) {
      for (const gpu::DeviceInfo& d : devices) {
        if (d.index == index) return index;
      }
    }
    return std::nullopt;
  };
  GpuOwners owners;
  for (const ::v1::PodResources& pod : list.pod_resources()) {
    for (const ::v1::ContainerResources& c : pod.containers()) {
      for (const ::v1::ContainerDevices& dev : c.devices()) {
        if (!absl::StartsWith(dev.resource_name(), "nvidia.com/")) continue;
        for (const std::string& id : dev.device_ids()) {
          std::optional<uint32_t> gpu = gpu_of(id);
          if (!gpu) continue;
          PodRef ref{pod.name(), pod.namespace_(), c.name()};
          std::vector<PodRef>& held = owners[*gpu];
          // Two replicas of one GPU in one container are one holder.
          if (std::find(held.begin(), held.end(), ref) == held.end()) held.push_back(ref);
        }
      }
    }
  }
  return owners;
}

PodResourcesClient::PodResourcesClient(const std::string& socket_path)
    : socket_path_(socket_path),
      // The kubelet serves this socket without TLS; the file's mode guards it.
      channel_(grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials())),
      stub_(::v1::PodResourcesLister::NewStub(channel_)) {}

absl::StatusOr<::v1::ListPodResourcesResponse> PodResourcesClient::List(common::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  ::v1::ListPodResourcesRequest request;
  ::v1::ListPodResourcesResponse response;
  grpc::Status s = stub_->List(&ctx, request, &response);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("kubelet pod-resources List on ", socket_path_, ": ",
                                               s.error_message(), " (gRPC code ",
                                               static_cast<int>(s.error_code()), ")"));
  }
  return response;
}

}  // namespace gpuha::agent
