// The ports gpuha listens on when nothing says otherwise. Each is fixed, so
// that Prometheus, firewalls and Kubernetes Services can be pointed at it
// (docs/configuration.md lists them). Tests that run many processes at once
// ask for port 0 explicitly.
#pragma once

#include <cstdint>

namespace gpuha::common {

inline constexpr uint16_t kControllerGrpcPort = 7400;  // agents and routers
inline constexpr uint16_t kControllerHttpPort = 7401;  // API, dashboard, /metrics
inline constexpr uint16_t kAgentPort = 7402;           // /metrics, /healthz
inline constexpr uint16_t kRouterPort = 8080;          // clients
inline constexpr uint16_t kRouterAdminPort = 8081;     // /metrics, /healthz, /routes

}  // namespace gpuha::common
