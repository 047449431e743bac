// libFuzzer target for the router's request path: arbitrary bytes go through
// Beast's parser with the router's limits, then through every helper the
// proxy applies to a parsed head (head checks, target normalization, stream
// extraction, API key, upstream head, client head, error answer). Built and run by
// scripts/fuzz-router.sh.
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <string>

#include "router/request.h"

namespace http = boost::beast::http;
using gpuha::router::Framing;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  boost::system::error_code ec;
  const bool response = data[0] & 1;
  boost::asio::const_buffer in(data + 1, size - 1);
  // Fields in a small arena that spills to the heap, as the proxy has them.
  alignas(std::max_align_t) char arena_buf[512];
  std::pmr::monotonic_buffer_resource arena(arena_buf, sizeof arena_buf);
  auto fields = std::make_tuple(gpuha::router::Fields::allocator_type(&arena));
  if (!response) {
    gpuha::router::RequestParser<http::empty_body> p(std::piecewise_construct, std::make_tuple(),
                                                     fields);
    p.header_limit(16 * 1024);
    p.body_limit(1 << 20);
    p.eager(false);
    p.put(in, ec);
    std::string out;
    if (!ec && p.is_header_done()) {
      const auto& req = p.get();
      auto hv = req["x-gpuha-stream"];
      auto target = req.target();
      // Transfer codings, Host and method checks, then normalization, as
      // the proxy applies them; a normalized target is a fixed point and
      // holds no empty or dot segment.
      (void)gpuha::router::CheckHead(req);
      std::chrono::milliseconds expect{};
      if (!gpuha::router::ReadExpectation(req, &expect) &&
          (expect.count() < 0 || expect.count() > 3600000)) {
        __builtin_trap();  // an accepted expectation is within its range
      }
      std::optional<std::string> normal =
          gpuha::router::NormalizeTarget(std::string_view(target.data(), target.size()));
      if (normal) {
        std::string_view path = std::string_view(*normal).substr(0, normal->find('?'));
        if (path.empty() || path[0] != '/' || path.find("//") != std::string_view::npos ||
            path.find("/./") != std::string_view::npos ||
            path.find("/../") != std::string_view::npos) {
          __builtin_trap();
        }
        if (gpuha::router::NormalizeTarget(*normal) != normal) __builtin_trap();
      }
      gpuha::router::StreamRef ref = gpuha::router::ExtractStream(
          std::string_view(hv.data(), hv.size()), normal.value_or(std::string()));
      std::string_view key = gpuha::router::ApiKey(req);
      gpuha::router::AppendUpstreamHead(
          req, ref.target, "127.0.0.1:1", key, ref.stream, "127.0.0.1",
          p.chunked() ? Framing::kChunked : Framing::kLength, p.content_length().value_or(0), &out);
      if (out.find("\r\n\r\n") + 4 != out.size()) __builtin_trap();  // one head, well ended
    }
    out = gpuha::router::ErrorResponse(gpuha::router::Reason::kBadRequest, ec.message(),
                                       std::string_view(reinterpret_cast<const char*>(data), size),
                                       1, false);
  } else {
    gpuha::router::ResponseParser<http::empty_body> p(std::piecewise_construct, std::make_tuple(),
                                                      fields);
    p.header_limit(16 * 1024);
    p.eager(false);
    p.put(in, ec);
    if (!ec && p.is_header_done()) {
      std::string out;
      gpuha::router::AppendClientHead(p.get(), Framing::kChunked, 0, true, 59, &out);
      if (out.find("\r\n\r\n") + 4 != out.size()) __builtin_trap();
    }
  }
  return 0;
}
