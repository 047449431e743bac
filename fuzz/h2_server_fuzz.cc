// libFuzzer target for the router's HTTP/2 frame path: arbitrary client
// bytes (after the connection preface) through H2Server with small limits,
// every completed request answered (a whole response with trailers, or a
// Trailers-Only gRPC error), and grpc-timeout parsed from its headers; a
// path ending in "Stream" takes the streaming path (messages echoed as they
// come).
// Invariants: open streams stay within the concurrent limit, and a request
// handed over is within its header and body limits. Built and run by
// scripts/fuzz-router.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "router/h2_server.h"

using gpuha::router::H2Limits;
using gpuha::router::H2Server;
using gpuha::router::H2Stream;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  H2Limits limits;
  limits.max_concurrent_streams = 8;
  limits.max_header_list_bytes = 2048;
  limits.max_headers = 16;
  limits.max_request_bytes = 4096;
  limits.reset_burst = 16;
  limits.reset_rate = 4;
  H2Server* self = nullptr;
  int n = 0;
  // Streams whose path ends in "Stream" take the streaming path: their
  // whole messages are echoed as they come, and the end of the request
  // ends the answer.
  auto streaming_data = [&](int32_t id) {
    H2Stream* s = self->Find(id);
    if (s == nullptr) return;
    size_t took = 0;
    while (s->body.size() - took >= 5) {
      const auto* p = reinterpret_cast<const unsigned char*>(s->body.data() + took);
      size_t n = 5 + ((size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) | p[4]);
      if (s->body.size() - took < n) break;
      self->SendData(id, std::string_view(s->body).substr(took, n));
      took += n;
    }
    self->Consume(id, took);
    if (s->complete) self->Finish(id, {{"grpc-status", "0"}});
  };
  auto on_headers = [&](H2Stream& s) {
    std::string_view path = s.Header(":path");
    if (path.size() < 6 || path.substr(path.size() - 6) != "Stream") return;
    self->StartStreaming(s.id);
    self->RespondStreaming(s.id, {{":status", "200"}, {"content-type", "application/grpc"}});
    const int32_t id = s.id;
    s.on_data = [&streaming_data, id] { streaming_data(id); };
  };
  H2Server server(
      limits,
      [&](H2Stream& s) {
        if (s.body.size() > limits.max_request_bytes || s.headers.size() > limits.max_headers) {
          __builtin_trap();
        }
        (void)gpuha::router::ParseGrpcTimeout(s.Header("grpc-timeout"));
        if (++n % 2 == 0) {
          self->RespondGrpcError(s.id, gpuha::router::GrpcCode::kUnavailable, s.Header(":path"));
        } else {
          self->Respond(s.id, {{":status", "200"}, {"content-type", "application/grpc"}}, s.body,
                        {{"grpc-status", "0"}});
        }
      },
      on_headers);
  self = &server;
  std::string in(gpuha::router::kH2Preface);
  in.append(reinterpret_cast<const char*>(data), size);
  // In two pieces, as reads split them.
  size_t half = in.size() / 2;
  std::string out;
  if (server.Feed(in.data(), half).ok()) {
    server.Drain(&out);
    (void)server.Feed(in.data() + half, in.size() - half);
  }
  server.Drain(&out);
  if (server.open_streams() > limits.max_concurrent_streams + 1) __builtin_trap();
  return 0;
}
