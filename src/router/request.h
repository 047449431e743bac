// The router's request-path helpers: pure functions over a parsed HTTP head,
// shared by the proxy and its libFuzzer target (fuzz/router_request_fuzz.cc).
// No I/O, no global state; only the standard library and Beast's header types.
#pragma once

#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <memory_resource>
#include <optional>
#include <string>
#include <string_view>

namespace gpuha::router {

namespace http = boost::beast::http;

// Header fields are allocated from a memory resource. The proxy gives each
// request an arena on its connection (one pointer bump per field, nothing to
// free) instead of a malloc and free per field; elsewhere it is the heap.
using Fields = http::basic_fields<std::pmr::polymorphic_allocator<char>>;
using RequestHeader = http::request_header<Fields>;
using ResponseHeader = http::response_header<Fields>;
template <class Body>
using RequestParser = http::parser<true, Body, std::pmr::polymorphic_allocator<char>>;
template <class Body>
using ResponseParser = http::parser<false, Body, std::pmr::polymorphic_allocator<char>>;

// Why the router itself answered instead of an upstream. Each has a status
// and a label for /metrics.
enum class Reason {
  kBadRequest,          // 400: malformed HTTP
  kHeaderTooLarge,      // 431
  kTooManyHeaders,      // 431
  kBodyTooLarge,        // 413
  kBadStream,           // 400: stream id not [A-Za-z0-9._:-]{1,128}
  kUnauthorized,        // 401: missing or unknown API key
  kUnknownStream,       // 404: no such stream for this tenant (or another tenant's)
  kNoCapacity,          // 503: the stream fits nowhere / tenant has no active node
  kRateLimited,         // 429 with Retry-After
  kOverQuota,           // 429: concurrent requests quota
  kUpstreamFailed,      // 502: every upstream tried refused, reset or hung
  kUpstreamTimeout,     // 504: no response head within response_timeout
  kNotReplayable,       // 502: body streamed past the retry buffer, upstream failed
  kRetryBudget,         // 503: retry budget exhausted
  kNoUpstream,          // 503: every upstream of the stream is down or hung
  kNoStream,            // 400: names no stream, and its tenant has no default_stream
  kNotImplemented,      // 501: a transfer coding other than chunked
  kMethodNotAllowed,    // 405: CONNECT, OPTIONS *
  kUpstreamUnresolved,  // 502: the stream's upstreams are names that do not resolve
  kStreamIdle,          // 408: a gRPC stream owed nothing and silent for idle_timeout
  kDraining,            // 503: a gRPC stream ended at a quiet moment of the router's drain
  kCount,
};
int ReasonStatus(Reason r);
const char* ReasonLabel(Reason r);

// A request head the router refuses before routing. Every one closes the
// connection, since its body's framing cannot be trusted:
// - Transfer-Encoding: only "chunked" is forwarded. A final coding other
//   than chunked is 400 (RFC 9112 6.3: the length cannot be known); an
//   unknown coding, or one the router would have to decode, is 501 (as
//   nginx answers). Transfer-Encoding with Content-Length is 400.
// - CONNECT and "OPTIONS *": 405.
// - HTTP/1.1 without a Host header, or more than one Host: 400.
struct HeadProblem {
  Reason reason;
  std::string detail;
};
std::optional<HeadProblem> CheckHead(const RequestHeader& h);

// How long the client says its request takes: "X-Gpuha-Expect-Ms: 20000"
// (1..3600000). The progress verdict then judges this request by it instead
// of the window it learned (progress.h). Absent: *out is 0. Malformed or
// given twice: a 400 that names the field.
inline constexpr char kExpectHeader[] = "X-Gpuha-Expect-Ms";
std::optional<HeadProblem> ReadExpectation(const RequestHeader& h, std::chrono::milliseconds* out);

// The target in origin form, normalized before any routing decision:
// absolute-form ("http://host/p") loses its scheme and authority;
// %-escapes of unreserved characters are decoded and the rest upper-cased
// (RFC 3986 6.2.2); empty segments ("//") are dropped and dot segments
// removed (5.2.4). nullopt when it cannot be: not origin or absolute form,
// a bad %-escape, or ".." above the root. The query is kept as sent.
std::optional<std::string> NormalizeTarget(std::string_view target);

// The stream a request names: the X-Gpuha-Stream header wins, else a
// /streams/ID/... path, whose prefix is then stripped for the upstream.
struct StreamRef {
  std::string stream;  // empty: the request names no stream
  std::string target;  // what the upstream receives
  bool bad = false;    // a stream was named but is not a valid id
};
StreamRef ExtractStream(std::string_view header_value, std::string_view target);

// The API key: "Authorization: Bearer KEY", else "X-Api-Key: KEY" (an
// Authorization of another scheme, such as Basic for a proxy in front, does
// not hide it); empty if none.
std::string_view ApiKey(const RequestHeader& h);
// The same from the two fields' values (HTTP/2 and gRPC metadata).
std::string_view ApiKeyOf(std::string_view authorization, std::string_view x_api_key);

bool IsHopByHop(std::string_view field_name);

// How a body travels on one side: not at all, with Content-Length, chunked.
enum class Framing { kNone, kLength, kChunked };

// The head the upstream receives: hop-by-hop fields, Expect, Host, the API
// key and any field whose name holds '_' (nginx's default: X_Api_Key and
// X-Api-Key must not reach an upstream as two spellings of one thing) are
// dropped; X-Gpuha-Tenant, X-Gpuha-Stream and X-Forwarded-For added.
void AppendUpstreamHead(const RequestHeader& h, std::string_view target, std::string_view host,
                        std::string_view tenant, std::string_view stream,
                        std::string_view client_ip, Framing framing, uint64_t length,
                        std::string* out);

// Whether an upstream HTTP/1.1 connection may carry another request once an
// answer on it is read: the upstream keeps it alive, the answer was read
// whole, and not a byte past it was read. Bytes past an answer (a second
// response in the same write, a body past its Content-Length, a body
// after a HEAD answer) are no request's: reused, the connection would hand
// them to the next request as its answer, maybe another tenant's, and
// shift every later answer by one. (Bytes that come later are looked for
// before reuse: the loop's TakeIdle.)
inline bool UpstreamReusable(bool keep_alive, bool answer_done, size_t bytes_past_answer) {
  return keep_alive && answer_done && bytes_past_answer == 0;
}

// The head the client receives from an upstream response.
// A kept-alive answer says for how long the router keeps the connection
// idle (Keep-Alive: timeout=S, RFC 2068 19.7.1.1), when keep_alive_s > 0:
// a client that reads it (gpuha load does) closes first, instead of
// writing a request as the router closes.
void AppendClientHead(const ResponseHeader& h, Framing framing, uint64_t length, bool keep_alive,
                      int keep_alive_s, std::string* out);
// Keep-Alive: timeout=S for a connection closed after `idle` (whole
// seconds, less one for the round trip; 0: too short to advertise).
int AdvertisedKeepAlive(std::chrono::milliseconds idle);

// Its JSON body alone (HTTP/2 answers).
std::string ErrorBody(Reason r, std::string_view detail, std::string_view stream);
// A complete router-made answer: JSON {"error","reason","stream"} with the
// reason's status; Retry-After when retry_after_s > 0.
std::string ErrorResponse(Reason r, std::string_view detail, std::string_view stream,
                          int retry_after_s, bool keep_alive);

// Chunked transfer-coding frame headers: "1a2b\r\n".
void AppendChunkHeader(uint64_t size, std::string* out);

}  // namespace gpuha::router
