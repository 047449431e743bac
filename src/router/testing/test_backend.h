// TestBackend: a small HTTP/1.1 upstream for router tests and benchmarks.
// Async (Asio coroutines), keep-alive, one thread per loop.
//
//   GET /v2/health/ready          -> 200 "ready"
//   ANY /...?delay_ms=N&size=N&chunked=1&status=N
//        -> after delay_ms, `status` (200) with a body of `size` bytes (or a
//           short JSON echo: backend name, method, target, body bytes, tenant
//           and stream headers), chunked if asked. With &only=NAME the delay
//           and status apply on the backend of that name alone.
//
// SetHealthDelay(d) makes health answers late, the rest on time (a busy
// server). SetStuck(true) half-hangs it: health answers go on, every other request
// waits unanswered until SetStuck(false) (the inference path of a deadlocked
// engine). The request body is read in full and counted (streamed, never
// stored).
// With tls_cert/tls_key it speaks TLS; with tls_client_ca too it requires a
// client certificate from that CA and puts its CN in the echo ("client_cn").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/listen.h"

namespace gpuha::router::testing {

class TestBackend {
 public:
  struct Options {
    std::string name = "backend";
    std::string address = "127.0.0.1";
    uint16_t port = 0;
    int threads = 1;
    std::string tls_cert = {};  // PEM; empty: plain HTTP
    std::string tls_key = {};
    std::string tls_client_ca = {};  // set: require a client certificate from this CA
  };
  static absl::StatusOr<std::unique_ptr<TestBackend>> Start(Options o);
  ~TestBackend();
  void Stop();
  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Requests served, health probes excluded.
  uint64_t requests() const { return requests_->load(); }
  void SetStuck(bool stuck) { stuck_->store(stuck); }
  // Health answers come this late (an overloaded server's probe waits its
  // turn); other requests are served as before.
  void SetHealthDelay(std::chrono::milliseconds d) { health_delay_ms_->store(d.count()); }

  struct Impl;

 private:
  TestBackend() = default;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<common::LoopServer> server_;  // stopped before impl_ goes
  uint16_t port_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> requests_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<bool>> stuck_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<int64_t>> health_delay_ms_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace gpuha::router::testing
