// RouterConfig: what `gpuha router --config FILE` reads. Every field has a
// production default; see examples/router.yaml for a commented file.
//
//   listen: 127.0.0.1:8443
//   threads: 2                       # one event loop per thread
//   controllers: [127.0.0.1:7400]    # route watch; or static `routes:`
//   tls: {cert: server.pem, key: server.key}
//   upstream_tls: {ca: ca.pem, cert: router.pem, key: router.key}   # mTLS to upstreams
//   auth: api_key                    # or none: no tenants, no keys (says so)
//   tenants:
//     - name: acme
//       default_stream: cam-1        # for requests that name none (else 400)
//       api_keys_sha256: [<hex of sha256(key)>]
//       requests_per_second: 500
//       burst: 1000
//       max_concurrent: 64
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/net_util.h"
#include "common/ports.h"
#include "router/progress.h"

namespace gpuha::router {

struct TenantConfig {
  std::string name;
  std::vector<std::string> key_hashes;  // lower-case hex SHA-256 of each API key
  double requests_per_second = 0;       // 0: unlimited
  double burst = 0;                     // bucket size; 0: one second's worth
  int64_t max_concurrent = 0;           // requests in flight; 0: unlimited
  // Where a request that names no stream goes; empty: such a request is
  // refused (400), never sent to some node of the tenant.
  std::string default_stream{};
};

// A route given in the file instead of by a controller (labs, benchmarks).
struct StaticRoute {
  std::string stream;
  std::string tenant;
  std::string primary;  // HOST:PORT
  std::string standby;  // HOST:PORT or empty
  // Their KServe v2 gRPC ports (HTTP/2), HOST:PORT or empty: a gRPC call
  // for the stream goes there.
  std::string primary_grpc{};
  std::string standby_grpc{};
};

struct RouterLimits {
  size_t max_header_bytes = 16 * 1024;
  size_t max_headers = 100;
  uint64_t max_body_bytes = 64ull << 20;            // 413 beyond this
  size_t retry_buffer_bytes = 1 << 20;              // bodies up to this can be re-sent
  std::chrono::milliseconds header_timeout{10000};  // whole request head
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive between requests
  // A pooled upstream connection idle this long is closed before it is
  // reused: servers close idle keep-alive connections (uvicorn and Node
  // after 5 s, gunicorn after 2 s), and a request written on one as it
  // closes is lost to that race. An upstream's own Keep-Alive: timeout=N
  // lowers it to N less a second for that connection.
  std::chrono::milliseconds upstream_idle_timeout{4000};
  std::chrono::milliseconds body_timeout{30000};  // between body reads/writes
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds response_timeout{60000};  // to the response head
  // HTTP/2 clients: streams open at once per connection (SETTINGS).
  uint32_t h2_max_concurrent_streams = 128;
  // A draining router (SIGTERM) lets what is in flight finish this long at
  // most; Kubernetes' terminationGracePeriodSeconds must be above it.
  std::chrono::milliseconds drain_timeout{25000};
};

// The OpenAI-style completion APIs whose token streams the router can
// continue on a standby (router/sse_relay.h).
enum class LlmApi { kCompletions, kChat };
struct LlmRoute {
  std::string path;  // the upstream path, e.g. /v1/chat/completions
  LlmApi api = LlmApi::kCompletions;
  bool continuation = true;
};
struct LlmConfig {
  bool continuation = true;         // off: no stream is continued, on any route
  size_t max_text_bytes = 1 << 20;  // answer text kept per stream for a continuation
  int max_continuations = 2;        // per answer
  // Ask upstreams for token IDs (return_token_ids) and continue on them.
  bool token_ids = true;
  std::vector<LlmRoute> routes = {{"/v1/completions", LlmApi::kCompletions, true},
                                  {"/v1/chat/completions", LlmApi::kChat, true}};
};

struct RouterConfig {
  common::HostPort listen{"127.0.0.1", common::kRouterPort};
  common::HostPort admin{"127.0.0.1", common::kRouterAdminPort};  // /metrics, /healthz, /routes
  int threads = 0;                                                // 0: one per core
  std::string router_id = "router";
  // A Unix socket where this router gives its listening sockets to the
  // router that replaces it, and where it first asks a running one for
  // theirs (router/handoff.h): restarts refuse no connection. Empty: off.
  std::string handoff_socket;
  std::vector<common::HostPort> controllers;
  std::vector<StaticRoute> routes;
  std::string tls_cert, tls_key;                               // client side, optional
  std::string controller_ca, controller_cert, controller_key;  // mTLS to the controller
  // TLS to the upstreams (inference servers), optional. With upstream_ca set,
  // every upstream connection is TLS 1.2+, and the upstream's certificate
  // must chain to that CA and name upstream_server_name (default: the
  // upstream's IP). upstream_cert/key add the router's client certificate
  // (mTLS). The router's own probes use the same settings.
  std::string upstream_ca, upstream_cert, upstream_key, upstream_server_name;
  // The upstreams' gRPC ports too (HTTP/2 chosen by ALPN); false keeps them
  // plaintext h2c while the HTTP ports use TLS.
  bool upstream_tls_grpc = true;
  // Empty: no auth, one implicit tenant "". A file must say `auth: none` for
  // that; a file with no tenants and no `auth: none` is refused, so that an
  // emptied file (or a reload of one) cannot turn authentication off.
  std::vector<TenantConfig> tenants;
  bool auth_none = false;
  RouterLimits limits;
  // Real-time failover.
  // Retry budget (Finagle's): every request deposits retry_budget_percent/100
  // of a retry, time deposits retry_min_per_second, a retry withdraws one,
  // and the balance is capped at retry_burst. A node failing over all its
  // in-flight requests at once is a burst the balance covers; a dying
  // cluster is held to ~20% extra load.
  double retry_budget_percent = 20;
  double retry_min_per_second = 10;
  double retry_burst = 1000;
  std::chrono::milliseconds ejection_base{1000};
  std::chrono::milliseconds ejection_max{30000};
  // A stream that failed over in the router stays on its standby until the
  // controller's routes for it change, or until this long has passed and its
  // primary is usable again (probed up, not ejected): a primary that only
  // blinked, and that the controller kept, gets its work back.
  std::chrono::milliseconds sticky{10000};
  // The router's own liveness probe of every upstream: a probe with no answer
  // after hang_after marks the upstream hung, which re-sends its waiting
  // requests to their standby. 0 interval turns probing off.
  std::string probe_path = "/v2/health/ready";
  // The probe may be a real inference (failover.probe: method, path,
  // content_type, body, expect_status), e.g. a KServe v2 infer of a 1x1
  // image. An answer of 5xx, or with expect_status set any other status,
  // counts as down; any other answer as up.
  std::string probe_method = "GET";
  std::string probe_content_type;
  std::string probe_body;
  int probe_expect_status = 0;  // 0: any answer below 500
  std::chrono::milliseconds probe_interval{25};
  std::chrono::milliseconds hang_after{100};
  // Upstreams given by DNS name are resolved again this often
  // (dns: { refresh_ms }).
  std::chrono::milliseconds dns_refresh{30000};
  // Judging upstreams by progress (ProgressMonitor): requests waiting and
  // none answered for longer than its requests take (learned; within
  // stall_floor_ms .. stall_ceiling_ms) is a stall, whatever the probe says.
  bool stall_detection = true;
  ProgressOptions progress;
  // Outlier ejection after this many 5xx answers in a row (0: off), and a
  // re-send to the standby of a 500/502/503/504 answer (within the budget).
  int consecutive_5xx = 5;
  bool retry_5xx = true;
  // LLM token streams (SSE): continued on the standby mid-answer.
  LlmConfig llm;
};

[[nodiscard]] absl::StatusOr<RouterConfig> ParseRouterConfig(absl::string_view yaml,
                                                             const std::string& source);
[[nodiscard]] absl::StatusOr<RouterConfig> LoadRouterConfig(const std::string& path);

}  // namespace gpuha::router
