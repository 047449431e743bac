// gRPC over HTTP/2 as the router needs it (grpc/doc/PROTOCOL-HTTP2.md):
// status codes, the grpc-timeout header, and grpc-message's percent
// encoding. Pure functions; the fuzz target runs them.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "router/request.h"

namespace gpuha::router {

enum class GrpcCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kUnauthenticated = 16,
};

// The status a router-made answer carries over gRPC: what a client or
// another proxy may retry is UNAVAILABLE (Envoy's retry_on: unavailable);
// another tenant's stream is NOT_FOUND, a bad key UNAUTHENTICATED, and
// limits RESOURCE_EXHAUSTED.
GrpcCode ReasonGrpcCode(Reason r);

// grpc-timeout: 1-8 ASCII digits and a unit (H, M, S, m, u, n). Errors name
// the value. Values round up to whole milliseconds, so a timeout of a few
// microseconds is still a deadline.
absl::StatusOr<std::chrono::milliseconds> ParseGrpcTimeout(std::string_view v);
// The shortest exact-or-larger form in milliseconds or seconds: "250m", "3S".
std::string FormatGrpcTimeout(std::chrono::milliseconds d);

// grpc-message: bytes outside 0x20-0x7E, and '%', as %XX.
std::string PercentEncodeGrpcMessage(std::string_view s);

// Whether one length-prefixed message of a ModelStreamInfer answer (its
// 5-byte prefix included) is an error answer: a ModelStreamInferResponse
// whose error_message (field 1) is set, as Triton answers a request of a
// stream that failed while the stream goes on. A compressed or malformed
// message is not judged (false): it is relayed as it is.
bool StreamAnswerIsError(std::string_view message);

}  // namespace gpuha::router
