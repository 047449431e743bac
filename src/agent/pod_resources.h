// Which Kubernetes pod and container holds each GPU, read from the kubelet's
// pod-resources API (gRPC on a unix socket, proto/k8s/podresources/v1), so the
// agent's DCGM series carry dcgm-exporter's pod, namespace and container
// labels. The kubelet's socket is the node's: the DaemonSet mounts
// /var/lib/kubelet/pod-resources.
//
//   PodResourcesClient kubelet("/var/lib/kubelet/pod-resources/kubelet.sock");
//   auto list = kubelet.List(std::chrono::seconds(2));
//   if (list.ok()) owners = GpuOwnersFromList(*list, devices);
#pragma once

#include <grpcpp/channel.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "gpu/gpu_probe.h"
#include "k8s/podresources/v1/api.grpc.pb.h"

namespace gpuha::agent {

// The kubelet's socket where the pod-resources API lives.
inline constexpr char kKubeletPodResourcesSocket[] = "/var/lib/kubelet/pod-resources/kubelet.sock";

struct PodRef {
  std::string pod, ns, container;
  bool operator==(const PodRef&) const = default;
};
// GPU index -> the containers holding it: one, or several when the device
// plugin time-slices the GPU.
using GpuOwners = std::map<uint32_t, std::vector<PodRef>>;

// Maps List's answer onto `devices`. Only NVIDIA's resources (nvidia.com/*)
// count. A device id names a GPU by UUID, by a time-sliced replica of it
// ("UUID::N"), or by index (the plugin's DEVICE_ID_STRATEGY=index); other ids
// (MIG devices, which gpuha does not list yet) match no GPU.
GpuOwners GpuOwnersFromList(const ::v1::ListPodResourcesResponse& list,
                            const std::vector<gpu::DeviceInfo>& devices);

class PodResourcesClient {
 public:
  explicit PodResourcesClient(const std::string& socket_path);
  // One List call; the error says the socket and gRPC's reason.
  [[nodiscard]] absl::StatusOr<::v1::ListPodResourcesResponse> List(common::Duration deadline);

 private:
  std::string socket_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub_;
};

}  // namespace gpuha::agent
