// HttpServer: a small HTTP/1.1 server on Boost.Beast for the control-plane
// endpoints (/metrics, /healthz, operator APIs). One event-loop thread; the
// handler runs on it, so handlers must be quick and thread-safe against the
// component's other threads.
//
//   auto server = HttpServer::Start({.address = "127.0.0.1", .port = 0},
//       [](const HttpRequest& r) { return HttpResponse{200, "text/plain", "ok\n"}; });
//   uint16_t port = (*server)->port();
//
// Bad requests (oversized headers or body, malformed syntax) get 400/413 and
// the connection closes; nothing reaches the handler. Idle and slow
// connections time out after `read_timeout`.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuha::common {

struct HttpRequest {
  std::string method;                          // "GET"
  std::string target;                          // "/metrics?x=1"
  std::string path;                            // "/metrics"
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string peer;  // "127.0.0.1:53122"
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  struct Options {
    std::string address = "127.0.0.1";
    uint16_t port = 0;  // 0 picks a free port
    size_t max_header_bytes = 16 * 1024;
    size_t max_body_bytes = 1 << 20;
    std::chrono::milliseconds read_timeout{10000};
    // >= 0: serve on this listening socket (taken from another process),
    // which the server now owns, instead of binding address:port.
    int adopt_fd = -1;
  };
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Options options,
                                                                         HttpHandler handler);
  ~HttpServer();
  uint16_t port() const { return port_; }
  // The listening socket (to hand to a successor: router/handoff.h).
  int listen_fd();
  // Stops accepting and closes connections; idempotent.
  void Stop();

 private:
  struct Impl;
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  uint16_t port_ = 0;
};

// A blocking GET/POST for probes and tests. Returns the status and body, or an
// error when the server cannot be reached within `timeout`.
struct HttpResult {
  int status = 0;
  std::string body;
};
[[nodiscard]] absl::StatusOr<HttpResult> HttpCall(const std::string& method,
                                                  const std::string& host, uint16_t port,
                                                  const std::string& target,
                                                  const std::string& body,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& bearer_token = "");

// The same calls over one kept-alive connection to HOST:PORT, for probes
// that ask the same server again and again: no connect, no new event loop
// per call. The connection is opened on first use and again after the
// server closes it or a call fails; a GET that fails on a connection kept
// from before is sent once more on a fresh one (the server may have closed
// it while idle). A call out of time is DeadlineExceeded, and not retried.
//
// Clients made on one Loop can run GETs together (GetAll): one wait for a
// round of answers, where a call at a time waits once per server (a node of
// 56 MIG servers probes 112 times a second).
//
// Thread-safety: none; one caller at a time for all clients of a Loop.
class HttpClient {
 public:
  class Loop {
   public:
    Loop();

   private:
    friend class HttpClient;
    struct Impl;
    std::shared_ptr<Impl> impl_;
  };
  HttpClient(std::string host, uint16_t port, Loop loop = Loop());
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  [[nodiscard]] absl::StatusOr<HttpResult> Call(const std::string& method,
                                                const std::string& target, const std::string& body,
                                                std::chrono::milliseconds timeout,
                                                const std::string& bearer_token = "");
  struct Get {
    HttpClient* client = nullptr;
    std::string target{};
    absl::StatusOr<HttpResult> result = absl::UnknownError("not run");
  };
  // Each GET at once over its client's connection, within `timeout` (and
  // one more `timeout` for those sent again on a fresh connection). Every
  // client must be of one Loop and listed once (else that call fails,
  // InvalidArgument).
  static void GetAll(std::vector<Get>& calls, std::chrono::milliseconds timeout);
  // Connections opened so far (1 while the server keeps it alive).
  int connects() const { return connects_; }

 private:
  struct Impl;
  struct Exchange;
  static void RunAll(const std::vector<Exchange*>& xs, std::chrono::milliseconds timeout);
  void Start(Exchange& x, std::chrono::milliseconds timeout);
  void Finish(Exchange& x);
  const std::string host_;
  const uint16_t port_;
  std::unique_ptr<Impl> impl_;
  int connects_ = 0;
};

// Splits "http://127.0.0.1:8000/v2/health/ready" into host, port and target.
struct HttpUrl {
  std::string host;
  uint16_t port = 80;
  std::string target = "/";
};
[[nodiscard]] absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url);

}  // namespace gpuha::common
