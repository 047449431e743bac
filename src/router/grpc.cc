#include "router/grpc.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace gpuha::router {

GrpcCode ReasonGrpcCode(Reason r) {
  switch (r) {
    case Reason::kBadRequest:
    case Reason::kBadStream:
    case Reason::kNoStream:
      return GrpcCode::kInvalidArgument;
    case Reason::kHeaderTooLarge:
    case Reason::kTooManyHeaders:
    case Reason::kBodyTooLarge:
    case Reason::kRateLimited:
    case Reason::kOverQuota:
      return GrpcCode::kResourceExhausted;
    case Reason::kUnauthorized:
      return GrpcCode::kUnauthenticated;
    case Reason::kUnknownStream:
      return GrpcCode::kNotFound;
    case Reason::kStreamIdle:
      return GrpcCode::kDeadlineExceeded;
    case Reason::kNotImplemented:
    case Reason::kMethodNotAllowed:
      return GrpcCode::kUnimplemented;
    case Reason::kNoCapacity:
    case Reason::kUpstreamFailed:
    case Reason::kUpstreamTimeout:
    case Reason::kNotReplayable:
    case Reason::kRetryBudget:
    case Reason::kNoUpstream:
    case Reason::kUpstreamUnresolved:
    case Reason::kDraining:
    case Reason::kCount:
      break;
  }
  return GrpcCode::kUnavailable;
}

absl::StatusOr<std::chrono::milliseconds> ParseGrpcTimeout(std::string_view v) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc-timeout: '", std::string(v), "' ", std::string(why)));
  };
  if (v.size() < 2 || v.size() > 9) return bad("is not 1-8 digits and a unit (H M S m u n)");
  uint64_t n = 0;
  for (char c : v.substr(0, v.size() - 1)) {
    if (c < '0' || c > '9') return bad("is not 1-8 digits and a unit (H M S m u n)");
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  // Whole milliseconds, rounded up; at most 10^8 hours, which fits.
  uint64_t ms = 0;
  switch (v.back()) {
    case 'H':
      ms = n * 3600000;
      break;
    case 'M':
      ms = n * 60000;
      break;
    case 'S':
      ms = n * 1000;
      break;
    case 'm':
      ms = n;
      break;
    case 'u':
      ms = (n + 999) / 1000;
      break;
    case 'n':
      ms = (n + 999999) / 1000000;
      break;
    default:
      return bad("has no unit (H M S m u n)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

std::string FormatGrpcTimeout(std::chrono::milliseconds d) {
  int64_t ms = std::max<int64_t>(d.count(), 0);
  if (ms < 100000000) return absl::StrCat(ms, "m");
  return absl::StrCat(std::min<int64_t>((ms + 999) / 1000, 99999999), "S");
}

std::string PercentEncodeGrpcMessage(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {

// A protobuf varint at `*at`; false when it runs past the end or 10 bytes.
bool ReadVarint(std::string_view b, size_t* at, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 70 && *at < b.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(b[(*at)++]);
    *v |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80u) == 0) return true;
  }
  return false;
}

}  // namespace

bool StreamAnswerIsError(std::string_view message) {
  if (message.size() < 5 || message[0] != 0) return false;  // compressed: not judged
  std::string_view b = message.substr(5);
  size_t at = 0;
  while (at < b.size()) {
    uint64_t key = 0, len = 0;
    if (!ReadVarint(b, &at, &key)) return false;
    switch (key & 7) {
      case 0:  // varint
        if (!ReadVarint(b, &at, &len)) return false;
        break;
      case 1:  // fixed64
        at += 8;
        break;
      case 5:  // fixed32
        at += 4;
        break;
      case 2:  // length-delimited
        if (!ReadVarint(b, &at, &len) || len > b.size() - std::min(at, b.size())) return false;
        if ((key >> 3) == 1) return len > 0;  // error_message
        at += len;
        break;
      default:  // groups, or not protobuf
        return false;
    }
  }
  return false;
}

}  // namespace gpuha::router
