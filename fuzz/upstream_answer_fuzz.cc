// libFuzzer target for the upstream's side of the router: arbitrary bytes an
// upstream writes on one kept-alive connection, read as the router reads an
// answer (Beast's parser with the router's fields, in reads of arbitrary
// sizes, HEAD or not), then the router's rule for giving the connection to
// the next request (UpstreamReusable). The invariant: a connection given to
// another request holds no byte the upstream wrote for this one, so no byte
// of one answer can reach another request (the adversarial finding: an
// answer followed by extra bytes shifted every later answer onto the next
// tenant's request). Built and run by scripts/fuzz-router.sh.
//
// Input: byte 0 bit 0: the request was a HEAD; byte 1: the sizes of the
// reads (each 1 + the next byte of a 16-byte cycle, mod 64); the rest: what
// the upstream wrote.
// Built as the router is built (RelWithDebInfo: NDEBUG). Boost 1.74's Beast
// asserts `n >= 5` in basic_parser::parse_chunk_header on a malformed final
// chunk fed to it in pieces (found by this target), an input it then
// handles: with NDEBUG, under ASan and UBSan, no memory error. Its debug
// assertion would stop the run there, not find what the router meets.
#ifndef NDEBUG
#define NDEBUG
#endif
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <string>

#include "router/request.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 18) return 0;
  const bool head = data[0] & 1;
  const uint8_t* sizes = data + 1;  // 16 read sizes
  const char* wire = reinterpret_cast<const char*>(data + 17);
  const size_t wire_size = size - 17;

  alignas(std::max_align_t) char arena_buf[512];
  std::pmr::monotonic_buffer_resource arena(arena_buf, sizeof arena_buf);
  auto fields = std::make_tuple(gpuha::router::Fields::allocator_type(&arena));
  gpuha::router::ResponseParser<http::string_body> p(std::piecewise_construct, std::make_tuple(),
                                                     fields);
  p.header_limit(16 * 1024);
  p.body_limit(1 << 20);
  p.eager(false);  // as the router: one step at a time
  if (head) p.skip(true);

  // Reads into a buffer, the parser fed from it, as the router's ReadSome:
  // what the parser does not take stays buffered.
  std::string buffered;
  size_t read = 0;  // of wire: handed to the router so far
  boost::system::error_code ec;
  for (size_t i = 0; !p.is_done() && !ec; ++i) {
    if (read < wire_size) {
      const size_t n = std::min<size_t>(1 + sizes[i % 16] % 64, wire_size - read);
      buffered.append(wire + read, n);
      read += n;
    } else if (buffered.empty()) {
      break;  // the upstream wrote no more
    }
    size_t used = p.put(boost::asio::buffer(buffered), ec);
    if (ec == http::error::need_more) {
      ec = {};
      if (read == wire_size && used == 0) break;  // nothing more will come
    }
    if (used > buffered.size()) __builtin_trap();  // took bytes it was not given
    buffered.erase(0, used);
  }
  if (ec || !p.is_done()) return 0;  // a broken answer: the connection is closed

  // Bytes past the answer: those the router read, and those the upstream
  // wrote after (they wait on the socket; TakeIdle looks before reuse).
  const size_t past = buffered.size() + (wire_size - read);
  if (gpuha::router::UpstreamReusable(p.keep_alive(), p.is_done(), buffered.size()) &&
      wire_size - read == 0) {
    // Given to the next request: it must hold nothing of this one.
    if (past != 0) __builtin_trap();
  }
  if (past > 0 && gpuha::router::UpstreamReusable(p.keep_alive(), true, past)) __builtin_trap();
  return 0;
}
